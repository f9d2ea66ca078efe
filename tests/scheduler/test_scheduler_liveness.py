"""The liveness rules on the pure node state machine: generation probes, ``unhealthy``,
requests that wait for a restarted backend, the backoff after failed loads, loads that
nobody waits for, and what a role's view says about them.

Driven like ``test_scheduler.py``: synchronous calls with an explicit ``now`` and the
``Bench`` that records effects; probes and restarts are answered by the test
(``ProbeDone``, ``BackendChanged``). No test sleeps. The same rules run on real
llama-server processes in ``test_up_liveness.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from rosterd.errors import LoadBackoffError, LoadFailedError, QueueTimeoutError
from rosterd.scheduler.events import (
    BackendChanged,
    Cancel,
    NodeLost,
    ProbeBackend,
    ProbeDone,
    RecordEvent,
    RestartBackend,
    RevokeLeases,
    Suspect,
)
from rosterd.scheduler.health import SILENT_NODE_REPROBE_S, STALL_PROBE_TIMEOUT_S
from rosterd.scheduler.values import Phase, backoff_s
from support.node_bench import LIMITS, Bench, assert_failed, spec

PROBING = dataclasses.replace(LIMITS, probe_interval_s=30.0, probe_timeout_s=5.0)


def probes(bench: Bench) -> list[ProbeBackend]:
    return bench.of(ProbeBackend)


# --------------------------------------------------------------------------- probes


def test_an_idle_role_is_probed_every_interval_and_a_busy_one_is_not() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    bench.use("a")
    bench.at(29.9)
    assert probes(bench) == []
    bench.at(30.0)
    [probe] = probes(bench)
    assert (probe.role, probe.timeout_s) == ("a", 5.0)
    bench.at(45.0)
    assert len(probes(bench)) == 1  # one at a time
    bench.send(ProbeDone(45.0, "a", probe.generation, ok=True))
    bench.at(74.9)
    assert len(probes(bench)) == 1  # the interval counts from the last proof of life
    held = bench.acquire("a")
    bench.at(200.0)
    assert len(probes(bench)) == 1  # a role with a request in flight is not probed while idle
    bench.release(held)
    bench.at(230.0)
    assert len(probes(bench)) == 2


def test_a_stalled_request_has_its_role_probed_at_once_within_the_short_bound() -> None:
    # A backend with no progress signal is judged by this probe alone: seconds, not the 20
    # of an idle probe, so a wedged one is restarted right after the request's 504.
    bench = Bench([spec("a", 100)], 1000, dataclasses.replace(PROBING, probe_timeout_s=20.0))
    first = bench.acquire("a")
    bench.settle()
    lease = bench.lease(first)
    assert lease is not None
    bench.send(Suspect(1.0, "a", lease.generation, "no first byte within 20 s"))
    [probe] = probes(bench)
    assert probe.timeout_s == STALL_PROBE_TIMEOUT_S
    bench.send(ProbeDone(6.0, "a", probe.generation, ok=False, detail="no answer within 5 s"))
    assert bench.phase("a") == Phase.UNHEALTHY.value
    assert bench.of(RestartBackend)


def test_a_failed_probe_marks_the_role_unhealthy_ends_its_requests_and_restarts_it() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    first = bench.acquire("a")
    bench.settle()
    lease = bench.lease(first)
    assert lease is not None
    bench.send(Suspect(1.0, "a", lease.generation, "no byte for 2 s"))
    [probe] = probes(bench)
    held = bench.acquire("a")
    assert not bench.answered(held)  # no new request goes to a suspected backend
    bench.send(ProbeDone(6.0, "a", probe.generation, ok=False, detail="no answer within 5 s"))
    assert bench.phase("a") == Phase.UNHEALTHY.value
    waiting = bench.acquire("a")
    [revoke] = bench.of(RevokeLeases)
    assert revoke.generation == lease.generation
    assert revoke.revocation.code == "backend_unhealthy"
    assert "stopped generating (no answer within 5 s)" in revoke.revocation.message
    assert bench.of(RestartBackend) == [RestartBackend("a")]
    assert bench.records("unhealthy")[0].cause.startswith("its generation probe failed")
    assert bench.machine.resident() == ("a",)  # it keeps its memory through the restart
    view = bench.machine.role_snapshot("a", 6.0)
    assert view.last_error == "unhealthy: its generation probe failed (no answer within 5 s)"
    assert "being restarted" in str(view.waiting_reason)
    # The supervisor kills it and starts it again: waiters get the new process.
    bench.send(BackendChanged(6.1, "a", "exited", pid=10, exit_reason="was killed by signal 9"))
    bench.send(BackendChanged(6.1, "a", "restarting", pid=10))
    assert bench.phase("a") == Phase.UNHEALTHY.value
    assert not bench.answered(waiting)
    bench.send(BackendChanged(6.5, "a", "ready", pid=11))
    granted = bench.lease(waiting)
    assert granted is not None
    assert granted.endpoint.pid == 11
    assert bench.lease(held) is not None
    assert granted.generation > lease.generation
    bench.release(first)  # the revoked lease's release is ignored: it was a dead generation
    assert bench.machine.role_snapshot("a", 6.5).running == 2
    assert bench.starts() == ["a"]  # restarted by the supervisor, not loaded again


def test_a_request_that_found_its_backend_wedged_makes_it_unhealthy_without_a_probe() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    first = bench.acquire("a")
    bench.settle()
    lease = bench.lease(first)
    assert lease is not None
    why = "no byte for 15 s and its slots endpoint gave no answer within 5 s"
    bench.send(Suspect(20.0, "a", lease.generation, why, wedged=True))
    assert probes(bench) == []  # the progress check was the look already
    assert bench.phase("a") == Phase.UNHEALTHY.value
    [revoke] = bench.of(RevokeLeases)
    assert revoke.revocation.code == "backend_unhealthy"
    assert why in revoke.revocation.message
    assert bench.of(RestartBackend) == [RestartBackend("a")]
    assert bench.machine.role_snapshot("a", 20.0).last_error == f"unhealthy: {why}"
    # A second request's verdict on the same (now void) generation changes nothing.
    bench.send(Suspect(21.0, "a", lease.generation, why, wedged=True))
    assert bench.of(RestartBackend) == [RestartBackend("a")]


def test_a_suspected_role_whose_probe_passes_serves_the_requests_held_meanwhile() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    first = bench.acquire("a")
    bench.settle()
    lease = bench.lease(first)
    assert lease is not None
    bench.send(Suspect(1.0, "a", lease.generation, "no byte for 2 s"))
    held = bench.acquire("a")
    [probe] = probes(bench)
    bench.send(ProbeDone(1.5, "a", probe.generation, ok=True))
    assert bench.lease(held) is not None
    assert bench.phase("a") == Phase.READY.value


def test_a_probe_answer_for_an_older_generation_is_ignored() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    bench.use("a")
    bench.at(30.0)
    [probe] = probes(bench)
    bench.send(BackendChanged(31.0, "a", "exited", pid=1))  # crashed meanwhile
    bench.send(ProbeDone(32.0, "a", probe.generation, ok=False, detail="refused"))
    assert bench.phase("a") == Phase.RESTARTING.value
    assert bench.of(RestartBackend) == []


def test_a_role_restarted_for_a_wedge_that_is_given_up_fails_its_waiters() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    bench.use("a")
    bench.at(30.0)
    [probe] = probes(bench)
    bench.send(ProbeDone(31.0, "a", probe.generation, ok=False, detail="refused"))
    waiting = bench.acquire("a")
    bench.send(BackendChanged(32.0, "a", "restart_failed", detail="bad magic", final=True))
    assert bench.phase("a") == Phase.STOPPED.value
    assert_failed(bench, waiting, LoadFailedError, "could not be restarted")


# --------------------------------------------------------------------------- retry that waits


def test_a_request_whose_backend_died_waits_for_the_restart_not_the_dead_port() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    ticket = bench.acquire("a")
    bench.settle()
    lease = bench.lease(ticket)
    assert lease is not None
    bench.release(ticket)
    again = bench.acquire("a", newer_than=lease.generation)  # no crash seen yet
    assert not bench.answered(again)
    assert [p.role for p in probes(bench)] == ["a"]  # is it alive?
    bench.send(BackendChanged(0.1, "a", "exited", pid=1))
    bench.send(BackendChanged(0.6, "a", "ready", pid=2))
    granted = bench.lease(again)
    assert granted is not None
    assert granted.generation > lease.generation
    assert granted.endpoint.pid == 2


def test_a_request_that_failed_on_a_live_backend_is_sent_to_it_again() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    ticket = bench.acquire("a")
    bench.settle()
    lease = bench.lease(ticket)
    assert lease is not None
    bench.release(ticket)
    again = bench.acquire("a", newer_than=lease.generation)
    other = bench.acquire("a")
    assert bench.lease(other) is not None  # others pass the one waiting for a restart
    [probe] = probes(bench)
    bench.send(ProbeDone(0.2, "a", probe.generation, ok=True))
    assert bench.lease(again) is not None


def test_a_request_waiting_for_a_restart_gives_up_at_its_queue_timeout() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    ticket = bench.acquire("a")
    bench.settle()
    lease = bench.lease(ticket)
    assert lease is not None
    bench.release(ticket)
    again = bench.acquire("a", newer_than=lease.generation, timeout_s=2.0)
    bench.at(2.0)
    assert_failed(bench, again, QueueTimeoutError, "waiting for the restart")


# --------------------------------------------------------------------------- a silent node


def _silent(bench: Bench) -> tuple[int, int]:
    """A request that failed on ``a``'s backend and whose probe found the node silent:
    (its ticket waiting for a newer backend, the failed lease's generation)."""
    ticket = bench.acquire("a")
    bench.settle()
    lease = bench.lease(ticket)
    assert lease is not None
    bench.release(ticket)
    again = bench.acquire("a", newer_than=lease.generation)
    [probe] = probes(bench)
    detail = "the agent of node n1 did not answer within 8 s"
    bench.send(ProbeDone(1.0, "a", probe.generation, ok=False, detail=detail, unreachable=True))
    return again, lease.generation


def test_a_probe_that_never_reached_its_node_restarts_nothing_and_holds_the_requests() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    again, _ = _silent(bench)
    assert bench.phase("a") == Phase.READY.value  # no verdict on the backend: not unhealthy
    assert bench.of(RestartBackend) == []
    assert bench.of(RevokeLeases) == []
    new = bench.acquire("a")
    assert not bench.answered(again)
    assert not bench.answered(new)
    view = bench.machine.role_snapshot("a", bench.now)
    assert "its node does not answer" in str(view.waiting_reason), view
    assert [r.cause for r in bench.records("node_silent")] == [
        "the agent of node n1 did not answer within 8 s; waiting for the node's verdict"
    ]
    bench.at(1.0 + SILENT_NODE_REPROBE_S)
    assert len(probes(bench)) == 2  # asked again


def test_a_silent_node_that_answers_again_serves_the_held_requests_there() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    again, _ = _silent(bench)
    new = bench.acquire("a")
    bench.at(1.0 + SILENT_NODE_REPROBE_S)
    probe = probes(bench)[-1]
    bench.send(ProbeDone(bench.now, "a", probe.generation, ok=True))
    assert bench.lease(again) is not None
    assert bench.lease(new) is not None
    assert len(bench.records("node_answers")) == 1


def test_a_silent_node_declared_lost_keeps_its_requests_waiting_for_the_move() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    again, _ = _silent(bench)
    bench.send(NodeLost(2.0, "node n1 is lost: Ray declared its node dead"))
    assert bench.phase("a") == Phase.LOST.value
    assert not bench.answered(again)  # it waits, within its queue timeout, for the move
    bench.at(2.0 + 10 * SILENT_NODE_REPROBE_S)
    assert len(probes(bench)) == 1  # nothing is asked of a lost node


# --------------------------------------------------------------------------- failed loads


def test_failed_loads_back_off_and_requests_meanwhile_get_the_reason_at_once() -> None:
    bench = Bench([spec("bad", 100)], 1000)
    for failures in (1, 2, 3):
        bench.acquire("bad")
        bench.load_done("bad", error="backend bad exited with code 1: bad magic in /x/bad.gguf")
        bench.stop_done("bad")
        delay = backoff_s(failures, LIMITS.load_backoff_s, LIMITS.max_load_backoff_s)
        assert delay == 0.5 * 2 ** (failures - 1)
        refused = bench.acquire("bad")
        message = assert_failed(bench, refused, LoadBackoffError, "bad magic in bad.gguf")
        assert f"failed to load {failures} time(s) in a row" in message
        assert bench.failure(refused).retry_after_s == pytest.approx(delay)  # type: ignore[union-attr]
        view = bench.machine.role_snapshot("bad", bench.now)
        assert view.load_backoff_s == pytest.approx(delay)
        assert str(view.last_error).startswith("load failed: backend bad exited with code 1")
        assert len(bench.starts()) == failures  # no load while it backs off
        bench.at(bench.now + delay)
    bench.acquire("bad")
    bench.load_done("bad")  # fixed: the backoff resets
    assert bench.machine.role_snapshot("bad", bench.now).load_backoff_s is None


def test_the_view_says_why_and_how_long_a_queued_request_waits() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1)
    bench = Bench([spec("a", 100)], 1000, limits)
    bench.acquire("a")
    bench.settle()
    bench.acquire("a")
    view = bench.machine.role_snapshot("a", 2.5)
    assert view.waiting_reason == "all 1 slot(s) are busy, --max-concurrency 1"
    assert view.waiting_s == 2.5


