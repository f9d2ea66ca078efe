"""The idle generation probe tells a busy backend from a wedged one (issue 33).

A client that gives up in the middle of a long prefill leaves llama-server prefilling
until the end of its batch (2,048 tokens: tens of seconds on a busy CPU): the probe that
follows gets no answer in time. Before calling the role unhealthy it looks at the
backend's ``/slots``: an answer that changes is a busy backend, left alone; a stand-in
whose ``/slots`` does not answer (``tests/support/fake_backend.py``'s ``wedge-once``,
for what llama-server cannot be made to do here) is still restarted. Real llama-server
with the example's chat-small (SmolLM2-135M-Instruct); short probe flags so that it shows
in seconds.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from support.polling import eventually_sync
from support.up import (
    SMOLLM2,
    StartUp,
    event_kinds,
    llama_entry,
    prepare_example_models,
    role_info,
    stand_in,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

#: Seconds between probes of an idle role and a probe's own deadline: the backend is busy
#: far longer than both after the client left.
PROBE_FLAGS = ["--probe-interval", "2", "--probe-timeout", "2"]


def slot_busy(base_url: str) -> bool:
    """Whether the backend's one slot is processing (llama-server's ``/slots``)."""
    answer = httpx.get(base_url + "/slots", timeout=30, trust_env=False)
    slots = answer.json()
    assert isinstance(slots, list), f"/slots answered {answer.status_code}: {answer.text}"
    return bool(slots[0]["is_processing"])


def test_a_backend_prefilling_for_a_client_that_left_is_not_restarted(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    prepare_example_models()
    entry = llama_entry("chat-small", "SmolLM2-135M-Instruct", 0.5, 18741)
    roster = write_roster(tmp_path / "roster.yaml", [entry])
    model = {"path": str(SMOLLM2), "ctx_size": 8192}
    fleet = write_box_fleet(tmp_path / "fleet.yaml", {"SmolLM2-135M-Instruct": model})
    # The progress window must be wider than one batch of prefill on a loaded CPU.
    flags = [*PROBE_FLAGS, "--progress-window", "150"]
    up = rosterd_up([str(roster), "--fleet", str(fleet), *flags])
    wait_resident(up, {"chat-small"})
    info = role_info(up, "chat-small")
    pid, base_url = info["pid"], str(info["base_url"])
    assert isinstance(pid, int)
    prompt = " ".join(f"word{i} apple" for i in range(1500))  # about 3,500 tokens
    with pytest.raises(httpx.TimeoutException):  # the client gives up mid-prefill
        httpx.post(
            up.url + "/v1/completions",
            json={"model": "chat-small", "prompt": prompt, "max_tokens": 8},
            timeout=3,
            trust_env=False,
        )
    left_at = time.monotonic()
    eventually_sync(
        lambda: not slot_busy(base_url),
        what="the backend done with the abandoned prompt",
        timeout_s=240.0,
        interval_s=1.0,
    )
    busy_s = time.monotonic() - left_at
    print(f"the backend prefilled {busy_s:.1f} s after the client left")
    # A probe fell into the busy spell: one is due 2 s after the role went idle.
    assert busy_s > 6.0
    time.sleep(5.0)  # a probe of the idle backend, and the verdict of the busy one, passed
    kinds = event_kinds(up, "chat-small")
    assert "unhealthy" not in kinds
    assert "restarted" not in kinds
    assert role_info(up, "chat-small")["pid"] == pid
    assert "passes: busy: no answer within 2 s, but its slots answer changed" in up.output()
    served = httpx.post(
        up.url + "/v1/completions",
        json={"model": "chat-small", "prompt": "Hello", "max_tokens": 2},
        timeout=60,
        trust_env=False,
    )
    assert served.status_code == 200, served.text
    assert up.stop(signal.SIGINT) == 0


def test_an_idle_backend_whose_slots_do_not_answer_is_still_restarted(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    marker = tmp_path / "wedged-once"
    fleet, env = stand_in(tmp_path, {"hang": ["--mode", "wedge-once", "--marker", str(marker)]})
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("hang", "hang", 0.1, 18742)])
    up = rosterd_up([str(roster), "--fleet", str(fleet), *PROBE_FLAGS], env=env)
    wait_resident(up, {"hang"})
    pid = role_info(up, "hang")["pid"]
    eventually_sync(
        lambda: {"unhealthy", "restarted"} <= set(event_kinds(up, "hang")),
        what="hang found unhealthy by its idle probe and restarted",
        timeout_s=30.0,
        interval_s=0.2,
    )
    assert role_info(up, "hang")["pid"] not in (None, pid)
    assert "slots answer did not come" in str(role_info(up, "hang")["last_error"])
    assert up.stop(signal.SIGINT) == 0
