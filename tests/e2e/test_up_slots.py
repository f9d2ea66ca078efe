"""A llama.cpp role never holds more requests in flight than its parallel slots (issue 22).

Tried as a user would: a one-slot gemma role (``parallel: 1``) and three long
streams at once on a real llama-server. One is in flight at the backend; the
other two wait in rosterd's queue, where ``/status`` counts them (before, with
the per-role cap at ``--max-concurrency`` 4, two went to llama-server, which
queued the second inside, out of rosterd's sight).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from support.up import (
    GEMMA,
    StartUp,
    llama_entry,
    prepare_example_models,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def test_a_one_slot_role_holds_one_request_and_queues_the_rest(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("chat", "gemma-3-270m", 0.5, 18561)]
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"gemma-3-270m": {"path": str(GEMMA), "ctx_size": 2048, "parallel": 1}},
        flavors=["llamacpp"],
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet)])
    first_chunks = [threading.Event() for _ in range(3)]
    stop = threading.Event()

    def stream(index: int) -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 1500,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream(
            "POST", up.url + "/v1/chat/completions", json=body, timeout=120, trust_env=False
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    first_chunks[index].set()
                if stop.is_set():
                    return  # the client goes away: rosterd releases its lease

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    try:
        httpx.post(up.url + "/rosterd/load/chat", timeout=60, trust_env=False)
        wait_resident(up, {"chat"})
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not any(e.is_set() for e in first_chunks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(e.is_set() for e in first_chunks), "no stream started"
        seen: list[tuple[int, int]] = []
        for _ in range(10):
            role = up.get("/status")["nodes"]["box"]["roles"]["chat"]
            seen.append((role["running"], role["queued"]))
            time.sleep(0.1)
        assert max(in_flight for in_flight, _ in seen) == 1, seen
        assert (1, 2) in seen, seen  # the other two wait in rosterd's queue
        assert sum(e.is_set() for e in first_chunks) == 1  # llama-server got one only
        role = up.get("/status")["nodes"]["box"]["roles"]["chat"]
        assert "parallel slot" in str(role["waiting_reason"]), role
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        code = up.stop()
    assert code == 0, up.output()
