"""The idle save of a role's KV cache (``rosterd.scheduler.kv_saves``), on the pure node machine.

Driven as ``test_scheduler.py`` drives the machine: synchronous calls, an explicit
``now``, the effects recorded by ``Bench``; no test sleeps. What a user relies on: a role
that served a request and then stayed idle is saved before anything evicts it, never while
a request runs on it, and no request is granted while the save runs. The same on a real
llama-server, timed, is in ``test_up_kv_idle_save.py``.
"""

from __future__ import annotations

from dataclasses import replace

from rosterd.scheduler.events import KvSaveDone, SaveKv
from support.node_bench import LIMITS, Bench, spec

QUIET_S = LIMITS.kv_idle_save_s


def kv_bench(roles: list[tuple[str, int]], capacity_mib: int, quiet_s: float = QUIET_S) -> Bench:
    """A ``Bench`` whose ``SaveKv`` the test answers itself (``saved``), with
    ``kv_idle_save_s`` of ``quiet_s``."""
    limits = replace(LIMITS, kv_idle_save_s=quiet_s)
    bench = Bench([spec(r, mib) for r, mib in roles], capacity_mib, limits)
    bench.answer_saves = False
    return bench


def saves(bench: Bench) -> list[str]:
    return [e.role for e in bench.of(SaveKv)]


def saved(bench: Bench, role: str) -> None:
    """The backends answer the last ``SaveKv`` of ``role``."""
    effect = [e for e in bench.of(SaveKv) if e.role == role][-1]
    bench.send(KvSaveDone(bench.now, role, effect.generation))


def test_a_role_is_saved_once_it_stays_idle_after_a_request() -> None:
    bench = kv_bench([("a", 100)], 1000)
    bench.use("a")
    bench.at(QUIET_S - 0.1)
    assert saves(bench) == []  # debounced: another request may follow at once
    bench.at(QUIET_S + 0.01)
    assert saves(bench) == ["a"]
    saved(bench, "a")
    bench.at(QUIET_S * 10)
    assert saves(bench) == ["a"]  # nothing ran since: nothing to save again


def test_no_save_while_a_request_runs_and_none_after_a_load_alone() -> None:
    bench = kv_bench([("a", 100)], 1000)
    warm = bench.acquire("a", take_slot=False)  # a warm-up loads; it changes no slot
    bench.settle()
    assert bench.lease(warm) is not None
    bench.at(QUIET_S * 4)
    assert saves(bench) == []  # a load restored what was kept: nothing new to save
    running = bench.acquire("a")
    bench.at(QUIET_S * 10)
    assert saves(bench) == []  # it runs: never saved under a request
    bench.release(running)
    bench.at(QUIET_S * 10 + QUIET_S)
    assert saves(bench) == ["a"]


def test_a_request_that_comes_during_the_save_waits_for_it() -> None:
    bench = kv_bench([("a", 100)], 1000)
    bench.use("a")
    bench.at(QUIET_S + 0.01)
    assert saves(bench) == ["a"]
    ticket = bench.acquire("a")
    assert not bench.answered(ticket)  # the save and the request never share the slots
    assert "being saved" in str(bench.machine.waiting_reason("a"))
    saved(bench, "a")
    assert bench.lease(ticket) is not None
    bench.release(ticket)
    bench.at(bench.now + QUIET_S + 0.01)
    assert saves(bench) == ["a", "a"]  # it served again: saved again once idle


def test_an_eviction_after_the_idle_save_only_stops() -> None:
    bench = kv_bench([("a", 600), ("b", 600)], 1000)
    bench.use("a")
    bench.at(QUIET_S + 0.01)
    saved(bench, "a")
    bench.now = 5.0
    bench.use("b")  # evicts a: a stop, and no other save first
    assert bench.stops() == ["a"]
    assert saves(bench) == ["a"]


def test_a_role_evicted_before_its_idle_save_is_not_saved_while_stopping() -> None:
    bench = kv_bench([("a", 600), ("b", 600)], 1000)
    bench.use("a")
    bench.now = 0.1
    bench.use("b")  # within the quiet time: the stop saves it, as before
    bench.at(QUIET_S * 4)
    assert bench.stops() == ["a"]
    assert "a" not in saves(bench)


def test_an_answer_for_an_older_run_does_not_free_the_grants_of_the_new_one() -> None:
    bench = kv_bench([("a", 100)], 1000)
    bench.use("a")
    bench.at(QUIET_S + 0.01)
    stale = bench.of(SaveKv)[-1].generation
    bench.send(KvSaveDone(bench.now, "a", stale + 1))
    ticket = bench.acquire("a")
    assert not bench.answered(ticket)
    bench.send(KvSaveDone(bench.now, "a", stale))
    assert bench.lease(ticket) is not None


def test_an_infinite_quiet_time_saves_only_at_the_stop() -> None:
    bench = kv_bench([("a", 100)], 1000, quiet_s=float("inf"))
    bench.use("a")
    bench.at(1e6)
    assert saves(bench) == []
