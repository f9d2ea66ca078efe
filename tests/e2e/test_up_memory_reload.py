"""Memory figures through a reload, and ollama's own figure, on in-process ``rosterd up``
runs stopped by their handles.

- a role a reload adds shows its figures in ``/status`` at once (declared, estimated,
  counted), its peak is recorded in the state folder under the new configuration's
  settings, and a changed fleet ``max_concurrency`` is the node's limit from then on
  (real llama-server processes on the tiny GGUFs);
- an ollama role is loaded under the roster's ``name``, an ollama tag
  (``llama3.2:1b``: the import keeps no model for a name with a colon, as the
  reference does), and counts the roster's figure until ollama held it, then the size
  ollama reported (``/api/ps``): in ``/status`` during the run, and as its measured
  figure and estimate on the next ``rosterd plan``. Ollama cannot run on the test
  machine, so the FAKE ollama of ``tests/support/fake_ollama.py`` (Ollama's documented
  ``/api/generate`` and ``/api/ps``) stands in for it, found on ``PATH`` as ``ollama``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rosterd.adapters.llamacpp import find_llama_server
from rosterd.cli import _register, app
from rosterd.fleet.reader import load_fleet
from rosterd.memory.gathering import gather_memory
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.roster.importer import load_roster
from rosterd.tokens import GB
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.ollama import fake_ollama_binary
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

_register()

pytestmark = pytest.mark.slow


async def _serve(options: UpOptions, work: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    """Run ``up`` with ``options`` until ``work(client)`` returned (client on its URL)."""
    async with (
        serving(options) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        await work(client)


def _role(status: dict[str, Any], role: str) -> dict[str, Any]:
    view: dict[str, Any] = status["nodes"]["box"]["roles"][role]
    return view


async def test_a_role_a_reload_adds_shows_and_records_its_memory(tmp_path: Path) -> None:
    if find_llama_server() is None:
        pytest.skip("llama-server is not built (scripts/build-llama-server)")
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("first", "tiny-a", 0.001, 18981)])
    models: dict[str, dict[str, object]] = {
        "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256},
        "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 512, "parallel": 2},
    }
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models, max_concurrency=1)
    state = tmp_path / "state"
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=state,
        auto_backend_ports=True,
        warm_up=False,
    )
    seen: dict[str, Any] = {}

    async def reload_then_use(client: httpx.AsyncClient) -> None:
        before = (await client.get("/status")).json()
        assert before["nodes"]["box"]["max_concurrency"] == 1
        write_roster(
            roster,
            [
                llama_entry("first", "tiny-a", 0.001, 18981),
                llama_entry("added", "tiny-b", 0.001, 18982),
            ],
        )
        write_box_fleet(fleet, models, max_concurrency=3)
        answer = await client.post("/rosterd/reload")
        assert answer.status_code == 200, answer.text
        status = (await client.get("/status")).json()
        seen["added"] = _role(status, "added")["memory"]
        seen["max_concurrency"] = status["nodes"]["box"]["max_concurrency"]
        body = {"model": "added", "prompt": "hello there", "max_tokens": 8}
        done = await client.post("/v1/completions", json=body)
        assert done.status_code == 200, done.text

    await _serve(options, reload_then_use)
    added = seen["added"]
    assert added is not None  # the figures of a role a reload added are shown at once
    assert added["declared_bytes"] == int(0.001 * GB)
    assert added["estimated_bytes"] > 10 * 2**20  # estimated from tiny-b's weights
    assert added["counted_bytes"] == added["estimated_bytes"]
    assert seen["max_concurrency"] == 3  # the reloaded fleet's limit is the node's now

    # Its peak was stored under the reloaded configuration's fingerprint (tiny-b with
    # ctx_size 512 and parallel 2), so the next up and plan count it.
    memory = gather_memory(load_roster(roster), load_fleet(fleet), state)
    assert memory.roles["added"].measured_bytes("box") is not None
    assert MeasuredPeaks(state).peak_bytes(
        "box", "added", fingerprint=memory.roles["added"].fingerprint
    ) == memory.roles["added"].measured_bytes("box")


OLLAMA_SIZE = 1_300_000_000  # what the fake ollama reports holding for the model, bytes


async def test_an_ollama_role_counts_the_size_ollama_reported_once_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    binary = fake_ollama_binary(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_OLLAMA_MODELS", f"llama3.2:1b={OLLAMA_SIZE}")
    entry = {**llama_entry("small", "llama3.2:1b", 0.5, 11434), "backend": "ollama"}
    roster = write_roster(tmp_path / "roster.yaml", [entry])
    fleet = write_box_fleet(tmp_path / "fleet.yaml", {})
    state = tmp_path / "state"
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=state,
        auto_backend_ports=True,
        warm_up=False,
    )
    seen: dict[str, Any] = {}

    async def load_it(client: httpx.AsyncClient) -> None:
        seen["before"] = _role((await client.get("/status")).json(), "small")["memory"]
        loaded = await client.post("/rosterd/load/small")
        assert loaded.status_code == 200, loaded.text
        for _ in range(100):  # the recorder reads ollama's figure after the load
            memory = _role((await client.get("/status")).json(), "small")["memory"]
            if memory.get("run_peak_bytes"):
                break
            await asyncio.sleep(0.1)
        seen["loaded"] = memory

    await _serve(options, load_it)
    before = seen["before"]
    assert before["counted_from"] == "roster"  # nothing is known before ollama held it
    assert before["estimated_bytes"] is None
    assert "only once loaded" in before["estimate_note"]
    assert seen["loaded"]["run_peak_bytes"] == OLLAMA_SIZE
    assert MeasuredPeaks(state).peak_bytes("box", "small") == OLLAMA_SIZE

    result = CliRunner().invoke(
        app, ["plan", str(roster), "--fleet", str(fleet), "--state-dir", str(state), "--json"]
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)["memory"]["small"]
    assert figures["measured_bytes"] == OLLAMA_SIZE
    assert figures["estimated_bytes"] == OLLAMA_SIZE  # ollama's own figure is its estimate
    assert figures["counted_bytes"] == OLLAMA_SIZE  # above ram_gb's 0.5 GiB
    assert "ollama reported" in figures["estimate_note"]


async def test_a_reload_plans_with_the_counted_figure_as_the_start_does(tmp_path: Path) -> None:
    prepare_example_models()
    # ram_gb 0.001 (1 MiB): far below tiny-a's estimate; no backend is started here.
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.001, 18983)])
    models: dict[str, dict[str, object]] = {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models)
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
    )
    seen: dict[str, Any] = {}

    async def shrink(client: httpx.AsyncClient) -> None:
        # 10 MiB: room for ram_gb's 1 MiB, not for what tiny-a is estimated to hold.
        write_box_fleet(fleet, models, memory_gb=0.01, reserved_gb=0)
        refused = await client.post("/rosterd/reload")  # it would serve nothing
        assert refused.status_code == 422, refused.text
        assert "serves no role" in refused.json()["error"]["message"]
        answer = await client.post("/rosterd/reload?force=true")
        assert answer.status_code == 200, answer.text
        seen["status"] = (await client.get("/status")).json()

    await _serve(options, shrink)
    [(role, reason)] = seen["status"]["unplaced"]
    assert role == "tiny"
    assert "counted from the estimate from its weights" in reason
    assert "the roster's ram_gb says 0.00 GiB" in reason
