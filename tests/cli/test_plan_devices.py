"""``rosterd plan`` on a fleet that declares a GPU: roles placed on the device, held to its
memory, and the reason for every role it cannot hold."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.tokens import GB
from support.up import llama_entry, write_roster

_register()


def _roster(latency: str, roles: int = 4) -> tuple[str, str]:
    roster = "roster:\n" + "".join(
        f"  - id: coder-{i}\n    role: coder\n    name: coder-{i}\n    ram_gb: 14\n"
        f"    backend: llama.cpp\n    port: {8500 + i}\n    status: ready\n"
        for i in range(roles)
    )
    overlay = "latency_class:\n" + "".join(f"  coder-{i}: {latency}\n" for i in range(roles))
    return roster, overlay


FLEET = """\
nodes:
  - name: gpu-box
    memory_gb: 128
    reserved_gb: 8
    platform: linux-x86_64
    devices:
      - {id: CUDA0, memory_gb: 24}
"""


def _plan(
    tmp_path: Path, latency: str, *extra: str, fleet: str = FLEET, roles: int = 4
) -> tuple[int, str]:
    roster_text, overlay_text = _roster(latency, roles)
    (tmp_path / "roster.yaml").write_text(roster_text)
    (tmp_path / "overlay.yaml").write_text(overlay_text)
    (tmp_path / "fleet.yaml").write_text(fleet)
    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(tmp_path / "roster.yaml"),
            "--overlay",
            str(tmp_path / "overlay.yaml"),
            "--fleet",
            str(tmp_path / "fleet.yaml"),
            "--state-dir",
            str(tmp_path / "state"),
            "--time-limit",
            "0.2",
            *extra,
        ],
    )
    return result.exit_code, result.stdout


def test_four_14_gib_interactive_roles_one_24_gib_gpu_one_placed_and_why_not_the_rest(
    tmp_path: Path,
) -> None:
    code, out = _plan(tmp_path, "interactive", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert len(doc["placements"]) == 1
    (placed,) = doc["placements"]
    assert doc["devices"]["gpu-box"]["CUDA0"] == {
        "capacity_bytes": 24 * GB,
        "peak_bytes": 14 * GB,
        "always_resident": [placed],
        "swappable": [],
        "source": "declared",
    }
    assert doc["device_of"] == {
        placed: {
            "gpu-box": {
                "device": "CUDA0",
                "gpu_layers": None,
                "layers": None,
                "device_bytes": 14 * GB,
            }
        }
    }
    assert len(doc["unplaced"]) == 3
    for _role, reason in doc["unplaced"]:
        assert "needs 14.00 GiB on one device" in reason
        assert "CUDA0: 10.00 GiB free of 24.00 GiB" in reason


def test_on_two_nodes_with_a_24_gib_gpu_each_one_interactive_role_goes_to_each_gpu(
    tmp_path: Path,
) -> None:
    second = FLEET.split("\n", 1)[1].replace("gpu-box", "gpu-two")
    code, out = _plan(tmp_path, "interactive", "--json", fleet=FLEET + second)
    assert code == 0, out
    doc = json.loads(out)
    assert sorted(doc["placements"].values()) == ["gpu-box", "gpu-two"]
    for node in ("gpu-box", "gpu-two"):
        assert doc["devices"][node]["CUDA0"]["peak_bytes"] == 14 * GB
    assert len(doc["unplaced"]) == 2
    for _role, reason in doc["unplaced"]:
        assert reason.startswith("no device on gpu-box or gpu-two has room")
        assert "on gpu-box: CUDA0: 10.00 GiB free of 24.00 GiB" in reason
        assert "on gpu-two: CUDA0: 10.00 GiB free of 24.00 GiB" in reason


def test_four_14_gib_batch_roles_swap_on_the_gpu_one_at_a_time(tmp_path: Path) -> None:
    code, out = _plan(tmp_path, "batch")
    assert code == 0, out
    assert "CUDA0: [" in out
    assert "14.0 / 24.0 GiB" in out  # the peak: one 14 GiB role at a time
    assert "swapped one at a time as room allows: coder-0, coder-1, coder-2, coder-3" in out
    assert "every role is placed" in out


def test_a_partial_offload_shows_its_layer_count_and_expected_slowdown(
    tmp_path: Path, gemma_gguf: Path
) -> None:
    # The roster names the model "gemma": its fleet entry is found by that name, as its
    # weights are, and says `offload: partial`.
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chat", "gemma", 0.1, 18991)])
    node = {
        "name": "box",
        "memory_gb": 16,
        "platform": "linux-x86_64",
        "devices": [{"id": "CUDA0", "memory_gb": 0.7}],
    }
    models = {"gemma": {"path": str(gemma_gguf), "ctx_size": 4096, "offload": "partial"}}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        json.dumps({"nodes": [node], "models": models, "model_roots": [str(gemma_gguf.parent)]})
    )
    args = ["plan", str(roster), "--fleet", str(fleet), "--state-dir", str(tmp_path / "state")]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert "chat: partial offload (-ngl " in done.stdout
    assert " of 18 layers on CUDA0, the rest on the CPU" in done.stdout
    assert "x slower than all on the device" in done.stdout
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    choice = doc["device_of"]["chat"]["box"]
    assert choice["device"] == "CUDA0"
    assert 1 <= choice["gpu_layers"] < 19


TWO_GPUS = """\
nodes:
  - name: gpu-box
    memory_gb: 128
    reserved_gb: 8
    platform: linux-x86_64
    devices:
      - {id: CUDA0, memory_gb: 24}
      - {id: CUDA1, memory_gb: 24}
models:
  coder-0: {path: /models/coder.gguf, replicas: 2}
"""


def test_replicas_2_on_two_gpus_plans_one_copy_per_gpu_in_the_table_and_json(
    tmp_path: Path,
) -> None:
    code, out = _plan(tmp_path, "interactive", fleet=TWO_GPUS, roles=1)
    assert code == 0, out
    flat = " ".join(out.split())
    assert "coder-0: 2 copies, on gpu-box (CUDA0), gpu-box (CUDA1)" in flat
    assert "resident always: coder-0~2" in flat
    assert flat.count("coder-0~2") == 2, out  # the node table's row of the copy, CUDA1's line
    code, out = _plan(tmp_path, "interactive", "--json", fleet=TWO_GPUS, roles=1)
    doc = json.loads(out)
    assert doc["copies"]["coder-0"] == ["gpu-box"]
    assert doc["device_of"]["coder-0"]["gpu-box"]["device"] == "CUDA0"
    assert doc["device_of"]["coder-0~2"]["gpu-box"]["device"] == "CUDA1"
    assert doc["devices"]["gpu-box"]["CUDA1"]["always_resident"] == ["coder-0~2"]


def test_further_copies_take_a_device_only_after_every_role_has_one(tmp_path: Path) -> None:
    code, out = _plan(tmp_path, "interactive", "--json", fleet=TWO_GPUS)
    assert code == 0, out
    doc = json.loads(out)
    assert sorted(doc["placements"]) == ["coder-0", "coder-1"]
    assert "coder-0" not in doc["copies"]
    ((role, reason),) = doc["copies_short"]
    assert role == "coder-0"
    assert "gpu-box: no other device has room for this copy" in reason
