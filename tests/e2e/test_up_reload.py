"""Reload without restart, on a running ``rosterd up`` with real llama-server processes.

The roster and fleet files change under a running ``up``: a role added becomes
routable, a role removed while it streams finishes its stream and then stops, a role
whose launch changed (its fleet ``ctx_size``) restarts with it, an untouched role keeps
its process, a broken file changes nothing and is reported with its file, line and
column, and a smaller fleet memory evicts to fit. Reloads come from ``rosterd reload``,
``--watch`` and SIGHUP. Last, in-process without a backend: a roster that cannot be
read is refused and reported, and a reload with nothing changed says so.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port, pick_free_ports
from support.polling import eventually_sync
from support.up import (
    GEMMA,
    MODELS,
    StartUp,
    Up,
    all_gone,
    llama_entry,
    prepare_example_models,
    rosterd_argv,
    serving,
    wait_resident,
    write_box_fleet,
    write_roster,
)


def roles(up: Up) -> dict[str, dict[str, Any]]:
    """Role -> its ``/status`` view, over every node."""
    status = up.get("/status")
    return {r: info for node in status["nodes"].values() for r, info in node["roles"].items()}


def status_of(up: Up) -> Callable[[], str]:
    """What a wait that timed out shows: ``up``'s ``/status`` then."""
    return lambda: json.dumps(up.get("/status"))


def complete(up: Up, model: str) -> httpx.Response:
    return httpx.post(
        up.url + "/v1/completions",
        json={"model": model, "prompt": "hello", "max_tokens": 4},
        timeout=60,
        trust_env=False,
    )


def n_ctx(base_url: str) -> int:
    props = httpx.get(base_url + "/props", timeout=10, trust_env=False).json()
    return int(props["default_generation_settings"]["n_ctx"])


