"""The node state machine (DESIGN.md layer 6, pure): one node's resident set.

``NodeMachine.handle(event)`` takes one event (``rosterd.scheduler.events``)
and returns the effects the node loop must apply, in order. It reads no clock
(every event carries ``now``), does no I/O, never logs (it returns
``LogNote``/``RecordEvent`` effects) and holds no asyncio object; the same
events give the same effects. The residency policy
(:func:`rosterd.residency.decide`) says what to load or evict; this machine
says when. The rules it keeps (issue 5, USERS.md; table in ``docs/scheduler.md``):

- **One load per role at a time, shared.** Every waiter for a role waits on the
  same load; a waiter that gives up (``Cancel``) only leaves the queue.
- **One transition per node at a time.** A transition is "stop these roles,
  then start that one", one ``StartBackend``/``StopBackend`` at a time. Memory
  counts as free only after ``StopDone`` (the process exited), so the node
  never holds more than its capacity nor two roles that exclude each other.
- **No eviction under a request.** A role with leases out is not evicted: the
  policy answers ``Wait`` naming it. The busy role then *drains*: it grants no
  new lease to a waiter newer than the oldest one waiting for its room
  (``hold_since``). Once that waiter has waited ``drain_s`` in-flight counts
  are ignored: the busy role's leases are revoked (``RevokeLeases``), releases
  are awaited up to ``REVOKE_WAIT_S``, then it stops.
- **An unload takes no new requests**; waiting requests load the role again after.
- **No swap ping-pong.** A role loaded less than ``min_residency_s`` ago is
  ``recently_loaded`` for the policy: a batch role cannot evict it.
- **Exclusions yield when idle.** A role refused because a resident role
  excludes it waits; once the winner is idle (nothing in flight or queued, past
  ``min_residency_s``) or busy past ``drain_s`` it is unloaded. An interactive
  winner never yields to a batch role: the refusal fails the request at once.
- **Idle TTL.** A ready, non-sticky batch role idle for ``idle_ttl_s`` is unloaded.
- **Crash restarts are loads too.** ``BackendChanged`` ``exited``/``restarting``
  of a ready role: ``restarting`` (memory held, leases void, waiters wait);
  ``ready``: served again with the new pid; a final ``restart_failed``:
  ``stopped`` and the waiters fail.
- **Per-role concurrency and a bounded queue.** At most ``max_concurrency``
  leases and ``max_queue`` waiters per role (``QueueFullError`` beyond); a
  waiter fails with ``QueueTimeoutError`` once its ``timeout_s`` passed.
- **Shutdown is an event.** Waiters fail, a load under way is aborted at once,
  leases drain up to ``drain_s``, then every resident role stops; ``FinishShutdown``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from rosterd.backends import Endpoint
from rosterd.residency import (
    AlreadyResident,
    Load,
    NodeState,
    Refuse,
    Wait,
    decide,
    excludes_each_other,
)
from rosterd.scheduler.errors import (
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.scheduler.events import (
    Acquire,
    BackendChanged,
    Cancel,
    Effect,
    Event,
    FailWaiter,
    FinishShutdown,
    FinishUnload,
    GrantLease,
    LoadDone,
    LogNote,
    RecordEvent,
    Release,
    RevokeLeases,
    Shutdown,
    StartBackend,
    StopBackend,
    StopDone,
    Tick,
    Unload,
    UpdateGauges,
)
from rosterd.scheduler.values import (
    HOLDS_MEMORY,
    Phase,
    Revocation,
    SchedulerLimits,
    client_reason,
)
from rosterd.spec import InferenceSpec

#: How long a stop waits for the router to end revoked requests, seconds.
REVOKE_WAIT_S = 1.0

#: Where a client whose request failed on a backend is pointed for the details.
SEE_LOG = "see `rosterd ps` / the backend log"

_SHUTTING_DOWN = "rosterd is shutting down"

Step = Literal["revoking", "stopping", "loading", "cleanup", "aborting"]


@dataclass(eq=False)
class _Waiter:
    ticket: int
    since: float
    timeout_s: float
    take_slot: bool  # a request (counts in flight) or a load that only wants residency
    no_evict: bool  # warm-up: load only if nothing must be evicted


@dataclass(eq=False)
class _Role:
    spec: InferenceSpec
    phase: Phase = Phase.STOPPED
    endpoint: Endpoint | None = None
    generation: int = 0
    in_flight: int = 0
    waiters: deque[_Waiter] = field(default_factory=deque)
    loaded_at: float | None = None
    last_used: float = 0.0
    unload_tickets: list[int] = field(default_factory=list)
    unload_since: float | None = None
    waiting_reason: str | None = None
    logged_waits: set[str] = field(default_factory=set)  # wait reasons logged since the load
    # New leases go only to waiters older than this: a request for another role
    # that needs this role's room came first (None: no one waits for its room).
    hold_since: float | None = None
    gauges: tuple[int, int] = (0, 0)  # (in_flight, queued) as last reported


@dataclass(eq=False)
class _Transition:
    """The node's one transition: stop ``evict`` one by one, then load ``load``."""

    evict: deque[str]
    load: str | None
    cause: str
    label: str
    for_role: str | None
    role: str = ""  # the role being stopped or loaded now
    step: Step = "stopping"
    started: float = 0.0
    stop_cause: str = ""
    stop_label: str = ""
    revoke_until: float = 0.0
    pending: set[str] = field(default_factory=set)  # aborting: "load", "stop" still to come
    loaded: bool = False  # aborting: the start returned a backend anyway


