"""Progress, not a clock, tells a wedged backend: ``rosterd up`` asks a quiet llama-server
role's ``/slots`` (``--progress-check-after``), on real processes and real HTTP.

- A wedged backend is found in seconds: the stand-in (``tests/support/fake_backend.py``, mode
  ``wedge-once``) stands in for a wedged llama-server, which cannot be made to hang on
  demand: its ``/health`` says 200 while its completions, ``/slots`` and ``/metrics``
  hang, as llama-server's main loop does when it is stuck. The first-byte deadline stays
  at its default (300 s): only the progress check can end the request.
- A long prefill that progresses is not cut: the real gemma-3-270m on a prompt of
  thousands of tokens, quiet for tens of seconds before its first byte, looked at all
  the while.
"""

from __future__ import annotations

import signal
import time
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
