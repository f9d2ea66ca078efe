"""A backend killed under ``rosterd up`` (a real llama-server on a tiny GGUF): a request
sent at once waits for the supervisor's restart and succeeds, and ``/status`` shows the
restarted process's pid."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rosterd.adapters.llamacpp import find_llama_server
from support.up import (
    MODELS,
    StartUp,
    llama_entry,
    prepare_example_models,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def _role_info(status: dict[str, object]) -> dict[str, object]:
    nodes = status["nodes"]
    assert isinstance(nodes, dict)
    return dict(nodes["box"]["roles"]["tiny"])


def test_a_request_right_after_kill_9_waits_for_the_restart(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    if find_llama_server() is None:
        pytest.skip("llama-server is not built (scripts/build-llama-server)")
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18931)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256}},
        address="127.0.0.1",
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet)])
    try:
        wait_resident(up, {"tiny"})
        old_pid = _role_info(up.get("/status"))["pid"]
        assert isinstance(old_pid, int)
        os.kill(old_pid, signal.SIGKILL)
        began = time.monotonic()
        answer = httpx.post(
            up.url + "/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
            timeout=60,
            trust_env=False,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"]
        info = _role_info(up.get("/status"))
        assert info["phase"] == "ready"
        assert isinstance(info["pid"], int)
        assert info["pid"] != old_pid
        assert psutil.pid_exists(info["pid"])
        events = [e["kind"] for e in up.get("/rosterd/events")["events"]]
        assert "crashed" in events
        assert "restarted" in events
        crashed = next(e for e in up.get("/rosterd/events")["events"] if e["kind"] == "crashed")
        assert (
            crashed["cause"]
            == f"backend pid {old_pid} was killed by signal 9 (SIGKILL); restarting"
        )
        print(f"request after kill -9 answered in {time.monotonic() - began:.2f} s")
    finally:
        assert up.stop(signal.SIGINT) == 0
    assert "backend tiny was killed by signal 9 (SIGKILL)" in " ".join(up.output().split())
