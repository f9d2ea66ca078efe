"""Turns under contention, on the pure node machine (issue 22).

Two roles that cannot be resident together, both with queued requests: the
resident one serves its own queue until the other's oldest request has waited
``max_wait_s`` since the turn began, or until its queue is empty; an
interactive request keeps its precedence. The runs are simulated
(``support.turns.simulate``: simulated time, nothing sleeps), over fixed and
random (hypothesis) arrivals.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.scheduler.values import SchedulerLimits
from support.node_bench import LIMITS, Bench, spec
from support.turns import Outcome, Request, simulate

LOAD_S, STOP_S = 0.5, 0.1
TURNS = SchedulerLimits(
    max_concurrency=1,
    max_queue=1000,
    queue_timeout_s=3600.0,
    drain_s=3.0,
    idle_ttl_s=math.inf,
    min_busy_residency_s=1.0,
    max_wait_s=5.0,
    tick_s=0.25,
    probe_interval_s=math.inf,
)


def backlog(n_each: int, service_s: float) -> list[Request]:
    """``n_each`` requests of each role, all there from the start (a before b)."""
    return [Request(0.0, "a", service_s) for _ in range(n_each)] + [
        Request(0.001, "b", service_s) for _ in range(n_each)
    ]


def test_a_resident_role_serves_its_queue_until_the_other_waited_max_wait() -> None:
    outcome = simulate(backlog(20, 0.5), TURNS, load_s=LOAD_S, stop_s=STOP_S)
    assert not outcome.failures
    first = outcome.swaps[0]
    assert first.role == "a"
    # a served its queue for b's max_wait (5 s), then drained its one request in flight.
    assert TURNS.max_wait_s <= first.at <= TURNS.max_wait_s + 0.5 + TURNS.tick_s
    assert first.own_queue > 0  # the turn ended by time, not by an empty queue


def test_without_turns_every_request_of_the_other_role_forces_a_swap() -> None:
    # Plain FIFO (the hold at once, no min residency): the same backlog interleaved
    # a, b, a, b swaps on almost every request; turns swap a handful of times.
    interleaved = [Request(i * 0.01, "ab"[i % 2], 0.5) for i in range(40)]
    fifo = dataclasses.replace(TURNS, max_wait_s=0.0, min_busy_residency_s=0.0)
    plain = simulate(interleaved, fifo, load_s=LOAD_S, stop_s=STOP_S)
    turns = simulate(interleaved, TURNS, load_s=LOAD_S, stop_s=STOP_S)
    assert len(plain.swaps) >= 30
    assert len(turns.swaps) <= 6
    assert not plain.failures
    assert not turns.failures


def test_an_interactive_request_does_not_wait_for_a_batch_turn() -> None:
    # a's requests came first: a serves them in arrival order while b waits, as before
    # turns; an interactive b has a cut them after --drain (3 s), a batch b waits for
    # a's turn (5 s), then a's request in flight.
    requests = [Request(0.0, "a", 0.5) for _ in range(20)] + [Request(1.0, "b", 0.5)]
    voice = simulate(requests, TURNS, load_s=LOAD_S, stop_s=STOP_S, interactive=frozenset({"b"}))
    batch = simulate(requests, TURNS, load_s=LOAD_S, stop_s=STOP_S)
    assert voice.swaps[0].at <= 1.0 + TURNS.drain_s + TURNS.tick_s
    assert voice.waits[21] <= TURNS.drain_s + STOP_S + LOAD_S + TURNS.tick_s
    assert batch.swaps[0].at >= 1.0 + TURNS.max_wait_s
    assert batch.cut == 0


def test_an_idle_resident_role_yields_at_once_to_a_batch_request() -> None:
    requests = [Request(0.0, "a", 0.2), Request(1.0, "b", 0.2), Request(2.0, "a", 0.2)]
    outcome = simulate(requests, TURNS, load_s=LOAD_S, stop_s=STOP_S)
    assert [s.at for s in outcome.swaps] == [1.0, 2.0]  # no min residency, no turn: idle
    assert max(outcome.waits.values()) <= STOP_S + LOAD_S + 1e-9


arrivals = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=60.0),
        st.sampled_from(("a", "b")),
        st.floats(min_value=0.05, max_value=2.0),
    ),
    min_size=1,
    max_size=30,
)


def run(drawn: list[tuple[float, str, float]], limits: SchedulerLimits) -> Outcome:
    requests = [Request(at, role, service) for at, role, service in sorted(drawn)]
    return simulate(requests, limits, load_s=LOAD_S, stop_s=STOP_S)


def turn_allowing_timeout_s(drawn: list[tuple[float, str, float]]) -> float:
    """A queue timeout the turns allow for these arrivals: the other role's turn and
    drain, every request's service and a swap per request, and a tick of slack each."""
    work = sum(service for _, _, service in drawn)
    per_swap = LOAD_S + STOP_S + TURNS.min_busy_residency_s + 2 * TURNS.tick_s
    return TURNS.max_wait_s + TURNS.drain_s + work + (len(drawn) + 1) * per_swap


