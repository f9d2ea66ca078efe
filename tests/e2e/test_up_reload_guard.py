"""What a reload of a running ``rosterd up`` guards against, tried as a user would, with real
llama-server processes: a one-word typo in the roster's top-level key, which imports
nothing, is refused (the lab keeps serving) unless forced, and ``rosterd reload`` says the
import's warnings itself; a reload that makes an unavailable interactive role servable
again warms it, as ``up`` warms it at start.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

_register()


async def test_a_typo_that_imports_nothing_is_refused_and_said_unless_forced(
    tmp_path: Path,
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18791)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    )
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
    )
    async with (
        serving(options) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        roster.write_text(roster.read_text().replace('"roster"', '"rooster"', 1))
        url = ["--url", up.url]
        runner = CliRunner()
        refused = await asyncio.to_thread(runner.invoke, app, ["reload", *url])
        assert refused.exit_code == 2, refused.output
        said = " ".join(refused.output.split())
        assert "serves no role" in said
        assert "rooster" in said  # the import's own warning about the key, said here
        assert "--force" in said
        status = (await client.get("/status")).json()
        assert list(status["nodes"]["box"]["roles"]) == ["tiny"]  # still served
        error = status["config"]["last_error"]
        assert error["message"].startswith("the new configuration")
        assert (error["file"], error["line"]) == (str(roster), 2)  # where "rooster" is
        assert f"{roster}:2: the file has no `roster:` key" in said
        forced = await asyncio.to_thread(runner.invoke, app, ["reload", "--force", *url])
        assert forced.exit_code == 0, forced.output
        assert "rooster" in forced.output  # the warning, on a reload that worked too
        assert "node box: retired tiny" in forced.output
        roles = (await client.get("/status")).json()["nodes"]["box"]["roles"]
        assert "tiny" not in roles or roles["tiny"]["retiring"]  # forced: it stops serving


@pytest.mark.slow
async def test_a_reload_warms_an_interactive_role_it_makes_servable(tmp_path: Path) -> None:
    prepare_example_models()
    voice = {**llama_entry("voice", "tiny-voice", 0.1, 18792), "role": "voice replies"}
    roster = write_roster(tmp_path / "roster.yaml", [voice])
    missing = {"tiny-voice": {"path": str(tmp_path / "later.gguf")}}
    fleet = write_box_fleet(tmp_path / "fleet.yaml", missing)  # type: ignore[arg-type]
    lab = json.loads(fleet.read_text())
    fleet.write_text(json.dumps({**lab, "model_roots": [str(tmp_path)]}))
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
    )
    async with (
        serving(options) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        role = (await client.get("/status")).json()["nodes"]["box"]["roles"]["voice"]
        assert (role["phase"], role["latency_class"]) == ("unavailable", "interactive")
        (tmp_path / "later.gguf").write_bytes((MODELS / "tiny-voice.gguf").read_bytes())
        assert (await client.post("/rosterd/reload")).status_code == 200
        # No request asks for it: the reload's warm-up loads it, as `up` would at start.
        deadline = time.monotonic() + 60
        phase = None
        while time.monotonic() < deadline:
            role = (await client.get("/status")).json()["nodes"]["box"]["roles"]["voice"]
            phase = role["phase"]
            if phase == "ready":
                break
            await asyncio.sleep(0.2)
        assert phase == "ready", role
