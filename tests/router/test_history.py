"""The charts' history (``rosterd.router.history``): every series fills, none grows past its
bound, and what it keeps does not grow with uptime.

These drive :class:`History` as the router does (requests granted and finished, load and
stop events, a point closed per interval) with a made-up clock: the history is plain
state, and an hour of points at a shortened interval is what ``rosterd up
--history-interval`` would reach in that hour. ``test_history_up`` checks the same on a
real ``rosterd up``.
"""

from __future__ import annotations

import gc
import tracemalloc

from rosterd.router.history import (
    HISTORY_POINTS,
    MAX_MARKS,
    ROLE_SERIES,
    History,
    generated_tokens,
    nearest_rank,
)
from rosterd.scheduler.values import SchedulerEvent

GIB = 2**30


def _nodes(step: int) -> dict[str, dict[str, object]]:
    """Two nodes; on ``a``, ``chat`` always holds memory and ``scratch`` every other point."""
    scratch = "ready" if step % 2 else "stopped"
    return {
        "a": {
            "capacity_bytes": 8 * GIB,
            "roles": {
                "chat": {"phase": "ready", "resident_bytes": GIB},
                "scratch": {"phase": scratch, "resident_bytes": GIB // 2},
            },
        },
        "b": {
            "capacity_bytes": 4 * GIB,
            "roles": {"voice": {"phase": "loading", "resident_bytes": GIB // 4}},
        },
    }


def _event(at: float, kind: str, role: str) -> SchedulerEvent:
    return SchedulerEvent(at, "a", kind, role, "evicted for chat: make room", (role,), GIB)


def _traffic(history: History, step: int, at: float) -> None:
    for i in range(5):
        history.request_granted("chat", waited_s=0.01 * i)
        history.request_done("chat", tokens=20)
    history.request_granted("voice", waited_s=1.5)
    history.request_done("voice", tokens=0)
    history.hear(_event(at, "loaded" if step % 2 else "stopped", "scratch"))
    history.hear(_event(at, "crashed", "scratch"))  # not a mark


def _run(history: History, steps: int, start: float = 1_000_000.0) -> float:
    at = start
    for step in range(steps):
        at += history.interval_s
        _traffic(history, step, at)
        history.sample(at, _nodes(step))
    return at


def test_every_series_fills_and_stays_at_its_bound() -> None:
    history = History(interval_s=0.05)
    _run(history, 3 * HISTORY_POINTS)
    data = history.as_json()
    assert data["points"] == HISTORY_POINTS
    times = data["t"]
    assert isinstance(times, list)
    assert len(times) == HISTORY_POINTS
    assert times == sorted(times)
    nodes = data["nodes"]
    assert isinstance(nodes, dict)
    assert set(nodes) == {"a", "b"}
    assert set(nodes["a"]["roles"]) == {"chat", "scratch"}
    assert nodes["a"]["capacity_bytes"] == [8 * GIB] * HISTORY_POINTS
    assert nodes["a"]["roles"]["chat"] == [GIB] * HISTORY_POINTS
    scratch = nodes["a"]["roles"]["scratch"]
    assert None in scratch
    assert GIB // 2 in scratch
    roles = data["roles"]
    assert isinstance(roles, dict)
    assert set(roles) == {"chat", "scratch", "voice"}
    chat = roles["chat"]
    assert set(chat) == set(ROLE_SERIES)
    assert all(len(values) == HISTORY_POINTS for values in chat.values())
    # 5 requests of 20 tokens each per 0.05 s interval.
    assert chat["requests_per_s"][-1] == 100.0
    assert chat["tokens_per_s"][-1] == 2000.0
    assert chat["queue_wait_p50_s"][-1] == 0.02
    assert chat["queue_wait_p95_s"][-1] == 0.04
    assert roles["voice"]["queue_wait_p95_s"][-1] == 1.5
    assert roles["scratch"]["queue_wait_p50_s"][-1] is None  # no request: no wait
    assert roles["scratch"]["requests_per_s"][-1] == 0.0
    marks = data["marks"]
    assert isinstance(marks, list)
    assert {m["kind"] for m in marks} == {"loaded", "stopped"}
    # Marks are kept while inside the window, and never more than MAX_MARKS.
    assert len(marks) <= min(MAX_MARKS, HISTORY_POINTS + 1)
    assert min(m["at"] for m in marks) >= times[0] - history.interval_s
    assert max(history.lengths()) == HISTORY_POINTS


def test_the_memory_it_keeps_does_not_grow_with_uptime() -> None:
    history = History(interval_s=0.05)
    tracemalloc.start()
    try:
        at = _run(history, 2 * HISTORY_POINTS)  # full: every ring buffer at its bound
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        _run(history, 2 * HISTORY_POINTS, start=at)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Two more windows of points: what is kept is the same size (a few KiB of slack for
    # the allocator's own pools and the last point's dicts).
    assert after - before < 64 * 1024, after - before


def test_a_role_gone_for_the_whole_window_is_dropped() -> None:
    history = History(interval_s=1.0, points=10)
    at = 0.0
    for _ in range(5):
        at += 1.0
        history.sample(at, _nodes(1))
    gone = {"a": {"capacity_bytes": 8 * GIB, "roles": {}}}
    for _ in range(10):
        at += 1.0
        history.sample(at, gone)
    data = history.as_json()
    assert data["nodes"] == {"a": {"capacity_bytes": [8 * GIB] * 10, "roles": {}}}
    assert data["roles"] == {}


def test_a_point_is_one_column_of_the_history() -> None:
    history = History(interval_s=2.0)
    history.request_granted("chat", 0.5)
    history.request_done("chat", 7)
    history.hear(_event(5.0, "loaded", "chat"))
    point = history.sample(10.0, _nodes(0))
    assert point["t"] == 10.0
    assert point["nodes"] == {
        "a": {"capacity_bytes": 8 * GIB, "roles": {"chat": GIB}},
        "b": {"capacity_bytes": 4 * GIB, "roles": {"voice": GIB // 4}},
    }
    roles = point["roles"]
    assert isinstance(roles, dict)
    assert roles["chat"] == {
        "requests_per_s": 0.5,
        "tokens_per_s": 3.5,
        "queue_wait_p50_s": 0.5,
        "queue_wait_p95_s": 0.5,
    }
    assert [m["role"] for m in point["marks"]] == ["chat"]  # type: ignore[attr-defined]
    assert history.sample(12.0, _nodes(0))["marks"] == []  # each mark goes out once
    assert [n for n, _ in history.recent] == [1, 2]


def test_generated_tokens_come_from_what_the_backend_reports() -> None:
    usage = b'{"choices":[],"usage":{"completion_tokens":12,"prompt_tokens":3}}'
    assert generated_tokens(usage) == 12
    stream_end = (
        b'data: {"choices":[{"delta":{}}],"timings":{"predicted_n":9}}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":10}}\n\ndata: [DONE]\n\n'
    )
    assert generated_tokens(stream_end) == 10
    assert generated_tokens(b'data: {"timings":{"predicted_n":9}}\n\n') == 9
    assert generated_tokens(b'{"done":true,"eval_count":4}\n') == 4  # Ollama's own API
    assert generated_tokens(b'{"data":[{"embedding":[0.1]}]}') == 0


def test_nearest_rank_quantiles() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert nearest_rank(values, 0.5) == 50.0
    assert nearest_rank(values, 0.95) == 95.0
    assert nearest_rank([3.0], 0.95) == 3.0