@pytest.mark.slow
def test_reload_adds_removes_restarts_and_refuses_a_broken_file(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster_path = tmp_path / "roster.yaml"
    fleet_path = tmp_path / "fleet.yaml"
    models: dict[str, dict[str, object]] = {
        "gemma-3-270m": {"path": str(GEMMA), "ctx_size": 1024, "parallel": 1},
        "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256},
        "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 256},
        "tiny-voice": {"path": str(MODELS / "tiny-voice.gguf"), "ctx_size": 256},
    }
    stay = llama_entry("stay", "tiny-a", 0.1, 18701)
    streamer = llama_entry("streamer", "gemma-3-270m", 0.5, 18702)
    changed = llama_entry("changed", "tiny-b", 0.1, 18703)
    added = llama_entry("added", "tiny-voice", 0.1, 18704)
    write_roster(roster_path, [stay, streamer, changed])
    write_box_fleet(fleet_path, models, flavors=["llamacpp"])
    # --drain 120: the removed role's stream must be able to finish even on a busy machine.
    args = [str(roster_path), "--fleet", str(fleet_path), "--watch", "--drain", "120"]
    up = rosterd_up(args)
    lines: list[str] = []
    first_chunk = threading.Event()

    def long_stream() -> None:
        body = {
            "model": "streamer",
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 160,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream(
            "POST", up.url + "/v1/chat/completions", json=body, timeout=150, trust_env=False
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    first_chunk.set()

    try:
        wait_resident(up, {"stay", "streamer", "changed"})  # sticky: warmed up at start
        before = roles(up)
        assert n_ctx(before["changed"]["base_url"]) == 256
        streaming = threading.Thread(target=long_stream)
        streaming.start()
        assert first_chunk.wait(30)

        # The change: streamer removed, added added, changed's ctx_size 256 -> 512.
        write_roster(roster_path, [stay, changed, added])
        models["tiny-b"] = {**models["tiny-b"], "ctx_size": 512}
        write_box_fleet(fleet_path, models, flavors=["llamacpp"])
        reload = subprocess.run(
            [*rosterd_argv(), "reload", "--url", up.url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert reload.returncode == 0, reload.stderr
        # --watch may see the new files before the explicit reload does: then the
        # change is the watch's, and the explicit reload finds nothing left to do.
        if reload.stdout.strip() != "reloaded: nothing changed":
            assert "node box: added added" in reload.stdout
            assert "node box: retired streamer" in reload.stdout
            assert "node box: restarted changed" in reload.stdout
        reported = ("added added", "retired streamer", "restarted changed")
        eventually_sync(
            lambda: all(done in up.output() for done in reported),
            what=f"{', '.join(reported)} reported",
            timeout_s=30.0,
            context=status_of(up),
        )
        assert not lines[-1].endswith("[DONE]")  # the stream was still going

        gone = complete(up, "streamer")
        assert gone.status_code == 404, gone.text
        assert gone.json()["error"]["code"] == "model_not_found"
        models_now = {m["id"] for m in up.get("/v1/models")["data"]}
        assert models_now == {"stay", "changed", "added"}
        assert complete(up, "added").status_code == 200

        streaming.join(150)
        assert lines[-1] == "data: [DONE]", lines[-3:]  # the removed role's stream completed
        assert all_gone({before["streamer"]["pid"]}) == set()
        eventually_sync(
            lambda: "streamer" not in roles(up),
            what="the retired role forgotten",
            timeout_s=30.0,
            context=status_of(up),
        )

        after = eventually_sync(
            lambda: roles(up)["changed"]["pid"],
            what="changed restarted",
            timeout_s=30.0,
            context=status_of(up),
        )
        assert after != before["changed"]["pid"]
        assert n_ctx(roles(up)["changed"]["base_url"]) == 512
        assert all_gone({before["changed"]["pid"]}) == set()
        assert roles(up)["stay"]["pid"] == before["stay"]["pid"]  # untouched: kept running
        assert complete(up, "changed").status_code == 200
        config = up.get("/status")["config"]
        assert config["last_error"] is None
        assert config["last_reload_at"] is not None
        assert config["watch"] is True

        # A broken roster: --watch notices, nothing changes, the error names the place.
        kept = {role: info["pid"] for role, info in roles(up).items()}
        roster_path.write_text("roster:\n  - id: stay\n    name: [tiny-a\n")
        error = eventually_sync(
            lambda: up.get("/status")["config"]["last_error"],
            what="the broken file reported",
            timeout_s=30.0,
            context=status_of(up),
        )
        assert error["file"] == str(roster_path)
        assert (error["line"], error["column"]) == (4, 1)
        assert "not valid YAML" in error["message"]
        refused = httpx.post(up.url + "/rosterd/reload", timeout=60, trust_env=False)
        assert refused.status_code == 422
        assert refused.json()["error"]["code"] == "invalid_config"
        assert f"{roster_path}:4:1" in refused.json()["error"]["message"]
        assert {role: info["pid"] for role, info in roles(up).items()} == kept
        assert complete(up, "added").status_code == 200
        assert "reload refused, the running configuration stays" in up.output()

        # Fixed again, and SIGHUP reloads too (nothing changed: the error is cleared).
        write_roster(roster_path, [stay, changed, added])
        up.proc.send_signal(signal.SIGHUP)
        eventually_sync(
            lambda: up.get("/status")["config"]["last_error"] is None,
            what="the error cleared",
            timeout_s=30.0,
            context=status_of(up),
        )
        assert up.proc.poll() is None  # SIGHUP reloads; it does not stop rosterd
        assert {role: info["pid"] for role, info in roles(up).items()} == kept
    finally:
        code = up.stop()
    assert code == 0, up.output()


@pytest.mark.slow
def test_a_smaller_fleet_memory_evicts_to_fit(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster_path = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("a", "tiny-a", 0.3, 18711), llama_entry("b", "tiny-b", 0.3, 18712)],
    )
    models: dict[str, dict[str, object]] = {
        "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256},
        "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 256},
    }
    fleet_path = write_box_fleet(
        tmp_path / "fleet.yaml", models, memory_gb=2, reserved_gb=1, flavors=["llamacpp"]
    )
    up = rosterd_up([str(roster_path), "--fleet", str(fleet_path)])
    try:
        wait_resident(up, {"a", "b"})
        assert complete(up, "b").status_code == 200  # b used last: a goes first
        pid_a = roles(up)["a"]["pid"]
        write_box_fleet(
            tmp_path / "fleet.yaml", models, memory_gb=1.5, reserved_gb=1, flavors=["llamacpp"]
        )
        answer = httpx.post(up.url + "/rosterd/reload", timeout=60, trust_env=False)
        assert answer.status_code == 200, answer.text
        assert answer.json()["nodes"]["box"]["capacity_bytes"] == [2**30, 2**29]
        eventually_sync(
            lambda: roles(up)["a"]["phase"] == "stopped",
            what="a evicted",
            timeout_s=30.0,
            context=status_of(up),
        )
        assert all_gone({pid_a}) == set()
        node = up.get("/status")["nodes"]["box"]
        assert node["capacity_bytes"] == 2**29
        assert node["resident"] == ["b"]
        stopped = [e for e in up.get("/rosterd/events")["events"] if e["kind"] == "stopped"]
        assert stopped[-1]["role"] == "a"
        assert "capacity is now 0.50 GiB" in stopped[-1]["cause"]
        metrics = httpx.get(up.url + "/metrics", trust_env=False).text
        assert 'cause="replan"' in metrics
        assert complete(up, "b").status_code == 200
    finally:
        code = up.stop()
    assert code == 0, up.output()


async def test_a_missing_roster_is_refused_and_reported_and_nothing_changes(
    tmp_path: Path,
) -> None:
    tiny = llama_entry("tiny", "tiny-a", 0.1, pick_free_port())
    roster = write_roster(tmp_path / "roster.yaml", [tiny])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    )
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        warm_up=False,
    )
    async with (
        serving(options) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        config = (await client.get("/status")).json()["config"]
        assert config["files"] == {
            "roster": str(roster),
            "overlay": None,
            "fleet": str(fleet),
            "keys": None,
        }
        assert (config["last_reload_at"], config["last_error"]) == (None, None)
        roster.rename(tmp_path / "moved.yaml")
        refused = await client.post("/rosterd/reload")
        assert refused.status_code == 422
        assert str(roster) in refused.json()["error"]["message"]
        error = (await client.get("/status")).json()["config"]["last_error"]
        assert error["file"] == str(roster)
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["tiny"]
        (tmp_path / "moved.yaml").rename(roster)
        same = await client.post("/rosterd/reload")
        assert same.status_code == 200, same.text
        assert same.json()["changed"] is False
        assert (await client.get("/status")).json()["config"]["last_error"] is None


async def test_a_reload_checks_ports_as_the_start_does(tmp_path: Path) -> None:
    """A role added on a port another role holds is unplaced by the reload, with a reason
    naming both, instead of failing at its load (as ``plan`` and ``up`` do at start)."""
    port = pick_free_port()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, port)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf")},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf")},
        },
    )
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        warm_up=False,
    )
    async with serving(options) as up:
        write_roster(
            roster,
            [llama_entry("tiny", "tiny-a", 0.1, port), llama_entry("other", "tiny-b", 0.1, port)],
        )
        async with httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client:
            reloaded = await client.post("/rosterd/reload")
            assert reloaded.status_code == 200, reloaded.text
            unplaced = dict((await client.get("/status")).json()["unplaced"])
            assert "other" in unplaced
            assert f"port {port}" in unplaced["other"]
            assert "tiny" in unplaced["other"]


