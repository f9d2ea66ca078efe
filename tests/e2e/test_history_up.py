"""The charts' history on a real ``rosterd up``: at a shortened ``--history-interval``
every series fills to its 360 points, stays there, and rosterd's RSS stays flat.

The example lab runs with its real llama-server backends; requests to its tiny
``voice-lite`` role (bounded in count, to this machine only) fill the traffic series
while the history is sampled fifty times a second: one window of 360 points in about
seven seconds, so three windows are three hours of history at the default interval.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from support.backends import pick_free_port
from support.up import EXAMPLE_LAB, Up, prepare_example_models, start_up, wait_resident

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02
POINTS = 360
#: How much rosterd's RSS may grow from one full window to two windows later, bytes: the
#: history itself is bounded (tests/router/test_history.py measures it flat); this leaves room
#: for the allocator's and the HTTP stack's own jitter, far below a window's worth of
#: unbounded growth at this rate (about 40 series of 360 points each window).
RSS_SLACK_BYTES = 6 * 2**20


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, llama_server_binary: Path) -> Iterator[Up]:
    prepare_example_models()
    tmp = tmp_path_factory.mktemp("history-up")
    running = start_up([*EXAMPLE_LAB, "--history-interval", str(INTERVAL_S)], tmp, pick_free_port())
    try:
        yield running
    finally:
        code = running.stop()
        assert code == 0, running.output()


def _traffic_for(client: httpx.Client, seconds: float) -> int:
    """Chat requests to voice-lite, one after another, for ``seconds``; how many."""
    body = {"model": "voice-lite", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sent < 2000:
        client.post("/v1/chat/completions", json=body).raise_for_status()
        sent += 1
        time.sleep(0.01)
    return sent


def test_every_series_fills_and_rosterd_rss_stays_flat(up: Up) -> None:
    wait_resident(up, {"voice-lite", "chat-small"}, timeout_s=120)
    window_s = INTERVAL_S * POINTS
    process = psutil.Process(up.proc.pid)
    with httpx.Client(base_url=up.url, timeout=60, trust_env=False) as client:
        assert _traffic_for(client, window_s * 1.2) > 10
        full = client.get("/rosterd/history").json()
        assert len(full["t"]) == POINTS
        rss_full = process.memory_info().rss
        _traffic_for(client, window_s * 2)
        later = client.get("/rosterd/history").json()
        rss_later = process.memory_info().rss
    assert later["t"][0] > full["t"][-1]  # a whole new window
    assert len(later["t"]) == POINTS
    local = later["nodes"]["local"]
    assert len(local["capacity_bytes"]) == POINTS
    for role in ("voice-lite", "chat-small"):
        assert len(local["roles"][role]) == POINTS
        assert all(v for v in local["roles"][role])  # resident the whole window
    for role, series in later["roles"].items():
        for name, values in series.items():
            assert len(values) == POINTS, (role, name)
    voice = later["roles"]["voice-lite"]
    assert max(voice["requests_per_s"]) > 0
    assert max(voice["tokens_per_s"]) > 0
    assert any(v is not None for v in voice["queue_wait_p95_s"])
    growth = rss_later - rss_full
    print(f"rosterd RSS: {rss_full / 2**20:.1f} MiB full, {rss_later / 2**20:.1f} MiB later")
    assert growth < RSS_SLACK_BYTES, growth
