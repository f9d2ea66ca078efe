"""``rosterd models`` on a fleet that declares a GPU: a llama.cpp role's estimate by pool."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rosterd.cli import _register, app
from support.up import llama_entry, write_roster

_register()


def _fleet(path: Path, gguf: Path, devices: list[dict[str, object]]) -> Path:
    node: dict[str, object] = {
        "name": "box",
        "memory_gb": 16,
        "platform": "linux-x86_64",
        "devices": devices,
    }
    models = {"gemma": {"path": str(gguf), "ctx_size": 4096}}
    doc = {"nodes": [node], "models": models, "model_roots": [str(gguf.parent)]}
    path.write_text(json.dumps(doc))
    return path


def test_a_llama_cpp_role_shows_its_device_and_host_parts(tmp_path: Path, gemma_gguf: Path) -> None:
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chat", "gemma", 0.5, 18991)])
    fleet = _fleet(tmp_path / "fleet.yaml", gemma_gguf, [{"id": "CUDA0", "memory_gb": 8}])
    done = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet), "--json"])
    assert done.exit_code == 0, done.output
    chat = json.loads(done.stdout)["models"]["chat"]
    pools = chat["by_pool"]
    device, host = pools["device"], pools["host"]
    assert pools["device_bytes"] == sum(device.values())
    assert pools["host_bytes"] == sum(host.values())
    assert device["context"] == chat["estimate"]["kv_bytes"]  # every layer's KV on the GPU
    assert host["context"] == 0
    assert host["model"] + host["mapped"] == gemma_gguf.stat().st_size  # the mapped file
    table = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet)])
    assert "by pool, every layer on a device" in table.stdout


def test_without_devices_models_shows_no_pools(tmp_path: Path, gemma_gguf: Path) -> None:
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chat", "gemma", 0.5, 18991)])
    fleet = _fleet(tmp_path / "fleet.yaml", gemma_gguf, [])
    done = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet), "--json"])
    assert done.exit_code == 0, done.output
    assert "by_pool" not in json.loads(done.stdout)["models"]["chat"]