# --------------------------------------------------------------------------- abandoned loads


def test_a_load_nobody_waits_for_is_cancelled_when_another_role_needs_the_room() -> None:
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000)
    gone = bench.acquire("x")
    assert bench.starts() == ["x"]
    bench.send(Cancel(bench.now, gone, "x"))  # the client left while x loaded
    y = bench.acquire("y")
    assert bench.stops() == ["x"]  # x's start is aborted: its memory is freed for y
    assert bench.records("load_cancelled")[0].cause == (
        "nobody waits for it any more and y needs its room"
    )
    bench.load_done("x", error="backend x was stopped before it was ready")
    bench.stop_done("x")
    assert bench.phase("x") == Phase.STOPPED.value
    assert bench.starts() == ["x", "y"]
    bench.settle()
    assert bench.lease(y) is not None
    assert bench.violations == []
    assert [r.label for r in bench.of(RecordEvent) if r.kind == "stopped"] == ["make_room"]


def test_a_warm_up_does_not_cancel_a_load_nobody_waits_for() -> None:
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000)
    gone = bench.acquire("x")
    bench.send(Cancel(bench.now, gone, "x"))
    bench.acquire("y", no_evict=True)
    assert bench.stops() == []


def test_a_load_nobody_waits_for_finishes_and_stays_when_the_room_is_not_needed() -> None:
    bench = Bench([spec("x", 600), spec("y", 300)], 1000)
    gone = bench.acquire("x")
    bench.send(Cancel(bench.now, gone, "x"))
    y = bench.acquire("y")  # fits beside x: no reason to cancel x
    assert bench.stops() == []
    bench.settle()
    assert bench.lease(y) is not None
    assert set(bench.machine.resident()) == {"x", "y"}


def test_a_lost_nodes_requests_in_flight_are_cut_and_may_be_sent_again() -> None:
    bench = Bench([spec("a", 100)], 1000, PROBING)
    ticket = bench.acquire("a")
    bench.settle()
    lease = bench.lease(ticket)
    assert lease is not None
    bench.send(NodeLost(1.0, "node n1 is lost: Ray declared its node dead"))
    [revoke] = bench.of(RevokeLeases)
    assert revoke.generation == lease.generation
    assert revoke.revocation.code == "node_lost"
    assert revoke.revocation.resend  # no byte answered: the router sends it where a moves
    assert "node n1 is lost" in revoke.revocation.message
