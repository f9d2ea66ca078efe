"""The scheduler's rules, on the pure node state machine with the real residency policy.

Each test drives ``NodeMachine`` with synchronous calls and an explicit ``now``
and reads the effects it returns, recorded by ``Bench`` (nothing is faked but
the backends' answers, which the test gives as ``LoadDone``/``StopDone``
events). No test sleeps. The same promises are checked on the asyncio loop in
``test_scheduler_node.py`` and against real llama-server processes in
``test_up_budget.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from rosterd.backends.values import Endpoint
from rosterd.errors import (
    LoadBackoffError,
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    ShuttingDownError,
)
from rosterd.scheduler.events import (
    BackendChanged,
    Cancel,
    Effect,
    Event,
    FailWaiter,
    FinishShutdown,
    FinishUnload,
    LoadDone,
    LogNote,
    NodeLost,
    RecordEvent,
    RevokeLeases,
    Shutdown,
    StartBackend,
    StopBackend,
    UpdateGauges,
)
from rosterd.scheduler.transition import REVOKE_WAIT_S
from rosterd.scheduler.values import Phase, Revocation, client_reason
from support.node_bench import LIMITS, MIB, Bench, assert_failed, spec

# --------------------------------------------------------------------------- sharing


def test_concurrent_waiters_share_one_load() -> None:
    bench = Bench([spec("a", 100)], 1000)
    tickets = [bench.acquire("a") for _ in range(8)]
    assert bench.starts() == ["a"]
    bench.load_done("a")
    granted = [t for t in tickets if bench.lease(t)]
    assert granted == tickets[:4]  # max_concurrency, oldest first
    for t in granted:
        bench.release(t)
    assert all(bench.lease(t) for t in tickets)
    assert bench.starts() == ["a"]
    assert bench.of(UpdateGauges)[-1] == UpdateGauges("a", 4, 0)


def test_waiter_giving_up_does_not_cancel_the_load_for_others() -> None:
    bench = Bench([spec("a", 100)], 1000)
    quitter = bench.acquire("a")
    stayer = bench.acquire("a")
    bench.send(Cancel(bench.now, quitter, "a"))
    bench.load_done("a")
    assert not bench.answered(quitter)  # it left the queue: nothing is handed to it
    assert bench.lease(stayer) is not None
    assert bench.stops() == []
    assert bench.machine.resident() == ("a",)


# --------------------------------------------------------------------------- one transition


def test_swaps_are_serialized_and_memory_is_free_only_after_the_stop_returned() -> None:
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000)
    x = bench.acquire("x")
    y = bench.acquire("y")
    assert bench.starts() == ["x"]  # one transition at a time: y waits for x's load
    bench.load_done("x")
    bench.release(x)
    assert bench.stops() == ["x"]
    assert bench.starts() == ["x"]  # y's load waits until x's process exited
    assert bench.phase("x") == "stopping"
    bench.stop_done("x")
    assert bench.starts() == ["x", "y"]
    bench.load_done("y")
    assert bench.lease(y) is not None
    bench.release(y)
    for role in ["x", "y"] * 3:
        bench.use(role)
    assert bench.violations == []
    assert len(bench.pending) == 0
    for record in bench.of(RecordEvent):
        assert record.resident_bytes <= 1000 * MIB
        assert set(record.resident) != {"x", "y"}
    loading = bench.records("loading")[1]
    assert loading.role == "y"
    assert loading.resident == ("y",)


def test_a_role_in_use_is_not_evicted_until_released() -> None:
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000)
    x = bench.acquire("x")
    bench.settle()
    y = bench.acquire("y")
    bench.at(4.9)
    assert bench.stops() == []
    assert bench.machine.waiting_reason("y") is not None
    bench.release(x)
    bench.settle()
    assert bench.lease(y) is not None
    assert bench.stops() == ["x"]
    assert bench.records("stopped")[0].label == "make_room"


def test_a_busy_role_is_revoked_and_evicted_after_the_drain_time() -> None:
    limits = dataclasses.replace(LIMITS, drain_s=0.3)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    held = bench.acquire("x")
    bench.settle()
    generation = bench.lease(held).generation  # type: ignore[union-attr]
    y = bench.acquire("y")
    bench.at(0.29)
    assert bench.of(RevokeLeases) == []
    bench.at(0.3)
    revocation = Revocation("evicted", "role x was unloaded to make room for y after --drain 0.3 s")
    assert bench.of(RevokeLeases) == [RevokeLeases("x", generation, revocation)]
    assert bench.stops() == []  # the router ends the request first
    bench.release(held)  # what the router does on a revocation
    assert bench.stops() == ["x"]
    stopping = bench.records("stopping")[0]
    assert "1 request(s) in flight cut after --drain 0.3 s" in stopping.cause
    bench.settle()
    assert bench.lease(y) is not None
    assert bench.records("stopped")[0].label == "drain"


def test_a_revoked_lease_not_released_delays_the_stop_only_briefly() -> None:
    limits = dataclasses.replace(LIMITS, drain_s=0.3)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    held = bench.acquire("x")
    bench.settle()
    bench.acquire("y")
    bench.at(0.3)
    assert bench.of(RevokeLeases)
    bench.at(0.3 + REVOKE_WAIT_S / 2)
    assert bench.stops() == []
    bench.at(0.3 + REVOKE_WAIT_S)
    assert bench.stops() == ["x"]
    bench.settle()
    bench.release(held)  # a release of the stopped generation is ignored
    assert bench.machine.role_snapshot("x", bench.now).running == 0


def test_a_busy_role_drains_for_an_older_request_instead_of_starving_it() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1, drain_s=10.0)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    first = bench.acquire("x")
    bench.settle()
    bench.now = 1.0
    older = bench.acquire("x")  # queued behind the one slot, before y came
    bench.now = 2.0
    y = bench.acquire("y")
    bench.now = 3.0
    newer = bench.acquire("x")  # after y: x must drain instead of serving it
    bench.release(first)
    assert bench.lease(older) is not None
    bench.release(older)
    assert bench.lease(newer) is None
    assert bench.stops() == ["x"]
    bench.settle()
    assert bench.lease(y) is not None
    assert bench.lease(newer) is None  # x loads again after y is done with the room
    bench.release(y)
    bench.settle()
    assert bench.lease(newer) is not None
    assert bench.violations == []


# --------------------------------------------------------------------------- unload


def test_unload_takes_no_new_requests_and_loads_again_for_them_after() -> None:
    bench = Bench([spec("x", 100)], 1000)
    held = bench.acquire("x")
    bench.settle()
    unload = bench.unload("x")
    newer = bench.acquire("x")  # a slot is free, but an unload was asked
    assert not bench.answered(newer)
    assert bench.stops() == []  # the request in flight finishes first
    bench.release(held)
    assert bench.stops() == ["x"]
    assert FinishUnload(unload) not in bench.effects
    bench.stop_done("x")
    assert FinishUnload(unload) in bench.effects
    assert bench.records("stopped")[0].label == "unload"
    bench.settle()
    lease = bench.lease(newer)
    assert lease is not None
    assert lease.generation != bench.lease(held).generation  # type: ignore[union-attr]
    assert bench.starts() == ["x", "x"]


def test_unloading_a_role_that_is_not_resident_returns_at_once() -> None:
    bench = Bench([spec("x", 100)], 1000)
    ticket = bench.unload("x")
    assert bench.of(FinishUnload) == [FinishUnload(ticket)]
    assert bench.stops() == []


def test_unload_of_a_busy_role_revokes_its_leases_after_the_drain_time() -> None:
    limits = dataclasses.replace(LIMITS, drain_s=2.0)
    bench = Bench([spec("x", 100)], 1000, limits)
    bench.acquire("x")
    bench.settle()
    bench.unload("x")
    bench.at(1.9)
    assert bench.of(RevokeLeases) == []
    bench.at(2.0)
    [revoke] = bench.of(RevokeLeases)
    assert revoke.revocation.message == "role x was unloaded (rosterd unload) after --drain 2 s"


# --------------------------------------------------------------------------- residency


def test_an_idle_displaced_role_yields_at_once_whatever_it_displaced() -> None:
    # a, b, a, b one request at a time (one person, a chat model and a coder): min
    # residency used to make each swap back wait 10 s for nobody's benefit (issue 22).
    limits = dataclasses.replace(LIMITS, min_busy_residency_s=10.0)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000, limits)
    bench.use("x")
    bench.use("y")  # x was evicted for y, but y has no request in flight and none queued
    x = bench.acquire("x")
    assert bench.stops() == ["x", "y"]  # at the same instant: no wait for min residency
    bench.settle()
    assert bench.lease(x) is not None
    bench.release(x)
    y = bench.acquire("y")
    assert bench.stops() == ["x", "y", "x"]
    bench.settle()
    assert bench.lease(y) is not None


def test_a_just_loaded_role_with_work_is_protected_from_batch_ping_pong() -> None:
    limits = dataclasses.replace(LIMITS, min_busy_residency_s=0.5, max_concurrency=1)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000, limits)
    bench.use("x")
    first = bench.acquire("y")  # x was evicted for y: y holds against x while it has work
    bench.settle()
    x = bench.acquire("x")
    bench.now = 0.1
    second = bench.acquire("y")  # queued behind first (one slot), newer than x's request
    bench.now = 0.2
    bench.release(first)
    assert bench.lease(second) is not None  # still y's minimum residency: y serves on
    assert bench.stops() == ["x"]
    bench.now = 0.3
    bench.release(second)  # y has no work left: it yields before its 0.5 s are over
    assert bench.stops() == ["x", "y"]
    bench.settle()
    assert bench.lease(x) is not None


def test_the_first_swap_of_an_idle_role_does_not_wait_for_min_residency() -> None:
    limits = dataclasses.replace(LIMITS, min_busy_residency_s=10.0)
    specs = [spec("x", 600, sticky=False), spec("y", 600, sticky=False), spec("z", 600)]
    bench = Bench(specs, 1000, limits)
    bench.use("x")
    y = bench.acquire("y")
    assert bench.stops() == ["x"]  # at once: x displaced nobody, so nobody is held off
    bench.settle()
    assert bench.lease(y) is not None
    bench.release(y)
    z = bench.acquire("z")  # z was not evicted for y either: y goes at once too
    assert bench.stops() == ["x", "y"]
    bench.settle()
    assert bench.lease(z) is not None


def test_an_interactive_role_may_evict_a_just_loaded_batch_role() -> None:
    limits = dataclasses.replace(LIMITS, min_busy_residency_s=30.0)
    bench = Bench([spec("x", 600), spec("voice", 600, interactive=True)], 1000, limits)
    bench.use("x")
    voice = bench.acquire("voice")
    assert bench.stops() == ["x"]  # at once, same instant
    bench.settle()
    assert bench.lease(voice) is not None


def test_an_idle_non_sticky_batch_role_unloads_after_its_ttl_but_a_sticky_one_stays() -> None:
    limits = dataclasses.replace(LIMITS, idle_ttl_s=0.2)
    bench = Bench([spec("temp", 100, sticky=False), spec("keep", 100)], 1000, limits)
    bench.use("temp")
    bench.use("keep")
    bench.at(0.19)
    assert bench.stops() == []
    bench.at(0.2)
    assert bench.stops() == ["temp"]
    bench.settle()
    bench.at(100.0)
    assert bench.machine.resident() == ("keep",)
    [stopped] = bench.records("stopped")
    assert stopped.cause.startswith("idle")
    assert stopped.label == "idle_ttl"


# --------------------------------------------------------------------------- exclusions


def test_excluded_roles_swap_when_the_winner_is_idle() -> None:
    specs = [
        spec("scratch-a", 100, sticky=False, excludes=["scratch-b"]),
        spec("scratch-b", 100, sticky=False, excludes=["scratch-a"]),
    ]
    bench = Bench(specs, 1000)
    for role in ["scratch-a", "scratch-b", "scratch-a", "scratch-b"]:
        bench.use(role)
    assert bench.violations == []
    assert bench.starts() == ["scratch-a", "scratch-b", "scratch-a", "scratch-b"]
    assert {r.label for r in bench.records("stopped")} == {"exclusion"}


def test_a_batch_role_excluded_by_a_resident_interactive_role_is_refused() -> None:
    bench = Bench([spec("voice", 100, interactive=True, excludes=["b"]), spec("b", 100)], 1000)
    bench.use("voice")
    assert_failed(bench, bench.acquire("b"), RoleRefusedError, "voice")
    assert bench.records("refused")[0].role == "b"


@pytest.mark.parametrize(("busy", "waiting"), [("a", "b"), ("b", "a")])
def test_a_busy_exclusion_winner_yields_after_the_drain_time(busy: str, waiting: str) -> None:
    limits = dataclasses.replace(LIMITS, drain_s=0.3)
    bench = Bench([spec("a", 100, sticky=False, excludes=["b"]), spec("b", 100)], 1000, limits)
    held = bench.acquire(busy)
    bench.settle()
    ticket = bench.acquire(waiting)
    bench.at(0.2)
    assert bench.of(RevokeLeases) == []
    bench.at(0.3)
    [revoke] = bench.of(RevokeLeases)
    assert revoke.revocation.message == (
        f"role {busy} was unloaded for {waiting} (they exclude each other) after --drain 0.3 s"
    )
    bench.release(held)
    stopping = bench.records("stopping")[0]
    assert not stopping.cause.startswith("idle"), stopping.cause
    assert "--drain 0.3 s" in stopping.cause
    bench.settle()
    assert bench.lease(ticket) is not None
    assert bench.violations == []


# --------------------------------------------------------------------------- refusals and failures


def test_a_role_bigger_than_the_node_is_refused_with_numbers() -> None:
    bench = Bench([spec("huge", 2000)], 1000)
    assert_failed(bench, bench.acquire("huge"), RoleRefusedError, "GiB")
    assert bench.starts() == []


def test_a_failed_load_fails_every_waiter_and_frees_the_role() -> None:
    bench = Bench([spec("bad", 100)], 1000)
    tickets = [bench.acquire("bad") for _ in range(3)]
    error = "backend bad exited with code 1 before it was ready\nlast lines of /srv/logs/bad.log"
    bench.load_done("bad", error=error)
    for t in tickets:
        message = assert_failed(bench, t, LoadFailedError)
        assert message == (
            "backend for role 'bad' failed to load: backend bad exited with code 1 before it "
            "was ready; see `rosterd ps` / the backend log"
        )
    [failed] = bench.records("load_failed")
    assert failed.cause == error  # the full error stays in the log
    assert failed.resident == ()
    assert bench.stops() == ["bad"]  # a half-started process must not keep holding memory
    during_cleanup = bench.acquire("bad")
    assert bench.starts() == ["bad"]  # no new load before that stop returned
    bench.stop_done("bad")
    assert bench.starts() == ["bad"]  # nor during the backoff (0.5 s after one failure)
    backoff = bench.failure(during_cleanup)
    assert backoff is not None
    assert backoff.error is LoadBackoffError
    assert backoff.retry_after_s == pytest.approx(0.5)
    bench.at(0.5)
    bench.acquire("bad")
    assert bench.starts() == ["bad", "bad"]


def test_a_failed_load_tells_clients_the_backends_short_message_when_it_has_one() -> None:
    bench = Bench([spec("a", 100)], 1000)
    ticket = bench.acquire("a")
    bench._answer(StartBackend("a"))
    short = "port 8310 is in use by another process; stop it or give the role another port"
    long = "port 8310 on 127.0.0.1 is already in use by pid 13484 (llama-server -m x.gguf)"
    bench.send(LoadDone(bench.now, "a", error=long, client_message=short))
    message = assert_failed(bench, ticket, LoadFailedError)
    assert (
        message
        == f"backend for role 'a' failed to load: {short}; see `rosterd ps` / the backend log"
    )
    assert "pid 13484" in bench.records("load_failed")[0].cause


def test_a_warm_up_load_never_evicts() -> None:
    bench = Bench([spec("x", 600), spec("y", 600)], 1000)
    x = bench.acquire("x", take_slot=False, no_evict=True)
    bench.settle()
    assert bench.lease(x) is not None
    assert bench.records("loaded")[0].label == "warm-up"
    assert_failed(
        bench, bench.acquire("y", take_slot=False, no_evict=True), RoleRefusedError, "evict"
    )
    assert bench.machine.resident() == ("x",)
    gauges = [g for g in bench.of(UpdateGauges) if g.role == "x"]
    assert gauges[-1] == UpdateGauges("x", 0, 0)  # a warm-up takes no slot and left the queue


# --------------------------------------------------------------------------- queue


def test_a_full_queue_is_refused_at_once_and_waits_time_out() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1, max_queue=2, queue_timeout_s=0.3)
    bench = Bench([spec("a", 100)], 1000, limits)
    held = bench.acquire("a", timeout_s=0.3)
    bench.settle()
    waiting = [bench.acquire("a", timeout_s=0.3) for _ in range(2)]
    full = bench.failure(bench.acquire("a", timeout_s=0.3))
    assert full is not None
    assert full.error is QueueFullError
    assert full.retry_after_s is not None
    assert full.retry_after_s >= 1.0
    bench.at(0.29)
    assert not any(bench.answered(t) for t in waiting)
    bench.at(0.3)
    for t in waiting:
        message = assert_failed(
            bench, t, QueueTimeoutError, r"^role 'a' was not ready within 0.3 s"
        )
        assert bench.failure(t).retry_after_s is not None  # type: ignore[union-attr]
        assert message.endswith("(all 1 slot(s) are busy, --max-concurrency 1)")
    bench.release(held)


def test_the_concurrency_limit_hands_slots_over_in_order() -> None:
    bench = Bench([spec("a", 100)], 1000, dataclasses.replace(LIMITS, max_concurrency=1))
    first = bench.acquire("a")
    bench.settle()
    second = bench.acquire("a")
    third = bench.acquire("a")
    assert not bench.answered(second)
    bench.release(first)
    assert bench.lease(second) is not None
    assert not bench.answered(third)
    bench.release(second)
    assert bench.lease(third) is not None


def test_a_wait_reason_is_logged_once_while_it_lasts() -> None:
    # x was loaded recently and serves a steady trickle: y's wait reason flips between
    # "x has requests in flight" and "x loaded too recently" with every request.
    limits = dataclasses.replace(LIMITS, min_busy_residency_s=1.0, drain_s=30.0, max_concurrency=1)
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    bench.use("y")
    held = bench.acquire("x")  # y was evicted for x: x holds against y for 1 s, while busy
    bench.settle()
    y = bench.acquire("y")
    for step in range(1, 10):
        bench.now = step * 0.1
        following = bench.acquire("x")  # queued behind the one slot: x keeps its work
        bench.release(held)
        held = following
        assert bench.lease(held) is not None
        bench.at(step * 0.1 + 0.05)
    bench.at(1.0)
    bench.release(held)
    bench.settle()
    assert bench.lease(y) is not None
    waits = [n.message for n in bench.of(LogNote) if n.message.startswith("y waits: ")]
    assert 1 <= len(waits) <= 2, waits


# --------------------------------------------------------------------------- crashes


def test_a_crashed_role_waits_for_its_restart_then_serves_with_the_new_pid() -> None:
    bench = Bench([spec("a", 100)], 1000)
    old = bench.use("a")
    bench.send(BackendChanged(bench.now, "a", "exited", pid=111, exit_reason="was killed"))
    bench.send(BackendChanged(bench.now, "a", "restarting", pid=111))
    waiting = bench.acquire("a")
    assert not bench.answered(waiting)  # no 502 at once: it waits as for a load
    view = bench.machine.role_snapshot("a", bench.now)
    assert (view.phase, view.pid) == ("restarting", None)
    assert bench.machine.resident() == ("a",)  # the restart holds its memory
    bench.send(BackendChanged(bench.now, "a", "restart_failed", detail="not yet"))
    assert not bench.answered(waiting)  # the supervisor tries again
    bench.send(BackendChanged(bench.now, "a", "ready", pid=222))
    lease = bench.lease(waiting)
    assert lease is not None
    assert lease.endpoint == Endpoint("http://127.0.0.1:1/a", "a", 222)
    assert lease.generation != bench.lease(old).generation  # type: ignore[union-attr]
    assert bench.starts() == ["a"]  # the supervisor restarted it, not a new load
    assert [r.kind for r in bench.of(RecordEvent)][-2:] == ["crashed", "restarted"]
    assert bench.records("crashed")[0].cause == "backend pid 111 was killed; restarting"


def test_a_restart_given_up_fails_the_waiters_and_frees_the_role() -> None:
    bench = Bench([spec("a", 100)], 1000)
    bench.use("a")
    bench.send(BackendChanged(bench.now, "a", "exited", pid=111))
    waiting = bench.acquire("a")
    detail = "gave up: backend a exited with code 1\nlast lines of /var/x.log"
    bench.send(BackendChanged(bench.now, "a", "restart_failed", detail=detail, final=True))
    message = assert_failed(bench, waiting, LoadFailedError, "could not be restarted")
    assert "/var/x.log" not in message
    assert "rosterd ps" in message
    assert any("/var/x.log" in n.message for n in bench.of(LogNote))  # the detail is logged
    assert bench.machine.resident() == ()
    assert bench.phase("a") == Phase.STOPPED.value
    bench.use("a")  # a later request loads it again, as any role that is not resident
    assert bench.starts() == ["a", "a"]


def test_a_lost_node_marks_its_roles_lost_and_its_waiters_wait_until_their_timeout() -> None:
    bench = Bench([spec("a", 100), spec("b", 100), spec("c", 100)], 1000)
    held = bench.acquire("a")
    bench.settle()
    assert bench.lease(held) is not None
    loading = bench.acquire("b", timeout_s=10.0)  # its start is under way when the node goes
    assert bench.starts() == ["a", "b"]
    bench.now = 1.0
    reason = "node n is lost: its Ray node at 10.0.0.3 is no longer alive"
    out = bench.send(NodeLost(bench.now, reason))
    assert [(r.kind, r.role, r.cause) for r in bench.of(RecordEvent)][-3:] == [
        ("lost", "a", reason),
        ("lost", "b", reason),
        ("lost", "c", reason),
    ]
    assert not any(isinstance(e, FailWaiter | StartBackend | StopBackend) for e in out)
    assert {bench.phase(r) for r in "abc"} == {Phase.LOST.value}
    assert bench.machine.resident() == ()  # nothing of a lost node holds memory
    assert bench.machine.role_snapshot("a", bench.now).running == 0

    # The start that was under way fails with the node: ignored, nothing is asked again.
    bench.load_done("b", error="node n is lost")
    later = bench.acquire("c", timeout_s=10.0)  # a new request waits too (for the re-plan)
    bench.release(held)  # an old lease given back changes nothing
    bench.at(5.0)
    assert not bench.answered(loading)
    assert not bench.answered(later)
    assert bench.starts() == ["a", "b"]
    assert bench.pending == []  # no new work for the node
    view = bench.machine.role_snapshot("b", bench.now)
    assert view.waiting_reason == f"{reason}; waiting for it to be served elsewhere"
    # Backend events of the lost node (its agent reports them after the loss) change nothing.
    bench.send(BackendChanged(bench.now, "a", "restart_failed", final=True))
    assert not bench.answered(loading)

    bench.at(10.0)
    message = assert_failed(bench, loading, QueueTimeoutError, "was not ready within 10 s")
    assert reason in message
    assert not bench.answered(later)  # it came later: its own timeout
    unload = bench.unload("a")
    assert FinishUnload(unload) in bench.effects  # a lost role is not resident
    bench.send(Shutdown(bench.now))
    assert_failed(bench, later, ShuttingDownError)
    assert bench.of(FinishShutdown)  # nothing to stop on a lost node


def test_a_remote_backend_restarted_gives_no_pid_to_its_endpoint() -> None:
    bench = Bench([spec("a", 100)], 1000)
    bench.use("a")
    bench.send(BackendChanged(bench.now, "a", "exited", pid=111, pid_is_local=False))
    waiting = bench.acquire("a")
    bench.send(BackendChanged(bench.now, "a", "ready", pid=222, pid_is_local=False))
    lease = bench.lease(waiting)
    assert lease is not None
    assert lease.endpoint.pid is None  # 222 is a process of the node's machine, not ours
    assert bench.machine.role_snapshot("a", bench.now).pid is None


# --------------------------------------------------------------------------- shutdown


def test_shutdown_fails_waiters_drains_leases_then_stops_every_backend() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1, drain_s=2.0)
    bench = Bench([spec("a", 100), spec("b", 100)], 1000, limits)
    bench.use("b")
    held = bench.acquire("a")
    bench.settle()
    queued = bench.acquire("a")
    bench.send(Shutdown(bench.now))
    unload = bench.unload("b")  # answered once shutdown stopped it
    assert_failed(bench, queued, ShuttingDownError)
    assert bench.stops() == []  # a request in flight gets drain_s to finish
    assert_failed(bench, bench.acquire("b"), ShuttingDownError)
    bench.at(1.9)
    assert bench.stops() == []
    bench.at(2.0)
    [revoke] = bench.of(RevokeLeases)
    assert revoke.revocation == Revocation(
        "shutting_down", "rosterd is shutting down; role a was stopped after --drain 2 s"
    )
    bench.release(held)
    bench.settle()
    assert sorted(bench.stops()) == ["a", "b"]
    assert {r.label for r in bench.records("stopped")} == {"shutdown"}
    assert bench.effects[-2:] == [FinishUnload(unload), FinishShutdown()]
    assert bench.alive == set()


def test_a_second_signal_cuts_the_drain_and_says_when_it_really_was_cut() -> None:
    """A second Ctrl-C at 2 s of a 30 s drain cuts the request then, and its client is told
    so (it was told "after --drain 30 s" of a stream cut at 2 s)."""
    limits = dataclasses.replace(LIMITS, max_concurrency=1, drain_s=30.0)
    bench = Bench([spec("a", 100)], 1000, limits)
    held = bench.acquire("a")
    bench.settle()
    started = bench.now
    bench.send(Shutdown(bench.now))
    bench.at(started + 2.0)
    assert bench.stops() == []
    bench.send(Shutdown(bench.now, at_once=True))
    [revoke] = bench.of(RevokeLeases)
    assert revoke.revocation == Revocation(
        "shutting_down",
        "rosterd is shutting down; role a was stopped after 2.0 s of the drain: a second "
        "signal stopped it at once",
    )
    assert "--drain" not in revoke.revocation.message
    bench.release(held)
    bench.settle()
    assert bench.stops() == ["a"]


def test_shutdown_after_the_requests_finished_stops_at_once() -> None:
    bench = Bench([spec("a", 100)], 1000)
    held = bench.acquire("a")
    bench.settle()
    bench.send(Shutdown(bench.now))
    bench.release(held)
    assert bench.stops() == ["a"]  # no drain left to wait for
    bench.settle()
    assert bench.of(FinishShutdown) == [FinishShutdown()]


def test_shutdown_aborts_a_load_under_way_instead_of_waiting_for_it() -> None:
    bench = Bench([spec("big", 100)], 1000)
    waiter = bench.acquire("big")
    bench.send(Shutdown(bench.now))
    assert_failed(bench, waiter, ShuttingDownError)
    assert bench.stops() == ["big"]  # at once, while its start is still running
    bench.stop_done("big")
    assert bench.of(FinishShutdown) == []  # the start has not answered yet
    bench.load_done("big", error="big was stopped before it was ready")
    assert bench.of(FinishShutdown) == [FinishShutdown()]
    assert bench.machine.resident() == ()
    assert bench.stops() == ["big"]


def test_a_load_that_wins_the_race_with_shutdown_is_stopped_all_the_same() -> None:
    bench = Bench([spec("a", 100)], 1000)
    waiter = bench.acquire("a")
    bench.send(Shutdown(bench.now))
    bench.load_done("a")  # it was ready just before the stop reached it
    assert bench.lease(waiter) is None  # its waiter was failed already
    bench.stop_done("a")
    assert bench.of(FinishShutdown) == [FinishShutdown()]
    assert bench.machine.resident() == ()
    assert bench.records("stopped")[0].label == "shutdown"


# --------------------------------------------------------------------------- labels, helpers


def test_eviction_causes_are_a_short_fixed_set_of_metric_labels() -> None:
    limits = dataclasses.replace(LIMITS, drain_s=0.3, idle_ttl_s=0.3)
    specs = [
        spec("scratch-a", 100, sticky=False, excludes=["scratch-b"]),
        spec("scratch-b", 100, sticky=False),
        spec("big", 700),
        spec("other", 700),
    ]
    bench = Bench(specs, 1000, limits)
    bench.use("scratch-a")
    bench.use("scratch-b")  # scratch-a yields: exclusion
    bench.at(1.0)  # scratch-b unloads: idle_ttl
    bench.settle()
    bench.use("big")
    bench.use("other")  # big makes room: make_room
    held = bench.acquire("other")
    bench.settle()
    big = bench.acquire("big")
    bench.at(1.3)  # other is busy past --drain: drain
    bench.release(held)
    bench.settle()
    bench.release(big)
    bench.unload("big")  # unload
    bench.settle()
    bench.use("scratch-a")
    bench.send(Shutdown(bench.now))  # shutdown
    bench.settle()
    labels = {(r.role, r.label) for r in bench.records("stopped")}
    assert labels == {
        ("scratch-a", "exclusion"),
        ("scratch-b", "idle_ttl"),
        ("big", "make_room"),
        ("other", "drain"),
        ("big", "unload"),
        ("scratch-a", "shutdown"),
    }
    assert {r.label for r in bench.records("loaded")} == {"request"}


def test_the_machine_is_deterministic() -> None:
    def run() -> list[Effect]:
        bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000)
        for role in ["x", "y", "x"]:
            bench.use(role)
        return bench.effects

    assert run() == run()


def test_client_reason_cuts_paths_but_not_urls() -> None:
    assert client_reason("x: /srv/models/a.gguf does not exist\ntail") == "x: a.gguf does not exist"
    assert client_reason("no answer from http://127.0.0.1:9/v1/x") == (
        "no answer from http://127.0.0.1:9/v1/x"
    )
    assert client_reason("in / and /tmp/") == "in / and /"
    assert len(client_reason("y" * 1000)) == 300


# --------------------------------------------------------------------------- the page and purity

DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


def test_the_state_table_names_every_phase_event_and_effect() -> None:
    page = DOCS.read_text(encoding="utf-8")
    names = [p.value for p in Phase]
    names += [t.__name__ for t in get_args(Event)]
    names += [t.__name__ for t in get_args(Effect)]
    missing = [n for n in names if f"`{n}`" not in page]
    assert missing == [], f"docs/scheduler.md does not name {missing}"


def test_the_machine_imports_no_clock_no_asyncio_and_no_logging() -> None:
    import ast

    import rosterd.scheduler.events as events_module
    import rosterd.scheduler.machine as machine_module
    import rosterd.scheduler.state as state_module

    for module in (machine_module, state_module, events_module):
        assert module.__file__ is not None
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert imported.isdisjoint({"asyncio", "time", "logging"}), (module.__name__, imported)
