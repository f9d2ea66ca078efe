"""Backends that hang, fail or die under ``rosterd up``, on real processes: a SIGSTOPped
llama-server, a stand-in whose ``/health`` says 200 while its completions never finish,
a backend killed with a request in flight, a corrupt GGUF, a load nobody waits for,
shutdown during a load, a backend that ignores SIGTERM, clients that never finish their
request, and the first swap of two idle roles.

The stand-in is ``tests/support/fake_backend.py`` run through a wrapper given to rosterd as
``ROSTERD_LLAMA_SERVER``, for what llama-server cannot be made to do here: generate
nothing while its HTTP side answers, take seconds to load, ignore SIGTERM. Each
model's ``<file>.args`` picks the stand-in's mode. Deadlines are short flags so that
the tests stay quick.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.polling import eventually_sync
from support.up import (
    MODELS,
    StartUp,
    event_kinds,
    llama_entry,
    post,
    prepare_example_models,
    role_info,
    rosterd_argv,
    stand_in,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def test_a_sigstopped_llama_server_is_found_unhealthy_restarted_and_serves_again(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("tiny", "tiny-a", 0.1, 18731)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256}}
    )
    flags = ["--probe-interval", "1", "--probe-timeout", "1", "--first-byte-timeout", "3"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags])
    old_pid = None
    try:
        wait_resident(up, {"tiny"})
        old_pid = role_info(up, "tiny")["pid"]
        assert isinstance(old_pid, int)
        os.kill(old_pid, signal.SIGSTOP)
        wedged_at = time.monotonic()
        cut = post(up, {"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert cut.status_code in (503, 504), cut.text  # unhealthy, or its own deadline
        assert cut.json()["error"]["code"] in ("backend_unhealthy", "backend_timeout")
        assert time.monotonic() - wedged_at < 3.5  # within the first-byte deadline
        served = post(up, {"model": "tiny", "prompt": "hi", "max_tokens": 2})
        assert served.status_code == 200, served.text
        print(f"wedge to the first request served again: {time.monotonic() - wedged_at:.2f} s")
        info = role_info(up, "tiny")
        assert info["phase"] == "ready"
        assert info["pid"] != old_pid
        assert "unhealthy: its generation probe failed" in str(info["last_error"])
        assert {"unhealthy", "restarted"} <= set(event_kinds(up, "tiny"))
        ps = subprocess.run(
            [*rosterd_argv(), "ps", "--url", up.url],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, COLUMNS="200"),
        )
        assert "last error" in ps.stdout
        assert "generation probe failed" in " ".join(ps.stdout.split())
    finally:
        if isinstance(old_pid, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(old_pid, signal.SIGCONT)
        assert up.stop(signal.SIGINT) == 0


def test_a_backend_that_stops_generating_mid_stream_is_restarted(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    marker = tmp_path / "wedged-once"
    fleet, env = stand_in(tmp_path, {"hang": ["--mode", "wedge-once", "--marker", str(marker)]})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("hang", "hang", 0.1, 18732)])
    flags = ["--probe-interval", "0", "--probe-timeout", "1", "--chunk-timeout", "1"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags], env=env)
    try:
        wait_resident(up, {"hang"})
        began = time.monotonic()
        with httpx.stream(
            "POST",
            up.url + "/v1/completions",
            json={"model": "hang", "prompt": "hi", "stream": True},
            timeout=30,
            trust_env=False,
        ) as stream:
            assert stream.status_code == 200
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[0][len("data: ") :])["choices"]  # the first chunk came
        error = json.loads(events[-1][len("data: ") :])["error"]
        assert error["code"] in ("backend_timeout", "backend_unhealthy")
        assert time.monotonic() - began < 3.0  # the chunk deadline, not the client's patience
        served = post(up, {"model": "hang", "prompt": "hi", "max_tokens": 1})
        assert served.status_code == 200, served.text
        kinds = event_kinds(up, "hang")
        assert "unhealthy" in kinds
        assert "restarted" in kinds
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_request_in_flight_when_its_backend_is_killed_waits_for_the_restart(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    marker = tmp_path / "wedged-once"
    fleet, env = stand_in(tmp_path, {"dies": ["--mode", "wedge-once", "--marker", str(marker)]})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("dies", "dies", 0.1, 18733)])
    flags = ["--probe-interval", "0", "--first-byte-timeout", "60"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags], env=env)
    try:
        wait_resident(up, {"dies"})
        pid = role_info(up, "dies")["pid"]
        assert isinstance(pid, int)
        answer: dict[str, httpx.Response] = {}
        sending = threading.Thread(
            target=lambda: answer.setdefault("r", post(up, {"model": "dies", "prompt": "hi"}))
        )
        sending.start()
        eventually_sync(
            lambda: role_info(up, "dies")["running"] == 1,
            what="a request running on dies",
            timeout_s=20.0,
            interval_s=0.05,
        )
        os.kill(pid, signal.SIGKILL)  # the request is in flight, unanswered
        sending.join(30)
        assert answer["r"].status_code == 200, answer["r"].text  # not 502 from a dead port
        assert role_info(up, "dies")["pid"] not in (None, pid)
    finally:
        assert up.stop(signal.SIGINT) == 0
    assert "waiting for its restart" in up.output()


def test_a_corrupt_gguf_backs_off_and_ps_shows_why_and_slow_clients_are_cut(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    broken = tmp_path / "models" / "broken.gguf"
    broken.parent.mkdir()
    broken.write_bytes(b"GGUF" + b"\x00" * 64)  # a header and nothing else
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("bad", "broken", 0.1, 18734)])
    fleet = tmp_path / "fleet.yaml"
    node = {"name": "box", "memory_gb": 4, "reserved_gb": 1, "platform": "linux-x86_64"}
    fleet.write_text(
        json.dumps(
            {
                "nodes": [node],
                "models": {"bad": {"path": str(broken)}},
                "model_roots": [str(broken.parent)],
            }
        )
    )
    flags = ["--warm-up", "--request-read-timeout", "1"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags])
    try:
        eventually_sync(  # the warm-up's try
            lambda: "load_failed" in event_kinds(up, "bad"),
            what="bad's load failed",
            timeout_s=20.0,
            interval_s=0.05,
        )
        refused = post(up, {"model": "bad", "prompt": "hi"})
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "load_backoff"
        assert "failed to load 1 time(s) in a row" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert event_kinds(up, "bad").count("loading") == 1  # no new try meanwhile
        info = role_info(up, "bad")
        assert str(info["last_error"]).startswith("load failed:")
        assert info["phase"] == "stopped"
        ps = subprocess.run(
            [*rosterd_argv(), "ps", "--url", up.url],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, COLUMNS="200"),
        )
        assert "bad: last error" in " ".join(ps.stdout.split())
        # A client that sends half its headers, or half its body, is cut after 1 s.
        host, port = "127.0.0.1", int(up.url.rsplit(":", 1)[1])
        with socket.create_connection((host, port), timeout=10) as half_headers:
            half_headers.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            began = time.monotonic()
            assert half_headers.recv(1024) == b""  # closed by the server
            assert 0.8 < time.monotonic() - began < 5.0
        with socket.create_connection((host, port), timeout=10) as half_body:
            half_body.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"model":'
            )
            reply = b""
            while chunk := half_body.recv(4096):  # the server closes it after the answer
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert b"request_timeout" in reply
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_load_nobody_waits_for_is_cancelled_for_a_role_that_needs_the_room(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    fleet, env = stand_in(
        tmp_path, {"slow": ["--load-s", "20"], "quick": []}, memory_gb=1.6
    )  # capacity 0.6 GiB: one of the two 0.5 GiB roles at a time
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("slow", "slow", 0.5, 18735), llama_entry("quick", "quick", 0.5, 18736)],
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet), "--no-warm-up"], env=env)
    try:
        with pytest.raises(httpx.ReadTimeout):
            post(up, {"model": "slow", "prompt": "hi"}, timeout_s=1.0)  # gives up while it loads
        assert role_info(up, "slow")["phase"] == "loading"
        began = time.monotonic()
        served = post(up, {"model": "quick", "prompt": "hi"})
        assert served.status_code == 200, served.text
        assert time.monotonic() - began < 10.0  # not after slow's 20 s load
        assert "load_cancelled" in event_kinds(up, "slow")
        assert role_info(up, "slow")["phase"] == "stopped"
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_shutdown_aborts_a_load_at_once_and_a_backend_ignoring_sigterm_gets_its_grace(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    fleet, env = stand_in(
        tmp_path, {"slow": ["--load-s", "60"], "stubborn": ["--mode", "ignore-term"]}
    )
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("slow", "slow", 0.1, 18737), llama_entry("stubborn", "stubborn", 0.1, 18738)],
    )
    args = [str(roster), "--fleet", str(fleet), "--no-warm-up"]
    up = rosterd_up(args, env=env)
    answer: dict[str, httpx.Response] = {}
    try:
        assert post(up, {"model": "stubborn", "prompt": "hi"}).status_code == 200
        waiting = threading.Thread(
            target=lambda: answer.setdefault("r", post(up, {"model": "slow", "prompt": "hi"}))
        )
        waiting.start()
        eventually_sync(
            lambda: role_info(up, "slow")["phase"] == "loading",
            what="slow loading",
            timeout_s=20.0,
            interval_s=0.05,
        )
    finally:
        began = time.monotonic()
        assert up.stop(signal.SIGINT) == 0
        took = time.monotonic() - began
    waiting.join(10)
    assert took < 6.0, took  # was a readiness poll's own deadline (27 s) with the default drain
    assert answer["r"].status_code == 503
    assert answer["r"].json()["error"]["code"] == "shutting_down"
    log = " ".join(up.output().split())
    assert "backend stubborn" in log
    assert "SIGTERM; waiting up to 0.5 s before SIGKILL" in log  # the models: entry's grace_s
    assert "still running after 0.5 s; SIGKILL" in log


def test_idle_roles_alternating_never_wait_for_min_residency(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("x", "tiny-a", 0.5, 18739), llama_entry("y", "tiny-b", 0.5, 18740)],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 256},
        },
        memory_gb=1.6,
    )
    # A long minimum residency, so that a swap held by it could not pass for a slow load.
    args = [str(roster), "--fleet", str(fleet), "--min-busy-residency", "30"]
    up = rosterd_up(args)
    try:
        assert post(up, {"model": "x", "prompt": "hi", "max_tokens": 1}).status_code == 200
        # x, y, x, y: each swap back evicts a role that displaced the one asked for, but
        # nobody uses it, so it yields at once (it used to wait out the 30 s, issue 22).
        for model in ("y", "x", "y"):
            began = time.monotonic()
            assert post(up, {"model": model, "prompt": "hi", "max_tokens": 1}).status_code == 200
            swap_s = time.monotonic() - began
            print(f"swap of two idle roles to {model}: {swap_s * 1000:.0f} ms")
            assert swap_s < 15.0  # a held swap is 30 s plus the load
    finally:
        assert up.stop(signal.SIGINT) == 0
