"""Evicting a busy role after ``--drain`` is prompt, and its streams say why they ended.

Real llama-server processes behind ``rosterd up``: Gemma 3 270M (role ``chat``)
and a tiny GGUF (role ``other``) on a node that holds only one of them. A long
stream on ``chat`` is open when a request for ``other`` arrives; after
``--drain`` (1 s) the router ends the stream itself with an SSE error event
(code ``evicted``) and the backend stops at once, instead of generating on
through its SIGTERM for the whole ``--grace`` (10 s). Last, ``rosterd unload``
under steady traffic returns promptly, and the traffic loads the role again.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.polling import eventually_sync
from support.up import (
    GEMMA,
    MODELS,
    StartUp,
    Up,
    llama_entry,
    prepare_example_models,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def test_a_busy_role_evicted_after_drain_ends_its_stream_and_stops_promptly(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("chat", "gemma-3-270m", 0.5, 18541),
            llama_entry("other", "tiny-a", 0.3, 18542),
        ],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "gemma-3-270m": {"path": str(GEMMA), "ctx_size": 4096, "parallel": 1},
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf")},
        },
        memory_gb=1.7,
        reserved_gb=1,
        flavors=["llamacpp"],
    )
    args = [str(roster), "--fleet", str(fleet), "--drain", "1", "--grace", "10"]
    up = rosterd_up([*args, "--min-busy-residency", "0"])
    lines: list[str] = []
    first_chunk = threading.Event()

    def long_stream() -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 3000,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream(
            "POST", up.url + "/v1/chat/completions", json=body, timeout=60, trust_env=False
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    first_chunk.set()

    try:
        httpx.post(up.url + "/rosterd/load/chat", timeout=60, trust_env=False)
        wait_resident(up, {"chat"})
        streamer = threading.Thread(target=long_stream)
        streamer.start()
        assert first_chunk.wait(20)
        asked = time.monotonic()
        reply = httpx.post(
            up.url + "/v1/chat/completions",
            json={
                "model": "other",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
            timeout=60,
            trust_env=False,
        )
        took = time.monotonic() - asked
        streamer.join(30)
        assert reply.status_code == 200, reply.text
        # --drain 1 s, a prompt stop and a load of a tiny model; not --grace (10 s) more.
        assert took < 6.0, f"the evicting request took {took:.1f} s"
        assert lines[-1] != "data: [DONE]"
        error = json.loads(lines[-1][len("data: ") :])["error"]
        assert error["code"] == "evicted"
        assert error["message"] == (
            "role chat was unloaded to make room for other after --drain 1 s"
        )
        events = up.get("/rosterd/events")["events"]
        stopping = next(e for e in events if e["kind"] == "stopping" and e["role"] == "chat")
        assert not stopping["cause"].startswith("idle")
        assert "in flight cut after --drain 1 s" in stopping["cause"]
        assert 'cause="drain"' in httpx.get(up.url + "/metrics", trust_env=False).text
    finally:
        code = up.stop()
    assert code == 0, up.output()


def test_unload_under_steady_traffic_is_prompt_and_the_traffic_continues(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18543)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}},
        flavors=["llamacpp"],
    )
    drain_s = 60  # seconds; far above what an unload takes when it does not wait for it
    args = [str(roster), "--fleet", str(fleet), "--drain", str(drain_s)]
    up = rosterd_up(args)
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 128}
    answered = [0] * 12  # answers per worker
    codes: list[int] = []
    stop = threading.Event()

    def traffic(worker: int) -> None:
        with httpx.Client(timeout=60, trust_env=False) as client:
            while not stop.is_set():
                codes.append(client.post(up.url + "/v1/completions", json=body).status_code)
                answered[worker] += 1

    # more than 4 at once
    workers = [threading.Thread(target=traffic, args=(i,)) for i in range(len(answered))]
    try:
        httpx.post(up.url + "/rosterd/load/tiny", timeout=60, trust_env=False)
        wait_resident(up, {"tiny"})
        for worker in workers:
            worker.start()
        # Every worker is in its loop: the role is never idle from here on.
        eventually_sync(
            lambda: min(answered) > 0, what="every worker answered", timeout_s=60.0, interval_s=0.05
        )
        asked = time.monotonic()
        reply = httpx.post(up.url + "/rosterd/unload/tiny", timeout=60, trust_env=False)
        took = time.monotonic() - asked
        assert reply.status_code == 200, reply.text
        # About 0.2 s here (up to 2 s on a loaded machine): the requests in flight finish
        # and the backend stops. Taking new requests meanwhile, the role drained only when
        # the traffic happened to leave it idle, or after --drain (11-31 s here with
        # --drain 30); a tenth of --drain tells the two apart on a slow machine too.
        print(f"unload under traffic took {took:.2f} s")
        assert took < drain_s / 10, f"unload took {took:.1f} s under traffic"
        # The traffic loads the role again and goes on.
        eventually_sync(
            lambda: tiny_loaded_again(up), what="tiny loaded again", timeout_s=60.0, interval_s=0.05
        )
        served_before = len(codes)
        eventually_sync(
            lambda: len(codes) > served_before,
            what="traffic answered after the load",
            timeout_s=60.0,
            interval_s=0.05,
        )
        kinds = tiny_kinds(up)
        assert kinds[-4:] == ["stopping", "stopped", "loading", "loaded"], kinds
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
        code = up.stop()
    assert code == 0, up.output()
    assert len(codes) > 10
    assert set(codes) == {200}, sorted(set(codes))


def tiny_kinds(up: Up) -> list[str]:
    """The kinds of role ``tiny``'s events, oldest first."""
    return [e["kind"] for e in up.get("/rosterd/events")["events"] if e["role"] == "tiny"]


def tiny_loaded_again(up: Up) -> bool:
    """Whether role ``tiny`` stopped and its latest event is a load."""
    kinds = tiny_kinds(up)
    return "stopped" in kinds and kinds[-1] == "loaded"
