"""The node-wide limit on generations at once, on the pure node state machine.

Driven as ``test_scheduler.py`` drives the machine: synchronous calls, an
explicit ``now``, the effects recorded by ``Bench``; no test sleeps. The same
limit on real llama-server processes is in ``test_up_node_limit.py``.
"""

from __future__ import annotations

import dataclasses

from rosterd.errors import QueueTimeoutError
from rosterd.scheduler.events import GrantLease, Reconfigure
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import NodeConcurrency, SchedulerLimits
from rosterd.spec import InferenceSpec
from support.node_bench import LIMITS, Bench, assert_failed, spec


class LimitedBench(Bench):
    """``Bench`` whose machine has a node-wide limit."""

    def __init__(
        self,
        specs: list[InferenceSpec],
        capacity_mib: int,
        concurrency: NodeConcurrency,
        limits: SchedulerLimits = LIMITS,
    ) -> None:
        super().__init__(specs, capacity_mib, limits)
        self.machine = NodeMachine(self.capacity, self.specs, limits, concurrency)

    def granted(self) -> list[int]:
        return [g.ticket for g in self.of(GrantLease)]

    def in_flight(self) -> int:
        return self.machine.node_running()

    def limit(self, now: float, concurrency: NodeConcurrency) -> None:
        """A reload that changes the node-wide limit only (one ``Reconfigure``)."""
        self.send(Reconfigure(now, self.machine.placed(), self.capacity, concurrency))


def both_ready(bench: LimitedBench) -> None:
    """Load a and b (a load takes no slot)."""
    for role in ("a", "b"):
        ticket = bench.acquire(role, take_slot=False)
        bench.settle()
        assert bench.lease(ticket) is not None


def test_two_four_slot_roles_under_a_limit_of_four_run_four_at_once() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=4)
    bench = LimitedBench(
        [spec("a", 100), spec("b", 100)],
        1000,
        NodeConcurrency(max_concurrency=4, slots={"a": 4, "b": 4}),
        limits,
    )
    both_ready(bench)
    tickets = []
    for i in range(8):  # a, b, a, b, ... one every second
        bench.now = float(i + 1)
        tickets.append(bench.acquire("ab"[i % 2]))
    assert bench.granted()[-4:] == tickets[:4]
    assert bench.in_flight() == 4
    assert not any(bench.answered(t) for t in tickets[4:])
    # Each release hands the node's free slot to the oldest waiter, whatever its role.
    for done, expected in zip(tickets[:4], tickets[4:], strict=True):
        bench.now += 1.0
        bench.release(done)
        assert bench.granted()[-1] == expected
        assert bench.in_flight() == 4


def test_the_oldest_waiter_of_the_node_gets_a_freed_slot_first() -> None:
    bench = LimitedBench(
        [spec("a", 100), spec("b", 100)],
        1000,
        NodeConcurrency(max_concurrency=1, slots={"a": 1, "b": 1}),
    )
    both_ready(bench)
    bench.now = 1.0
    first = bench.acquire("a")
    bench.now = 2.0
    waits_b = bench.acquire("b")  # older than the next request for a
    bench.now = 3.0
    waits_a = bench.acquire("a")
    assert bench.lease(first) is not None
    assert not bench.answered(waits_b)
    assert not bench.answered(waits_a)
    bench.now = 4.0
    bench.release(first)
    assert bench.lease(waits_b) is not None  # not a's newer request, though a sorts first
    assert not bench.answered(waits_a)
    bench.release(waits_b)
    assert bench.lease(waits_a) is not None


def test_default_limit_is_the_sum_of_the_resident_roles_slots() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=8)
    bench = LimitedBench(
        [spec("a", 100), spec("b", 100)], 1000, NodeConcurrency(slots={"a": 2, "b": 3}), limits
    )
    ticket = bench.acquire("a", take_slot=False)
    bench.settle()
    assert bench.lease(ticket) is not None
    assert bench.machine.node_limit() == 2  # only a holds memory
    tickets = [bench.acquire("a") for _ in range(4)]
    assert bench.in_flight() == 2
    assert [bench.answered(t) for t in tickets] == [True, True, False, False]
    loads_b = bench.acquire("b", take_slot=False)
    bench.settle()
    assert bench.lease(loads_b) is not None
    assert bench.machine.node_limit() == 5  # a's 2 slots and b's 3
    assert all(bench.answered(t) for t in tickets)  # b's load freed room for a's waiters
    assert bench.in_flight() == 4


def test_per_role_limit_still_holds_inside_the_node_limit() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=2)
    bench = LimitedBench(
        [spec("a", 100), spec("b", 100)], 1000, NodeConcurrency(max_concurrency=10), limits
    )
    both_ready(bench)
    tickets = [bench.acquire("a") for _ in range(3)]
    assert [bench.answered(t) for t in tickets] == [True, True, False]


def test_a_request_waiting_on_the_node_limit_times_out_saying_so() -> None:
    bench = LimitedBench([spec("a", 100), spec("b", 100)], 1000, NodeConcurrency(max_concurrency=1))
    both_ready(bench)
    held = bench.acquire("a")
    waiting = bench.acquire("b", timeout_s=2.0)
    assert bench.lease(held) is not None
    bench.at(3.0)
    message = assert_failed(bench, waiting, QueueTimeoutError)
    assert "max_concurrency" in message


def test_a_reload_that_raises_the_node_limit_lets_waiters_in_at_once() -> None:
    bench = LimitedBench(
        [spec("a", 100), spec("b", 100)],
        1000,
        NodeConcurrency(max_concurrency=1, slots={"a": 4, "b": 4}),
    )
    both_ready(bench)
    bench.now = 1.0
    running = bench.acquire("a")
    waiting = [bench.acquire("a"), bench.acquire("b")]
    assert bench.granted()[-1] == running
    assert not any(bench.answered(t) for t in waiting)
    # The fleet's max_concurrency is removed: the limit is the roles' slots (8).
    bench.limit(2.0, NodeConcurrency(None, {"a": 4, "b": 4}))
    assert bench.granted()[-2:] == waiting
    assert bench.in_flight() == 3


def test_a_reload_that_lowers_the_node_limit_lets_running_leases_finish() -> None:
    bench = LimitedBench([spec("a", 100)], 1000, NodeConcurrency(max_concurrency=2, slots={"a": 4}))
    both_ready_a = bench.acquire("a", take_slot=False)
    bench.settle()
    assert bench.lease(both_ready_a) is not None
    bench.now = 1.0
    first, second = bench.acquire("a"), bench.acquire("a")
    bench.limit(2.0, NodeConcurrency(max_concurrency=1, slots={"a": 4}))
    assert bench.in_flight() == 2  # nothing is cut
    third = bench.acquire("a")
    bench.release(first)
    assert not bench.answered(third)  # still one over the new limit of one
    bench.release(second)
    assert bench.granted()[-1] == third


def test_a_role_holds_no_more_leases_than_its_backends_slots() -> None:
    # A one-slot llama.cpp role under --max-concurrency 4: one request goes to the
    # backend, the rest wait in rosterd's queue (issue 22).
    concurrency = NodeConcurrency(None, {"a": 1}, {"a": 1})
    bench = LimitedBench([spec("a", 100)], 1000, concurrency)
    tickets = [bench.acquire("a") for _ in range(3)]
    bench.settle()
    assert bench.granted() == tickets[:1]
    view = bench.machine.role_snapshot("a", bench.now)
    assert (view.running, view.queued) == (1, 2)
    assert "the backend's 1 parallel slot(s)" in str(view.waiting_reason)
    bench.release(tickets[0])
    assert bench.granted() == tickets[:2]
