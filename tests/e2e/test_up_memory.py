"""Memory that matches reality, on real llama-server processes (tiny GGUFs), in-process
``rosterd up`` runs stopped by their handles.

- a role's figure is the largest of ``ram_gb``, its estimate and the peak measured on
  its last run: the peak one ``up`` measured is in the state folder and counts on the
  next ``up`` (and in ``rosterd plan``), which says so once with both numbers;
  a node too small for the counted figure leaves the role unplaced, naming both;
- the node-wide ``max_concurrency``: two 4-slot roles on a node that allows 4 never
  run more than 4 generations at once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rosterd.adapters.llamacpp import find_llama_server
from rosterd.cli import _register, app
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.tokens import GB
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.up import (
    MODELS,
    console_text,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

_register()

pytestmark = pytest.mark.slow


def _needs_llama_server() -> None:
    if find_llama_server() is None:
        pytest.skip("llama-server is not built (scripts/build-llama-server)")
    prepare_example_models()


async def _serve(options: UpOptions, work: Callable[[str], Awaitable[None]]) -> tuple[str, str]:
    """Run ``up`` with ``options`` until ``work(url)`` returned; its stdout and stderr."""
    async with serving(options) as up:
        await work(up.url)
    return console_text(up.out), console_text(up.err)


async def test_measured_peak_counts_on_the_next_up_and_in_plan(tmp_path: Path) -> None:
    _needs_llama_server()
    # ram_gb 0.001 GB (1 MiB): far below what llama-server holds for the tiny model.
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.001, 18971)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    )
    state = tmp_path / "state"
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=state,
        auto_backend_ports=True,
        warm_up=False,
    )
    statuses: list[Any] = []  # /status documents (JSON)

    async def complete(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
            body = {"model": "tiny", "prompt": "hello there", "max_tokens": 8}
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            statuses.append((await client.get("/status")).json())

    _, first_err = await _serve(options, complete)
    first = statuses[0]["nodes"]["box"]["roles"]["tiny"]["memory"]
    assert first["measured_bytes"] is None  # nothing measured before this run
    assert first["declared_bytes"] == int(0.001 * GB)
    assert first["counted_from"] == "estimate"
    assert "role tiny: counts" in first_err  # the estimate is far above ram_gb

    peak = MeasuredPeaks(state).peak_bytes("box", "tiny")
    assert peak is not None
    assert peak > 10 * 2**20  # llama-server with a model: well above ram_gb's 1 MiB

    _, second_err = await _serve(options, complete)
    second = statuses[1]["nodes"]["box"]["roles"]["tiny"]["memory"]
    assert second["measured_bytes"] == peak  # the next up starts from what was measured
    assert second["counted_bytes"] == max(peak, second["estimated_bytes"], int(0.001 * GB))
    assert (
        statuses[1]["nodes"]["box"]["roles"]["tiny"]["resident_bytes"] == (second["counted_bytes"])
    )
    assert second_err.count("role tiny: counts") == 1  # once per role, with both numbers
    assert "where the roster's ram_gb says 0.00 GiB" in second_err
    latest = MeasuredPeaks(state).peak_bytes("box", "tiny")  # the second run's own peak
    assert latest is not None

    # plan reads the same state folder; a node smaller than the counted figure (but far
    # bigger than ram_gb) leaves the role unplaced, naming both numbers.
    small = write_box_fleet(
        tmp_path / "small.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}},
        memory_gb=0.01,
        reserved_gb=0.0,
    )
    result = CliRunner().invoke(
        app, ["plan", str(roster), "--fleet", str(small), "--state-dir", str(state), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["memory"]["tiny"]["measured_bytes"] == latest
    assert doc["placements"] == {}
    [(role, reason)] = doc["unplaced"]
    assert role == "tiny"
    counted = doc["memory"]["tiny"]["counted_bytes"]
    assert f"{counted / GB:.2f} GiB ({counted} bytes)" in reason
    assert "the roster's ram_gb says 0.00 GiB" in reason
    assert "role tiny: counts" in result.stderr


async def test_two_four_slot_roles_under_a_node_limit_of_four_run_four_at_once(
    tmp_path: Path,
) -> None:
    _needs_llama_server()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("a", "tiny-a", 0.1, 18972), llama_entry("b", "tiny-b", 0.1, 18973)],
    )
    models = {
        name: {"path": str(MODELS / f"{name}.gguf"), "ctx_size": 1024, "parallel": 4}
        for name in ("tiny-a", "tiny-b")
    }
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models, max_concurrency=4)
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=True,
    )
    seen: list[int] = []

    async def burst(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:
            for role in ("a", "b"):
                loaded = await client.post(f"/rosterd/load/{role}")
                assert loaded.status_code == 200, loaded.text
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set():
                    node = (await client.get("/status")).json()["nodes"]["box"]
                    assert node["max_concurrency"] == 4
                    seen.append(node["running"])
                    await asyncio.sleep(0.02)

            async def one(role: str) -> int:
                body = {"model": role, "prompt": "once upon a time", "max_tokens": 48}
                return (await client.post("/v1/completions", json=body)).status_code

            watcher = asyncio.create_task(watch())
            codes = await asyncio.gather(*(one("ab"[i % 2]) for i in range(8)))
            done.set()
            await watcher
            assert codes == [200] * 8

    await _serve(options, burst)
    assert seen
    assert max(seen) <= 4  # 8 requests for 8 slots, but the node allows 4 at once
