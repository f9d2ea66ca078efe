"""The runtime of ``rosterd up`` as a plain function, without Typer or a subprocess: an
:class:`UpRun` serves a real llama-server on a tiny GGUF in this event loop and is stopped
by its own handle, leaving no backend; bad input is a ``RosterdError`` before anything
starts."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from rosterd.adapters.llamacpp import find_llama_server
from rosterd.cli.up_report import ConsoleReporter
from rosterd.errors import RosterdError
from rosterd.up.runtime import UpOptions, UpRun
from support.backends import pick_free_port, wait_gone
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, highlight=False)


def _text(console: Console) -> str:
    stream = console.file
    assert isinstance(stream, io.StringIO)
    return stream.getvalue()


@pytest.mark.slow
async def test_up_runs_in_process_and_stops_by_its_handle(tmp_path: Path) -> None:
    if find_llama_server() is None:
        pytest.skip("llama-server is not built (scripts/build-llama-server)")
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18961)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256}},
        address="127.0.0.1",
    )
    out = _console()
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
    )
    async with serving(options, out=out, err=_console(), stop_timeout_s=60) as up:
        async with httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client:
            answer = await client.post(
                "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 4}
            )
            assert answer.status_code == 200, answer.text
            status = (await client.get("/status")).json()
        pid = status["nodes"]["box"]["roles"]["tiny"]["pid"]
        assert isinstance(pid, int)
    assert await wait_gone(pid)
    printed = _text(out)
    assert "rosterd serving 1 role(s) on http://127.0.0.1:" in printed
    assert printed.rstrip().endswith("rosterd stopped; no backend left running")
    assert not list((tmp_path / "state").glob("run/*.json"))  # no pid record left


async def test_bad_roster_is_a_rosterd_error_and_starts_nothing(tmp_path: Path) -> None:
    up = UpRun(
        UpOptions(roster_path=tmp_path / "nope.yaml", state_dir=tmp_path / "state"),
        ConsoleReporter(_console(), _console()),
    )
    with pytest.raises(RosterdError, match=r"nope\.yaml"):
        await up.run()
    with pytest.raises(RosterdError, match="ended before it served"):
        await up.serving()
    assert not (tmp_path / "state").exists()  # refused before the state folder was taken


async def test_stop_before_serving_returns_without_serving(tmp_path: Path) -> None:
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18962)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}},
        address="127.0.0.1",
    )
    out = _console()
    up = UpRun(
        UpOptions(
            roster_path=roster,
            fleet_path=fleet,
            port=pick_free_port(),
            state_dir=tmp_path / "state",
            warm_up=False,
        ),
        ConsoleReporter(out, _console()),
    )
    up.stop()
    await asyncio.wait_for(up.run(), 60)
    assert up.url is None
    assert "rosterd serving" not in _text(out)
    assert "rosterd stopped; no backend left running" in _text(out)