class NodeMachine:
    """The pure scheduler of one node: ``handle(event) -> effects``.

    ``capacity_bytes``: the node's budget; ``specs``: the roles placed on it;
    ``limits``: the knobs. Roles are kept sorted by id (ties break by id).
    """

    def __init__(
        self, capacity_bytes: int, specs: Mapping[str, InferenceSpec], limits: SchedulerLimits
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.specs = dict(specs)
        self.limits = limits
        self._roles = {role: _Role(spec) for role, spec in sorted(self.specs.items())}
        self._transition: _Transition | None = None
        self._shutdown_since: float | None = None
        self._shut_down = False
        self._load_seconds: deque[float] = deque(maxlen=20)
        self._now = -math.inf
        self._out: list[Effect] = []

    # ---- the one entry point ----------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply ``event``; the effects to carry out, in order.

        ``now`` never goes back: an event older than one already handled counts
        as happening at the later time.
        """
        now = self._now = max(self._now, event.now)
        self._out = []
        if isinstance(event, Acquire):
            self._on_acquire(event, now)
        elif isinstance(event, Cancel):
            self._on_cancel(event)
        elif isinstance(event, Release):
            self._on_release(event, now)
        elif isinstance(event, Unload):
            self._on_unload(event, now)
        elif isinstance(event, BackendChanged):
            self._on_backend_changed(event, now)
        elif isinstance(event, LoadDone):
            self._on_load_done(event, now)
        elif isinstance(event, StopDone):
            self._on_stop_done(event, now)
        elif isinstance(event, Shutdown):
            self._on_shutdown(now)
        else:
            assert isinstance(event, Tick)
        self._step(now)
        out, self._out = self._out, []
        return out

    # ---- read-only views (display, never to decide on) -----------------------------

    @property
    def shutting_down(self) -> bool:
        """Whether ``Shutdown`` was handled."""
        return self._shutdown_since is not None

    @property
    def transition_under_way(self) -> bool:
        """Whether a start or stop is under way on the node."""
        return self._transition is not None

    def resident(self) -> tuple[str, ...]:
        """The roles holding memory (every phase but ``stopped``), by id."""
        return tuple(r for r, st in self._roles.items() if st.phase in HOLDS_MEMORY)

    def resident_bytes(self) -> int:
        """The spec bytes of :meth:`resident`."""
        return sum(self._roles[r].spec.memory.resident_bytes for r in self.resident())

    def waiting_reason(self, role: str) -> str | None:
        """Why ``role``'s waiters wait, as last decided (``None``: nothing said)."""
        return self._roles[role].waiting_reason

    def role_view(self, role: str, now: float) -> dict[str, object]:
        """``role``'s state as JSON-ready data (see ``NodeScheduler.snapshot``)."""
        st = self._roles[role]
        resident = st.phase in HOLDS_MEMORY
        idle = st.phase is Phase.READY and st.in_flight == 0
        return {
            "phase": st.phase.value,
            "latency_class": st.spec.latency_class.value,
            "sticky": st.spec.sticky,
            "resident_bytes": st.spec.memory.resident_bytes,
            "in_flight": st.in_flight,
            "queued": len(st.waiters),
            "idle_s": round(now - st.last_used, 3) if idle else None,
            "loaded_for_s": round(now - st.loaded_at, 3)
            if resident and st.loaded_at is not None
            else None,
            "waiting_reason": st.waiting_reason if st.waiters else None,
            "base_url": st.endpoint.base_url if st.endpoint else None,
            "pid": st.endpoint.pid if st.endpoint else None,
        }

    def typical_load_s(self) -> float:
        """Seconds a load takes here (the slowest of the last 20, rounded up; 5 if none)."""
        if not self._load_seconds:
            return 5.0
        return float(math.ceil(max(self._load_seconds)))

    # ---- events ---------------------------------------------------------------------

    def _on_acquire(self, ev: Acquire, now: float) -> None:
        st = self._roles.get(ev.role)
        if st is None:
            self._fail(ev.ticket, UnknownRoleError, f"role {ev.role!r} is not placed on this node")
        elif self.shutting_down:
            self._fail(ev.ticket, ShuttingDownError, _SHUTTING_DOWN)
        elif len(st.waiters) >= self.limits.max_queue:
            message = (
                f"role {ev.role!r} has {len(st.waiters)} requests queued "
                f"(limit {self.limits.max_queue}); retry later"
            )
            self._fail(ev.ticket, QueueFullError, message, self._retry_after())
        else:
            st.waiters.append(_Waiter(ev.ticket, now, ev.timeout_s, ev.take_slot, ev.no_evict))
            self._gauges(ev.role)

    def _on_cancel(self, ev: Cancel) -> None:
        st = self._roles.get(ev.role)
        if st is not None:
            st.waiters = deque(w for w in st.waiters if w.ticket != ev.ticket)
            self._gauges(ev.role)

    def _on_release(self, ev: Release, now: float) -> None:
        st = self._roles.get(ev.role)
        if st is not None and ev.generation == st.generation and st.in_flight > 0:
            st.in_flight -= 1
            st.last_used = now
            self._gauges(ev.role)

    def _on_unload(self, ev: Unload, now: float) -> None:
        st = self._roles.get(ev.role)
        if st is None:
            self._out.append(FinishUnload(ev.ticket))
            return
        st.unload_tickets.append(ev.ticket)
        if st.unload_since is None:
            st.unload_since = now

    def _on_backend_changed(self, ev: BackendChanged, now: float) -> None:
        role = ev.role
        st = self._roles.get(role)
        if st is None:
            return
        if ev.kind in ("exited", "restarting") and st.phase is Phase.READY:
            st.phase = Phase.RESTARTING
            st.generation += 1  # leases of the dead process are void
            st.in_flight = 0
            if st.endpoint is not None:  # same address and name; no live pid until it is back
                st.endpoint = dataclasses.replace(st.endpoint, pid=None)
            st.waiting_reason = "its backend crashed and is being restarted"
            why = ev.exit_reason or "exited"
            self._record("crashed", role, f"backend pid {ev.pid} {why}; restarting")
            self._gauges(role)
        elif ev.kind == "ready" and st.phase is Phase.RESTARTING and st.endpoint is not None:
            st.phase = Phase.READY
            st.endpoint = dataclasses.replace(st.endpoint, pid=ev.pid)
            st.last_used = now
            st.waiting_reason = None
            self._record("restarted", role, f"backend restarted as pid {ev.pid}")
            self._grant(role, st, now)
        elif ev.kind == "restart_failed" and st.phase is Phase.RESTARTING:
            if not ev.final:
                st.waiting_reason = "its backend crashed; restarting it failed, trying again"
                return
            st.phase = Phase.STOPPED  # the supervisor gave up: no process is left
            st.endpoint = None
            st.loaded_at = None
            message = f"backend for role {role!r} crashed and could not be restarted"
            self._out.append(LogNote("warning", f"{message}: {ev.detail}"))
            self._fail_waiters(role, LoadFailedError, f"{message}; {SEE_LOG}")
            self._record("restart_failed", role, "the supervisor gave up restarting it")
            self._gauges(role)

    def _on_load_done(self, ev: LoadDone, now: float) -> None:
        tr = self._transition
        if tr is None or tr.role != ev.role or tr.step not in ("loading", "aborting"):
            return  # not the start this machine asked for
        st = self._roles[ev.role]
        took = now - tr.started
        if tr.step == "aborting":
            tr.pending.discard("load")
            if ev.error is not None:
                self._record("load_failed", ev.role, ev.error, duration_s=took)
            else:
                tr.loaded = True  # the stop under way stops it
            self._finish_abort(tr, now)
            return
        if ev.error is not None or ev.endpoint is None:
            error = ev.error or "no endpoint"
            st.phase = Phase.STOPPED
            # The full error (log tail, paths) goes to the log; clients get the gist.
            short = ev.client_message or client_reason(error)
            message = f"backend for role {ev.role!r} failed to load: {short}; {SEE_LOG}"
            self._fail_waiters(ev.role, LoadFailedError, message)
            self._record("load_failed", ev.role, error, duration_s=took)
            tr.step = "cleanup"  # a half-started process must not keep holding memory
            self._out.append(StopBackend(ev.role))
            return
        self._load_seconds.append(took)
        st.phase = Phase.READY
        st.endpoint = ev.endpoint
        st.generation += 1
        st.loaded_at = now
        st.last_used = now
        st.waiting_reason = None
        st.logged_waits.clear()
        if any(w.take_slot for w in st.waiters):
            label = "request"
        elif any(w.no_evict for w in st.waiters):
            label = "warm-up"
        else:
            label = "load"
        self._record("loaded", ev.role, tr.cause, duration_s=took, label=label)
        self._transition = None
        self._grant(ev.role, st, now)

    def _on_stop_done(self, ev: StopDone, now: float) -> None:
        tr = self._transition
        if tr is None or tr.role != ev.role or tr.step not in ("stopping", "cleanup", "aborting"):
            return
        if ev.error is not None and tr.step != "cleanup":
            # stop must not wedge the node; the supervisor reaps what is left
            self._out.append(LogNote("warning", f"stopping {ev.role} failed: {ev.error}"))
        if tr.step == "cleanup":
            self._transition = None
        elif tr.step == "aborting":
            tr.pending.discard("stop")
            self._finish_abort(tr, now)
        else:
            self._finish_stop(tr, now)

    def _on_shutdown(self, now: float) -> None:
        if self.shutting_down:
            return
        self._shutdown_since = now
        tr = self._transition
        if tr is None:
            return
        tr.evict.clear()  # shutdown stops whatever is resident itself
        tr.load = None
        if tr.step == "loading":
            # A load may take minutes: abort it rather than wait (RoleBackends.stop
            # makes a start under way fail promptly).
            tr.step = "aborting"
            tr.pending = {"load", "stop"}
            self._out.append(StopBackend(tr.role))

    # ---- the decision step, after every event ------------------------------------------

    def _step(self, now: float) -> None:
        self._expire(now)
        tr = self._transition
        released = tr is not None and tr.step == "revoking" and self._roles[tr.role].in_flight == 0
        if tr is not None and tr.step == "revoking" and (released or now >= tr.revoke_until):
            self._issue_stop(tr, now)
        for role, st in self._roles.items():
            if not st.waiters:
                st.logged_waits.clear()
                continue
            if self.shutting_down:
                self._fail_waiters(role, ShuttingDownError, _SHUTTING_DOWN)
            self._grant(role, st, now)
        if self.shutting_down:
            self._shutdown_step(now)
            return
        if self._transition is not None:
            return
        if self._schedule_unloads(now):
            return
        if self._schedule_loads(now):
            return
        self._schedule_idle(now)

    def _expire(self, now: float) -> None:
        for role, st in self._roles.items():
            expired = [w for w in st.waiters if now - w.since >= w.timeout_s]
            if not expired:
                continue
            st.waiters = deque(w for w in st.waiters if w not in expired)
            why = st.waiting_reason or "still loading or busy"
            for w in expired:
                message = f"role {role!r} was not ready within {w.timeout_s:g} s ({why})"
                self._fail(w.ticket, QueueTimeoutError, message, self._retry_after())
            self._gauges(role)

    def _grant(self, role: str, st: _Role, now: float) -> None:
        """Hand leases to waiters, oldest first, while the role is ready and has free slots."""
        if st.phase is not Phase.READY or st.endpoint is None:
            return
        if st.unload_tickets:
            return  # an unload was asked: new requests wait and load the role again after it
        while st.waiters:
            waiter = st.waiters[0]
            if waiter.take_slot and st.in_flight >= self.limits.max_concurrency:
                break
            if waiter.take_slot and st.hold_since is not None and waiter.since >= st.hold_since:
                break  # an older request waits for this role's room: let it drain
            st.waiters.popleft()
            if waiter.take_slot:
                st.in_flight += 1
                st.last_used = now
            waited = now - waiter.since
            lease = GrantLease(
                waiter.ticket, role, st.endpoint, st.generation, waited, waiter.take_slot
            )
            self._out.append(lease)
        self._gauges(role)

    def _shutdown_step(self, now: float) -> None:
        if self._transition is not None or self._shut_down:
            return
        assert self._shutdown_since is not None
        busy = any(st.in_flight for st in self._roles.values())
        if busy and now - self._shutdown_since < self.limits.drain_s:
            return  # let in-flight requests finish, up to drain_s
        live = (Phase.READY, Phase.LOADING, Phase.RESTARTING)
        resident = [r for r, st in self._roles.items() if st.phase in live]
        if resident:
            self._begin_transition(resident, None, "shutdown", "shutdown", None, now)
            return
        for st in self._roles.values():
            self._out.extend(FinishUnload(t) for t in st.unload_tickets)  # stopped, as asked
            st.unload_tickets.clear()
        self._shut_down = True
        self._out.append(FinishShutdown())

    def _schedule_unloads(self, now: float) -> bool:
        for role, st in self._roles.items():
            if not st.unload_tickets:
                continue
            if st.phase is Phase.STOPPED:
                self._out.extend(FinishUnload(t) for t in st.unload_tickets)
                st.unload_tickets.clear()
                st.unload_since = None
                continue
            since = st.unload_since if st.unload_since is not None else now
            if st.phase is Phase.READY and (
                st.in_flight == 0 or now - since >= self.limits.drain_s
            ):
                self._begin_transition((role,), None, "unload", "unload", None, now)
                return True
        return False

    def _schedule_loads(self, now: float) -> bool:
        holds: dict[str, float] = {}
        try:
            return self._decide_loads(now, holds)
        finally:
            for role, st in self._roles.items():
                st.hold_since = holds.get(role)

    def _hold(
        self, blocking: Iterable[str], since: float, now: float, holds: dict[str, float]
    ) -> None:
        """Make busy ``blocking`` roles drain for a request that arrived at ``since``.

        Roles still inside their minimum residency are left alone: they cannot
        be evicted yet anyway, so serving their requests meanwhile costs nothing.
        """
        for b in blocking:
            st = self._roles[b]
            if st.phase is Phase.READY and st.in_flight > 0 and not self._recently_loaded(st, now):
                holds[b] = min(holds.get(b, since), since)

    def _decide_loads(self, now: float, holds: dict[str, float]) -> bool:
        pending = [
            (role, st)
            for role, st in self._roles.items()
            if st.phase is Phase.STOPPED and st.waiters
        ]
        pending.sort(key=lambda p: (not p[1].spec.interactive, p[1].waiters[0].since, p[0]))
        for role, st in pending:
            oldest = st.waiters[0].since
            drained = now - oldest >= self.limits.drain_s
            warm_up_only = all(w.no_evict for w in st.waiters)
            decision = decide(self._node_state(now, ignore_in_flight=drained), role)
            if isinstance(decision, AlreadyResident):
                continue
            if isinstance(decision, Refuse):
                yielding = self._exclusion_blockers(role)
                if yielding is not None:
                    # Exclusion precedence keeps the resident winner, but only while it
                    # is in use: an idle batch winner yields to a waiting request.
                    idle = [
                        b
                        for b in yielding
                        if self._can_yield(b, now)
                        or (drained and self._roles[b].phase is Phase.READY)
                    ]
                    if len(idle) == len(yielding):
                        st.waiting_reason = decision.reason
                        busy = [b for b in yielding if self._roles[b].in_flight]
                        state = f"busy past --drain {self.limits.drain_s:g} s" if busy else "idle"
                        cause = f"{state}, yields to waiting {role} (they exclude each other)"
                        self._begin_transition(yielding, None, cause, "exclusion", role, now)
                        return True
                    st.waiting_reason = f"{decision.reason}; waiting until it is idle"
                    if not warm_up_only:
                        self._hold(yielding, oldest, now, holds)
                    continue
                st.waiting_reason = decision.reason
                self._fail_waiters(role, RoleRefusedError, decision.reason)
                self._record("refused", role, decision.reason)
                continue
            if isinstance(decision, Wait):
                if decision.reason not in st.logged_waits:
                    st.logged_waits.add(decision.reason)
                    self._out.append(LogNote("info", f"{role} waits: {decision.reason}"))
                st.waiting_reason = decision.reason
                if not warm_up_only:
                    self._hold(decision.blocking, oldest, now, holds)
                continue
            assert isinstance(decision, Load)
            if decision.evict and warm_up_only:
                reason = f"not warmed up: it would evict {', '.join(decision.evict)}"
                self._fail_waiters(role, RoleRefusedError, reason)
                continue
            st.waiting_reason = decision.reason
            self._begin_transition(decision.evict, role, decision.reason, "make_room", role, now)
            return True
        return False

    def _schedule_idle(self, now: float) -> None:
        if math.isinf(self.limits.idle_ttl_s):
            return
        for role, st in self._roles.items():
            if (
                st.phase is Phase.READY
                and not st.spec.sticky
                and not st.spec.interactive
                and st.in_flight == 0
                and not st.waiters
                and now - st.last_used >= self.limits.idle_ttl_s
            ):
                cause = f"idle for {now - st.last_used:.0f} s"
                self._begin_transition((role,), None, cause, "idle_ttl", None, now)
                return

    def _exclusion_blockers(self, role: str) -> tuple[str, ...] | None:
        """The resident roles that exclude ``role``, if they are what keeps it out and
        may yield: ``None`` when none excludes it (the refusal is about memory) or
        when an interactive winner keeps out a batch role (interactive roles stay)."""
        spec = self._roles[role].spec
        blockers = tuple(
            other
            for other in self.resident()
            if other != role and excludes_each_other(spec, self._roles[other].spec)
        )
        if not blockers:
            return None
        if not spec.interactive and any(self._roles[b].spec.interactive for b in blockers):
            return None
        return blockers

    def _can_yield(self, role: str, now: float) -> bool:
        st = self._roles[role]
        return (
            st.phase is Phase.READY
            and st.in_flight == 0
            and not st.waiters
            and not self._recently_loaded(st, now)
        )

    def _recently_loaded(self, st: _Role, now: float) -> bool:
        return st.loaded_at is not None and now - st.loaded_at < self.limits.min_residency_s

    def _node_state(self, now: float, *, ignore_in_flight: bool) -> NodeState:
        resident = self.resident()
        busy: dict[str, int] = {}
        for role in resident:
            st = self._roles[role]
            if st.phase is not Phase.READY:
                busy[role] = 1  # loading or stopping: never a candidate to evict
            elif st.in_flight and not ignore_in_flight:
                busy[role] = st.in_flight
        recency = tuple(sorted(resident, key=lambda r: (self._roles[r].last_used, r)))
        recent = frozenset(r for r in resident if self._recently_loaded(self._roles[r], now))
        return NodeState(
            capacity_bytes=self.capacity_bytes,
            specs=self.specs,
            resident=frozenset(resident),
            in_flight=busy,
            recency=recency,
            recently_loaded=recent,
        )

    # ---- the transition (one per node at a time) -----------------------------------

    def _begin_transition(
        self,
        evict: Iterable[str],
        load: str | None,
        cause: str,
        label: str,
        for_role: str | None,
        now: float,
    ) -> None:
        """Start "stop ``evict``, then load ``load``". ``cause``: words for the log;
        ``label``: the eviction's metric label; ``for_role``: whom the evictions serve."""
        self._transition = _Transition(deque(evict), load, cause, label, for_role)
        self._advance(now)

    def _advance(self, now: float) -> None:
        tr = self._transition
        assert tr is not None
        if tr.evict:
            self._begin_stop(tr, tr.evict.popleft(), now)
        elif tr.load is not None:
            role, tr.load = tr.load, None
            st = self._roles[role]
            st.phase = Phase.LOADING
            tr.role, tr.step, tr.started = role, "loading", now
            self._record("loading", role, tr.cause)
            self._out.append(StartBackend(role))
        else:
            self._transition = None

    def _begin_stop(self, tr: _Transition, role: str, now: float) -> None:
        st = self._roles[role]
        st.phase = Phase.STOPPING
        cause = tr.cause if tr.load is None else f"evicted for {tr.load}: {tr.cause}"
        label = tr.label
        if tr.load is not None and excludes_each_other(self.specs[role], self.specs[tr.load]):
            label = "exclusion"
        tr.role = role
        cut = st.in_flight
        if cut:
            cause += f"; {cut} request(s) in flight cut after --drain {self.limits.drain_s:g} s"
            revocation = self._revocation(role, label, tr.for_role)
            self._out.append(RevokeLeases(role, st.generation, revocation))
            if label in ("make_room", "exclusion"):
                label = "drain"
        tr.stop_cause, tr.stop_label = cause, label
        if cut:
            # The router ends the revoked requests at once; their releases still
            # count against this generation. The stop waits for them, briefly.
            tr.step, tr.revoke_until = "revoking", now + REVOKE_WAIT_S
            return
        self._issue_stop(tr, now)

    def _issue_stop(self, tr: _Transition, now: float) -> None:
        st = self._roles[tr.role]
        st.generation += 1  # leases of the stopped process are void from here on
        tr.step, tr.started = "stopping", now
        self._record("stopping", tr.role, tr.stop_cause)
        self._out.append(StopBackend(tr.role))

    def _finish_stop(self, tr: _Transition, now: float) -> None:
        role = tr.role
        self._mark_stopped(role)
        took = now - tr.started
        self._record("stopped", role, tr.stop_cause, duration_s=took, label=tr.stop_label)
        self._gauges(role)
        self._advance(now)

    def _finish_abort(self, tr: _Transition, now: float) -> None:
        if tr.pending:
            return  # the start and the stop both report back
        self._mark_stopped(tr.role)
        if tr.loaded:
            took = now - tr.started
            self._record("stopped", tr.role, "shutdown", duration_s=took, label="shutdown")
        self._gauges(tr.role)
        self._transition = None

    def _mark_stopped(self, role: str) -> None:
        st = self._roles[role]
        st.phase = Phase.STOPPED
        st.endpoint = None
        st.in_flight = 0
        st.loaded_at = None

    def _revocation(self, role: str, label: str, for_role: str | None) -> Revocation:
        """What a client whose request to ``role`` is cut by this stop is told."""
        after = f"after --drain {self.limits.drain_s:g} s"
        if label == "shutdown":
            return Revocation(
                "shutting_down", f"rosterd is shutting down; role {role} was stopped {after}"
            )
        if label == "unload":
            why = "was unloaded (rosterd unload)"
        elif label == "exclusion" and for_role is not None:
            why = f"was unloaded for {for_role} (they exclude each other)"
        elif for_role is not None:
            why = f"was unloaded to make room for {for_role}"
        else:
            why = "was unloaded"
        return Revocation("evicted", f"role {role} {why} {after}")

    # ---- effects ---------------------------------------------------------------------

    def _retry_after(self) -> float:
        return max(1.0, self.typical_load_s())

    def _fail(
        self,
        ticket: int,
        error: type[SchedulerError],
        message: str,
        retry_after_s: float | None = None,
    ) -> None:
        self._out.append(FailWaiter(ticket, error, message, retry_after_s))

    def _fail_waiters(self, role: str, error: type[SchedulerError], message: str) -> None:
        """Fail every waiter of ``role`` with ``error(message)``; the queue is empty after."""
        st = self._roles[role]
        for w in st.waiters:
            self._fail(w.ticket, error, message)
        st.waiters.clear()
        self._gauges(role)

    def _record(
        self,
        kind: str,
        role: str,
        cause: str,
        *,
        duration_s: float | None = None,
        label: str | None = None,
    ) -> None:
        self._out.append(
            RecordEvent(
                kind=kind,
                role=role,
                cause=cause,
                resident=self.resident(),
                resident_bytes=self.resident_bytes(),
                duration_s=duration_s,
                label=label,
            )
        )

    def _gauges(self, role: str) -> None:
        st = self._roles[role]
        now = (st.in_flight, len(st.waiters))
        if now != st.gauges:
            st.gauges = now
            self._out.append(UpdateGauges(role, *now))
