"""A discrete-event run of the pure node machine under load, for the turn rules.

``simulate(requests, limits)`` feeds ``NodeMachine`` two roles that cannot be
resident together (each takes most of the node's memory), arrivals at their
times, a lease given back ``service_s`` after its grant, a start answered
``load_s`` after it was asked, a stop ``stop_s`` after, an idle KV save at once (as
backends that keep no KV answer it), and ticks every
``tick_s``. Time is simulated: nothing sleeps. It records each request's wait,
each swap with what justified it, and every failure, for
``test_scheduler_turns.py``.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from rosterd.backends.values import Endpoint
from rosterd.scheduler.events import (
    Acquire,
    Effect,
    Event,
    FailWaiter,
    GrantLease,
    KvSaveDone,
    LoadDone,
    Release,
    RevokeLeases,
    SaveKv,
    StartBackend,
    StopBackend,
    StopDone,
    Tick,
)
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import SchedulerLimits
from support.specs import spec

MIB = 2**20
ROLES = ("a", "b")


@dataclass(frozen=True)
class Request:
    """One request: it arrives at ``at`` (s) for ``role`` and holds its lease ``service_s``."""

    at: float
    role: str
    service_s: float


@dataclass(frozen=True)
class Swap:
    """The stop of ``role`` at ``at`` to make room for ``for_role``: ``own_queue``
    requests of ``role`` were still waiting then, ``own_older`` of them older than the
    oldest waiting request of ``for_role``; ``other_waited_s`` is how long that one had
    waited."""

    at: float
    role: str
    own_queue: int
    other_waited_s: float
    own_older: int = 0


@dataclass
class Outcome:
    """What a run saw: waits by ticket (s), failures (ticket -> error name), swaps,
    leases cut by a revocation, and when the last request was served."""

    waits: dict[int, float] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    swaps: list[Swap] = field(default_factory=list)
    cut: int = 0
    end_s: float = 0.0


def simulate(
    requests: list[Request],
    limits: SchedulerLimits,
    *,
    load_s: float = 0.5,
    stop_s: float = 0.1,
    interactive: frozenset[str] = frozenset(),
    horizon_s: float = 3600.0,
) -> Outcome:
    """Run ``requests`` through a node holding one of ``ROLES`` at a time.

    ``interactive``: the roles whose latency class is interactive. Returns the
    ``Outcome``; raises ``AssertionError`` if the run goes past ``horizon_s``.
    """
    specs = {
        r: spec(r, 600, unit=MIB, model=r, sticky=False, interactive=r in interactive)
        for r in ROLES
    }
    machine = NodeMachine(1000 * MIB, specs, limits)
    outcome = Outcome()
    order = itertools.count()
    agenda: list[tuple[float, int, str, object]] = []

    def later(at: float, kind: str, payload: object) -> None:
        heapq.heappush(agenda, (at, next(order), kind, payload))

    for ticket, request in enumerate(requests, start=1):
        later(request.at, "arrive", ticket)
    service = {t: r.service_s for t, r in enumerate(requests, start=1)}
    role_of = {t: r.role for t, r in enumerate(requests, start=1)}
    arrived: dict[int, float] = {}
    waiting: dict[int, float] = {}  # ticket -> arrival, not yet answered
    leases: dict[int, GrantLease] = {}  # ticket -> its lease, not yet released
    now = 0.0

    def send(event: Event) -> None:
        for effect in machine.handle(event):
            react(effect)

    def react(effect: Effect) -> None:
        if isinstance(effect, GrantLease):
            waiting.pop(effect.ticket)
            outcome.waits[effect.ticket] = now - arrived[effect.ticket]
            leases[effect.ticket] = effect
            later(now + service[effect.ticket], "release", effect.ticket)
        elif isinstance(effect, FailWaiter):
            waiting.pop(effect.ticket, None)
            outcome.failures[effect.ticket] = effect.error.__name__
        elif isinstance(effect, StartBackend):
            later(now + load_s, "loaded", effect.role)
        elif isinstance(effect, StopBackend):
            other = next(r for r in ROLES if r != effect.role)
            own = [t for t in waiting if role_of[t] == effect.role]
            theirs = [a for t, a in waiting.items() if role_of[t] == other]
            waited = now - min(theirs) if theirs else 0.0
            older = sum(1 for t in own if theirs and waiting[t] < min(theirs))
            outcome.swaps.append(Swap(now, effect.role, len(own), waited, older))
            later(now + stop_s, "stopped", effect.role)
        elif isinstance(effect, SaveKv):
            later(now, "saved", effect)
        elif isinstance(effect, RevokeLeases):
            for ticket, lease in list(leases.items()):
                if lease.role == effect.role and lease.generation == effect.generation:
                    outcome.cut += 1
                    later(now, "release", ticket)

    next_tick = 0.0
    while agenda or waiting or leases:
        at = agenda[0][0] if agenda else next_tick
        if next_tick <= at:
            now = next_tick
            next_tick += limits.tick_s
            send(Tick(now))
        else:
            now, _, kind, payload = heapq.heappop(agenda)
            if kind == "arrive":
                ticket = int(str(payload))
                arrived[ticket] = waiting[ticket] = now
                send(Acquire(now, ticket, role_of[ticket], timeout_s=limits.queue_timeout_s))
            elif kind == "release":
                lease = leases.pop(int(str(payload)), None)
                if lease is not None:
                    outcome.end_s = now
                    send(Release(now, lease.role, lease.generation))
            elif kind == "loaded":
                role = str(payload)
                send(LoadDone(now, role, endpoint=Endpoint(f"http://127.0.0.1:1/{role}", role)))
            elif kind == "saved":
                assert isinstance(payload, SaveKv)
                send(KvSaveDone(now, payload.role, payload.generation))
            else:
                send(StopDone(now, str(payload)))
        assert now <= horizon_s, f"still running at {now} s: waiting {waiting}, leases {leases}"
    return outcome
