"""``rosterd up --keys FILE``: the keys file is read at the start, and again on a reload and
with ``--watch``; a broken file is refused with its file, line and column and the keys in
force stay. In-process, without a backend (nothing here generates)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.keys import ApiKey, Scope, key_digest, render_keys
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port, pick_free_ports
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

_register()
runner = CliRunner()

OPS = ApiKey("ops", key_digest("rk-ops"), frozenset({Scope.OPERATE, Scope.WATCH}))
USER = ApiKey("user", key_digest("rk-user"), models=("tiny",))
LATE = ApiKey("late", key_digest("rk-late"))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def options(tmp_path: Path, keys: Path, *, watch: bool = False) -> UpOptions:
    prepare_example_models()
    tiny_port, other_port = pick_free_ports(2)
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("tiny", "tiny-a", 0.1, tiny_port),
            llama_entry("other", "tiny-b", 0.1, other_port),
        ],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf")},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf")},
        },
    )
    return UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        warm_up=False,
        keys_path=keys,
        api_keys=("master",),
        watch=watch,
    )


async def test_a_reload_applies_the_keys_file_and_a_broken_one_changes_nothing(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(render_keys((OPS, USER)))
    async with (
        serving(options(tmp_path, keys)) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        models = await client.get("/v1/models", headers=bearer("rk-user"))
        assert [m["id"] for m in models.json()["data"]] == ["tiny"]
        assert (await client.get("/status", headers=bearer("rk-user"))).status_code == 403
        assert (await client.get("/status", headers=bearer("rk-ops"))).status_code == 200
        every = await client.get("/v1/models", headers=bearer("master"))
        assert [m["id"] for m in every.json()["data"]] == ["other", "tiny"]

        keys.write_text(render_keys((OPS, LATE)))
        reloaded = await client.post("/rosterd/reload", headers=bearer("rk-ops"))
        assert reloaded.status_code == 200, reloaded.text
        assert (await client.get("/v1/models", headers=bearer("rk-late"))).status_code == 200
        assert (await client.get("/v1/models", headers=bearer("rk-user"))).status_code == 401

        broken = render_keys((OPS, LATE)).replace("scopes: [use]", "scopes: [use, sudo]")
        keys.write_text(broken)
        # where `sudo` is, counted from the text (the file's header comment may grow)
        line = next(n for n, text in enumerate(broken.splitlines(), 1) if "sudo" in text)
        refused = await client.post("/rosterd/reload", headers=bearer("rk-ops"))
        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        where = f"{keys}:{line}:19: keys[1].scopes[1]: expected one of use, watch, operate"
        assert where in message
        error = (await client.get("/status", headers=bearer("rk-ops"))).json()["config"]
        assert error["files"]["keys"] == str(keys)
        assert (error["last_error"]["file"], error["last_error"]["line"]) == (str(keys), line)
        assert error["last_error"]["column"] == 19
        # The keys in force stay.
        assert (await client.get("/v1/models", headers=bearer("rk-late"))).status_code == 200
        assert (await client.get("/v1/models", headers=bearer("rk-user"))).status_code == 401


async def test_watch_applies_a_changed_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(render_keys((OPS,)))
    async with (
        serving(options(tmp_path, keys, watch=True)) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        assert (await client.get("/v1/models", headers=bearer("rk-late"))).status_code == 401
        keys.write_text(render_keys((OPS, LATE)))
        deadline = time.monotonic() + 20
        status = 401
        while status != 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            status = (await client.get("/v1/models", headers=bearer("rk-late"))).status_code
        assert status == 200


def test_a_broken_keys_file_stops_up_before_it_starts(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - name: a\n    hash: rk-pasted-by-mistake-0123456789abcdef\n")
    opts = options(tmp_path, keys)
    result = runner.invoke(
        app,
        [
            "up",
            str(opts.roster_path),
            "--fleet",
            str(opts.fleet_path),
            "--keys",
            str(keys),
            "--port",
            str(opts.port),
            "--state-dir",
            str(tmp_path / "state"),
            "--no-warm-up",
        ],
    )
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"{keys}:3:11: keys[0].hash: expected sha256:" in said
    assert "rk-pasted" not in said
    assert "Traceback" not in result.output