@settings(max_examples=150, deadline=None)
@given(arrivals)
def test_no_request_waits_past_its_queue_timeout_when_the_turns_allow_it(
    drawn: list[tuple[float, str, float]],
) -> None:
    timeout_s = turn_allowing_timeout_s(drawn)
    outcome = run(drawn, dataclasses.replace(TURNS, queue_timeout_s=timeout_s))
    assert not outcome.failures
    assert len(outcome.waits) == len(drawn)
    assert max(outcome.waits.values()) <= timeout_s
    # (a lease may be cut: a role with no queue gets no turn, and drains from the
    # waiting request's arrival, as before turns)


@settings(max_examples=150, deadline=None)
@given(arrivals)
def test_swaps_are_bounded_by_the_arrivals_and_each_ends_a_turn(
    drawn: list[tuple[float, str, float]],
) -> None:
    outcome = run(drawn, TURNS)
    assert len(outcome.swaps) <= len(drawn)
    for swap in outcome.swaps:
        # a role stops for the other with requests older than the other's still queued
        # only once the other's oldest request waited its max_wait; what came after its
        # queue ran dry waits for its next turn
        assert swap.own_older == 0 or swap.other_waited_s >= TURNS.max_wait_s, swap


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=5, max_value=40),
    st.floats(min_value=0.2, max_value=1.5),
    st.floats(min_value=1.0, max_value=10.0),
)
def test_under_a_backlog_swaps_are_bounded_by_max_wait(
    n_each: int, service_s: float, max_wait_s: float
) -> None:
    limits = dataclasses.replace(TURNS, max_wait_s=max_wait_s)
    outcome = simulate(backlog(n_each, service_s), limits, load_s=LOAD_S, stop_s=STOP_S)
    assert not outcome.failures
    # every turn but the last of each role lasts max_wait (its queue stays full)
    assert len(outcome.swaps) <= math.ceil(outcome.end_s / max_wait_s) + 2


def test_a_request_waiting_for_a_turn_is_told_whose_and_until_when() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1, max_wait_s=30.0)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    first = bench.acquire("x")
    bench.settle()
    bench.acquire("x")  # x has work queued: it keeps its turn
    bench.now = 10.0
    y = bench.acquire("y")
    reason = str(bench.machine.role_snapshot("y", bench.now).waiting_reason)
    assert "x serves its turn 30 s more at most (--max-wait)" in reason, reason
    bench.at(25.0)
    reason = str(bench.machine.role_snapshot("y", bench.now).waiting_reason)
    assert "x serves its turn 15 s more at most (--max-wait)" in reason, reason
    bench.at(40.0)  # y's turn wait is over: x drains, and says when it is cut
    reason = str(bench.machine.role_snapshot("y", bench.now).waiting_reason)
    assert "x drains; its requests are cut in 5 s (--drain)" in reason, reason
    bench.at(45.0)
    bench.release(first)
    bench.settle()
    assert bench.lease(y) is not None