async def test_a_renamed_node_takes_its_roles_once_the_old_node_let_them_go(
    tmp_path: Path,
) -> None:
    """Renaming this machine's node in the fleet moves every role to the new name: the old
    node drains and stops its backends, and the new node starts them (warm-up, requests)
    only once the old processes have exited, instead of failing on the name."""
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18741)])
    models: dict[str, dict[str, object]] = {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models)
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
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        text = fleet.read_text()
        fleet.write_text(text.replace('"name": "box"', '"name": "renamed"'))
        assert "renamed" in fleet.read_text()
        reloaded = await client.post("/rosterd/reload")
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["drained_nodes"] == ["box"]
        answer = await client.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        status = (await client.get("/status")).json()
        role = status["nodes"]["renamed"]["roles"]["tiny"]
        assert role["phase"] == "ready"
        assert role["last_error"] is None


async def test_a_reload_that_adds_an_exclusion_stops_one_of_the_two(tmp_path: Path) -> None:
    """Two roles resident together; the overlay is given ``excludes`` between them and
    reloaded: one of them stops (the later loaded), the other keeps its process."""
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("first", "tiny-a", 0.1, 18751), llama_entry("second", "tiny-b", 0.1, 18752)],
    )
    models: dict[str, dict[str, object]] = {
        name: {"path": str(MODELS / f"{name}.gguf")} for name in ("tiny-a", "tiny-b")
    }
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("{}\n")
    options = UpOptions(
        roster_path=roster,
        overlay_path=overlay,
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
        for role in ("first", "second"):
            assert (await client.post(f"/rosterd/load/{role}")).status_code == 200
        before = (await client.get("/status")).json()["nodes"]["box"]
        assert sorted(before["resident"]) == ["first", "second"]
        overlay.write_text(json.dumps({"excludes": {"second": ["first"]}}))
        assert (await client.post("/rosterd/reload")).status_code == 200
        for _ in range(100):
            node = (await client.get("/status")).json()["nodes"]["box"]
            if node["resident"] == ["first"]:
                break
            await asyncio.sleep(0.1)
        assert node["resident"] == ["first"]
        assert node["roles"]["first"]["pid"] == before["roles"]["first"]["pid"]
        events = (await client.get("/rosterd/events")).json()["events"]
        assert any(
            e["kind"] == "stopped" and e["role"] == "second" and "exclude first" in e["cause"]
            for e in events
        )


async def test_a_reload_whose_weights_are_missing_is_refused_and_the_backend_keeps_running(
    tmp_path: Path,
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18761)])
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
        assert (await client.post("/rosterd/load/tiny")).status_code == 200
        pid = (await client.get("/status")).json()["nodes"]["box"]["roles"]["tiny"]["pid"]
        write_box_fleet(fleet, {"tiny-a": {"path": str(tmp_path / "nope.gguf")}})
        refused = await client.post("/rosterd/reload")
        assert refused.status_code == 422
        message = refused.json()["error"]["message"]
        assert "nope.gguf does not exist" in message
        assert "the running configuration stays" in message
        role = (await client.get("/status")).json()["nodes"]["box"]["roles"]["tiny"]
        assert (role["phase"], role["pid"]) == ("ready", pid)


async def test_a_reload_says_why_it_stopped_serving_a_role(tmp_path: Path) -> None:
    kept_port, typo_port = pick_free_ports(2)
    entries = [
        llama_entry("kept", "tiny-a", 0.1, kept_port),
        llama_entry("typo", "tiny-b", 0.1, typo_port),
    ]
    roster = write_roster(tmp_path / "roster.yaml", entries)
    models: dict[str, dict[str, object]] = {
        name: {"path": str(MODELS / f"{name}.gguf")} for name in ("tiny-a", "tiny-b")
    }
    prepare_example_models()
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models)
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        warm_up=False,
    )
    async with (
        serving(options) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):
        typo = {k: v for k, v in entries[1].items() if k != "ram_gb"} | {"ramgb": 0.1}
        write_roster(roster, [entries[0], typo])
        said = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "reload", "--url", up.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert said.returncode == 0, said.stderr
        assert "node box: retired typo" in said.stdout
        assert (
            "role typo is no longer served: the roster import skips it: "
            "ram_gb is missing or not a number"
        ) in said.stdout
        last = (await client.get("/status")).json()["config"]["last_change"]
        assert last["why"] == {
            "typo": "the roster import skips it: ram_gb is missing or not a number"
        }
