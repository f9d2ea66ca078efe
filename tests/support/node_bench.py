"""A bench for the pure node machine: ``Bench`` feeds ``NodeMachine`` events at an explicit
``now`` and records the effects it returns, checking at every start that the backends alive never
break the budget or an exclusion. No process, no clock, no sleep."""

from __future__ import annotations

import itertools
import re
from typing import Any, TypeVar

import support.specs as spec_helpers
from rosterd.backends.values import Endpoint
from rosterd.errors import (
    SchedulerError,
)
from rosterd.scheduler.events import (
    Acquire,
    Effect,
    Event,
    FailWaiter,
    GrantLease,
    KvSaveDone,
    LoadDone,
    RecordEvent,
    Release,
    SaveKv,
    StartBackend,
    StopBackend,
    StopDone,
    Tick,
    Unload,
)
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec

MIB = 2**20


E = TypeVar("E")


LIMITS = SchedulerLimits(
    max_concurrency=4,
    max_queue=16,
    queue_timeout_s=10.0,
    drain_s=5.0,
    idle_ttl_s=float("inf"),
    min_busy_residency_s=0.0,
    max_wait_s=0.0,  # no turns: the rules here are those under them (turns: test_scheduler_turns)
)


def spec(role: str, mib: int, **options: Any) -> InferenceSpec:
    """A llama.cpp spec of ``mib`` MiB whose model is named like the role."""
    return spec_helpers.spec(role, mib, unit=MIB, model=role, **options)


class Bench:
    """A node loop that applies nothing: it feeds events to the machine at ``now`` and
    records every effect, and checks that the processes alive (from ``StartBackend``
    until its role's ``StopDone``) never break the budget or an exclusion. An idle KV save
    (``SaveKv``) is answered at once, as backends that keep no KV answer it, unless
    ``answer_saves`` is false (the test answers it with ``KvSaveDone`` itself)."""

    def __init__(
        self, specs: list[InferenceSpec], capacity_mib: int, limits: SchedulerLimits = LIMITS
    ) -> None:
        self.specs = {s.role: s for s in specs}
        self.capacity = capacity_mib * MIB
        self.machine = NodeMachine(self.capacity, self.specs, limits)
        self.limits = limits
        self.now = 0.0
        self.effects: list[Effect] = []
        self.pending: list[StartBackend | StopBackend] = []  # asked, not answered yet
        self.alive: set[str] = set()
        self.violations: list[str] = []
        self._tickets = itertools.count(1)
        self.answer_saves = True

    # ---- driving --------------------------------------------------------------------

    def send(self, event: Event) -> list[Effect]:
        out = self.machine.handle(event)
        self.effects += out
        for effect in out:
            if isinstance(effect, (StartBackend, StopBackend)):
                self.pending.append(effect)
            if isinstance(effect, StartBackend):
                self.alive.add(effect.role)  # memory is held from the first byte loaded
                self._check()
        for effect in out:
            if isinstance(effect, SaveKv) and self.answer_saves:
                self.send(KvSaveDone(self.now, effect.role, effect.generation))
        return out

    def acquire(self, role: str, **options: Any) -> int:
        ticket = next(self._tickets)
        self.send(Acquire(self.now, ticket, role, **options))
        return ticket

    def release(self, ticket: int) -> None:
        lease = self.lease(ticket)
        assert lease is not None, f"ticket {ticket} holds no lease"
        self.send(Release(self.now, lease.role, lease.generation))

    def unload(self, role: str) -> int:
        ticket = next(self._tickets)
        self.send(Unload(self.now, ticket, role))
        return ticket

    def at(self, now: float) -> list[Effect]:
        """A tick at ``now``."""
        self.now = now
        return self.send(Tick(now))

    def load_done(self, role: str, *, error: str | None = None, pid: int | None = None) -> None:
        self._answer(StartBackend(role))
        endpoint = None if error else Endpoint(f"http://127.0.0.1:1/{role}", role, pid)
        self.send(LoadDone(self.now, role, endpoint=endpoint, error=error))

    def stop_done(self, role: str) -> None:
        self._answer(StopBackend(role))
        self.alive.discard(role)  # free only once the process exited
        self.send(StopDone(self.now, role))

    def settle(self) -> None:
        """Answer every start and stop asked for (each succeeds) until none is left."""
        while self.pending:
            effect = self.pending[0]
            if isinstance(effect, StartBackend):
                self.load_done(effect.role)
            else:
                self.stop_done(effect.role)

    def _answer(self, effect: StartBackend | StopBackend) -> None:
        assert effect in self.pending, f"{effect} was not asked for; pending: {self.pending}"
        self.pending.remove(effect)

    def _check(self) -> None:
        used = sum(self.specs[r].memory.resident_bytes for r in self.alive)
        if used > self.capacity:
            self.violations.append(f"over budget: {sorted(self.alive)}")
        for r in self.alive:
            for other in self.specs[r].excluded_roles():
                if other in self.alive:
                    self.violations.append(f"excluded together: {r}, {other}")

    # ---- reading ----------------------------------------------------------------------

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.effects if isinstance(e, kind)]

    def lease(self, ticket: int) -> GrantLease | None:
        return next((g for g in self.of(GrantLease) if g.ticket == ticket), None)

    def failure(self, ticket: int) -> FailWaiter | None:
        return next((f for f in self.of(FailWaiter) if f.ticket == ticket), None)

    def answered(self, ticket: int) -> bool:
        return self.lease(ticket) is not None or self.failure(ticket) is not None

    def starts(self) -> list[str]:
        return [e.role for e in self.of(StartBackend)]

    def stops(self) -> list[str]:
        return [e.role for e in self.of(StopBackend)]

    def records(self, kind: str) -> list[RecordEvent]:
        return [e for e in self.of(RecordEvent) if e.kind == kind]

    def phase(self, role: str) -> str:
        return str(self.machine.role_snapshot(role, self.now).phase)

    def use(self, role: str) -> int:
        """A request for ``role`` that is served (loading and evicting as needed) and released."""
        ticket = self.acquire(role)
        self.settle()
        assert self.lease(ticket) is not None, self.failure(ticket)
        self.release(ticket)
        return ticket


def assert_failed(bench: Bench, ticket: int, error: type[SchedulerError], match: str = "") -> str:
    failure = bench.failure(ticket)
    assert failure is not None, f"ticket {ticket} did not fail"
    assert failure.error is error, failure
    assert re.search(match, failure.message), failure.message
    return failure.message
