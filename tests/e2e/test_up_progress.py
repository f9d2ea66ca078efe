"""Progress, not a clock, tells a wedged backend: ``rosterd up`` asks a quiet llama-server
role's ``/slots`` (``--progress-check-after``), on real processes and real HTTP.

- A wedged backend is found in seconds: the stand-in (``tests/support/fake_backend.py``, mode
  ``wedge-once``) stands in for a wedged llama-server, which cannot be made to hang on
  demand: its ``/health`` says 200 while its completions, ``/slots`` and ``/metrics``
  hang, as llama-server's main loop does when it is stuck. The first-byte deadline stays
  at its default (300 s): only the progress check can end the request.
- A wedged backend with no progress signal (the stand-in with ``--no-slots``) is found
  within a minute with default flags: its short request's first-byte deadline follows
  from its size, and the generation probe right after it restarts the role.
- A request that stalls alone (the stand-in's ``stall-alone``: its other slot moves) is cut
  alone with 504 and the role, not restarted, serves the next request.
- A long prefill that progresses is not cut: the real gemma-3-270m on a prompt of
  thousands of tokens, quiet for tens of seconds before its first byte, looked at all
  the while.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.up import (
    GEMMA,
    StartUp,
    event_kinds,
    llama_entry,
    post,
    prepare_example_models,
    role_info,
    stand_in,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def test_a_wedged_backend_whose_health_says_200_is_found_by_its_slots_and_restarted(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    marker = tmp_path / "wedged-once"
    fleet, env = stand_in(tmp_path, {"hang": ["--mode", "wedge-once", "--marker", str(marker)]})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("hang", "hang", 0.1, 18741)])
    # No idle generation probe: the request's progress check alone finds the wedge.
    flags = ["--probe-interval", "0"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags], env=env)
    try:
        wait_resident(up, {"hang"})
        old_pid = role_info(up, "hang")["pid"]
        began = time.monotonic()
        cut = post(up, {"model": "hang", "prompt": "hi", "max_tokens": 1}, timeout_s=60)
        took_s = time.monotonic() - began
        print(f"wedged request ended after {took_s:.1f} s")
        assert cut.status_code == 503, cut.text
        assert cut.json()["error"]["code"] == "backend_unhealthy"
        assert took_s < 30  # a client's usual 120 s timeout is far off; 300 s was the rule
        served = post(up, {"model": "hang", "prompt": "hi", "max_tokens": 1})
        assert served.status_code == 200, served.text
        info = role_info(up, "hang")
        assert info["pid"] not in (None, old_pid)
        assert "slots endpoint gave no answer" in str(info["last_error"])
        assert {"unhealthy", "restarted"} <= set(event_kinds(up, "hang"))
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_wedged_backend_without_a_progress_signal_is_found_within_a_minute_by_default(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    # The stand-in answers /slots 501, as mlx_lm.server and llama-cpp-python have no such
    # endpoint and llama-server started with --no-slots refuses it: only the first-byte
    # deadline (from the prompt's size; no flag set) and the probe after it can find it.
    marker = tmp_path / "wedged-once"
    options = ["--mode", "wedge-once", "--marker", str(marker), "--no-slots"]
    fleet, env = stand_in(tmp_path, {"quiet": options})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("quiet", "quiet", 0.1, 18743)])
    up = rosterd_up([str(roster), "--fleet", str(fleet)], env=env)
    try:
        wait_resident(up, {"quiet"})
        old_pid = role_info(up, "quiet")["pid"]
        began = time.monotonic()
        body = {"model": "quiet", "prompt": "hi", "max_tokens": 1}
        with ThreadPoolExecutor(1) as first_client:
            first = first_client.submit(post, up, body, 90)
            time.sleep(1)
            behind = post(up, body, timeout_s=90)  # queued behind the first (one slot)
            took_s = time.monotonic() - began
            cut = first.result()
        print(f"the request to the wedged backend and the one behind it: {took_s:.1f} s")
        assert cut.status_code == 504, cut.text
        # The one queued behind it is served by the restarted backend within the minute,
        # never left to wait out its own deadline.
        assert behind.status_code == 200, behind.text
        assert cut.json()["error"]["code"] == "backend_timeout"
        assert "prompt's size" in cut.json()["error"]["message"]
        assert took_s < 60  # the rule was --first-byte-timeout, 300 s
        served = post(up, body)
        assert served.status_code == 200, served.text
        assert role_info(up, "quiet")["pid"] not in (None, old_pid)
        assert {"unhealthy", "restarted"} <= set(event_kinds(up, "quiet"))
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_request_that_stalls_alone_is_cut_alone_and_its_role_keeps_serving(
    tmp_path: Path,
    rosterd_up: StartUp,
) -> None:
    # The stand-in (mode stall-alone) hangs the request whose prompt is "stall" while its
    # /slots counters move on every look, as another slot's generation does: a real
    # llama-server cannot be made to stall one slot on demand. Short windows, so that the
    # check has judged the backend before the first-byte cap.
    fleet, env = stand_in(tmp_path, {"busy": ["--mode", "stall-alone"]})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("busy", "busy", 0.1, 18744)])
    flags = ["--probe-interval", "0", "--progress-check-after", "1", "--progress-window", "2"]
    flags += ["--first-byte-timeout", "5"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags], env=env)
    try:
        wait_resident(up, {"busy"})
        old_pid = role_info(up, "busy")["pid"]
        began = time.monotonic()
        cut = post(up, {"model": "busy", "prompt": "stall", "max_tokens": 1})
        assert cut.status_code == 504, cut.text
        assert cut.json()["error"]["code"] == "backend_timeout"
        assert "only this one was cut" in cut.json()["error"]["message"]
        assert time.monotonic() - began < 10
        served = post(up, {"model": "busy", "prompt": "hi", "max_tokens": 1})
        assert served.status_code == 200, served.text
        assert role_info(up, "busy")["pid"] == old_pid  # not restarted
        assert "unhealthy" not in event_kinds(up, "busy")
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_long_prefill_that_progresses_is_not_cut(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("gemma", "gemma-3-270m", 0.5, 18742)]
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"gemma-3-270m": {"path": str(GEMMA), "ctx_size": 8192}}
    )
    # Looks from 1 s of quiet on, and a window (18 s) shorter than the prefill: a look that
    # saw no progress would cut it. llama-server moves its counters once per 2,048-token
    # batch, about 10-13 s apart for gemma-3-270m on two cores.
    flags = ["--probe-interval", "0", "--progress-check-after", "1", "--progress-window", "18"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags])
    try:
        wait_resident(up, {"gemma"})
        prompt = "The quick brown fox jumps over the lazy dog. " * 500  # ~5,000 tokens
        began = time.monotonic()
        answer = post(up, {"model": "gemma", "prompt": prompt, "max_tokens": 4}, timeout_s=300)
        took_s = time.monotonic() - began
        assert answer.status_code == 200, answer.text
        prompt_tokens = answer.json()["usage"]["prompt_tokens"]
        # Here 23-24 s: quiet longer than the first look plus the window, so the looks saw
        # the counters move (a faster machine proves less, and cuts nothing either).
        print(f"prefill of {prompt_tokens} tokens answered after {took_s:.1f} s, not cut")
        assert prompt_tokens > 4096  # more than two 2,048-token batches: counters moved
        assert "unhealthy" not in event_kinds(up, "gemma")
        assert role_info(up, "gemma")["pid"] is not None
    finally:
        assert up.stop(signal.SIGINT) == 0
