"""The node state machine (DESIGN.md layer 6, pure): one node's resident set.

``NodeMachine.handle(event)`` takes one event (``rosterd.scheduler.events``)
and returns the effects the node loop must apply, in order. It reads no clock
(every event carries ``now``), does no I/O, never logs (it returns
``LogNote``/``RecordEvent`` effects) and holds no asyncio object; the same
events give the same effects. The residency policy
(:func:`rosterd.residency.decide`) says what to load or evict; this machine
says when, keeping the rules of issue 5 and USERS.md: one shared load per role;
one transition per node, memory free only at ``StopDone``; no eviction under a
request, busy roles drain in arrival order (``hold_since``) and are revoked
after ``drain_s``; an unload takes no new requests; minimum residency;
exclusions yield when idle; idle TTL; crash restarts as ``restarting``;
per-role and node-wide concurrency (oldest request first across the node's
roles), a bounded queue and queue timeouts; warm-up never
evicts; shutdown is an event. ``docs/scheduler.md`` states each rule and
draws the state table.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable

from rosterd.errors import (
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.residency import (
    AlreadyResident,
    Load,
    Refuse,
    Wait,
    decide,
    excludes_each_other,
)
from rosterd.scheduler.events import (
    Acquire,
    BackendChanged,
    Cancel,
    Effect,
    Event,
    FinishShutdown,
    FinishUnload,
    GrantLease,
    LoadDone,
    LogNote,
    Release,
    RevokeLeases,
    Shutdown,
    StartBackend,
    StopBackend,
    StopDone,
    Tick,
    Unload,
)
from rosterd.scheduler.state import MachineState, RoleState, Transition, Waiter
from rosterd.scheduler.values import (
    Phase,
    client_reason,
)

#: How long a stop waits for the router to end revoked requests, seconds.
REVOKE_WAIT_S = 1.0

#: Where a client whose request failed on a backend is pointed for the details.
SEE_LOG = "see `rosterd ps` / the backend log"

_SHUTTING_DOWN = "rosterd is shutting down"


class NodeMachine(MachineState):
    """The pure scheduler of one node: ``handle(event) -> effects``.

    Built as ``NodeMachine(capacity_bytes, specs, limits, concurrency)`` (see ``MachineState``).
    """

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
            st.waiters.append(Waiter(ev.ticket, now, ev.timeout_s, ev.take_slot, ev.no_evict))
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
        granted = 1
        while granted:  # again while grants happen: a waiter may have deferred to an older one
            granted = 0
            for role, st in self._roles.items():
                if not st.waiters:
                    st.logged_waits.clear()
                    continue
                if self.shutting_down:
                    self._fail_waiters(role, ShuttingDownError, _SHUTTING_DOWN)
                granted += self._grant(role, st, now)
            if self.concurrency is None:
                break  # no waiter defers without a node-wide limit
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

    def _grant(self, role: str, st: RoleState, now: float) -> int:
        """Hand leases to waiters, oldest first, while the role is ready and has free slots;
        how many were granted.

        With a node-wide limit, a slot goes to the oldest waiter of the node: a
        waiter defers to an older one of another role that could take it now.
        """
        granted = 0
        while self._grantable(st):
            assert st.endpoint is not None  # a ready role has one (see _grantable)
            waiter = st.waiters[0]
            if waiter.take_slot and self._older_elsewhere(role, waiter.since):
                break  # the node's free slot is that older request's
            st.waiters.popleft()
            granted += 1
            if waiter.take_slot:
                st.in_flight += 1
                st.last_used = now
            waited = now - waiter.since
            lease = GrantLease(
                waiter.ticket, role, st.endpoint, st.generation, waited, waiter.take_slot
            )
            self._out.append(lease)
        if st.waiters and st.phase is Phase.READY and not self._node_slot_free():
            st.waiting_reason = (
                f"the node already runs {self.node_in_flight()} generations at once, "
                "its limit (the node's max_concurrency)"
            )
        self._gauges(role)
        return granted

    def _grantable(self, st: RoleState) -> bool:
        """Whether ``st``'s oldest waiter can be granted now."""
        if st.phase is not Phase.READY or st.endpoint is None or not st.waiters:
            return False
        if st.unload_tickets:
            return False  # an unload was asked: new requests wait and load the role again after it
        waiter = st.waiters[0]
        if not waiter.take_slot:
            return True
        if st.in_flight >= self.limits.max_concurrency:
            return False
        if st.hold_since is not None and waiter.since >= st.hold_since:
            return False  # an older request waits for this role's room: let it drain
        return self._node_slot_free()

    def _node_slot_free(self) -> bool:
        limit = self.node_limit()
        return limit is None or self.node_in_flight() < limit

    def _older_elsewhere(self, role: str, since: float) -> bool:
        """Whether, under a node-wide limit, another role's grantable request is older."""
        if self.concurrency is None:
            return False
        for other, st in self._roles.items():
            if other != role and self._grantable(st):
                head = st.waiters[0]
                if head.take_slot and head.since < since:
                    return True
        return False

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
        self._transition = Transition(deque(evict), load, cause, label, for_role)
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

    def _begin_stop(self, tr: Transition, role: str, now: float) -> None:
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

    def _issue_stop(self, tr: Transition, now: float) -> None:
        st = self._roles[tr.role]
        st.generation += 1  # leases of the stopped process are void from here on
        tr.step, tr.started = "stopping", now
        self._record("stopping", tr.role, tr.stop_cause)
        self._out.append(StopBackend(tr.role))

    def _finish_stop(self, tr: Transition, now: float) -> None:
        role = tr.role
        self._mark_stopped(role)
        took = now - tr.started
        self._record("stopped", role, tr.stop_cause, duration_s=took, label=tr.stop_label)
        self._gauges(role)
        self._advance(now)

    def _finish_abort(self, tr: Transition, now: float) -> None:
        if tr.pending:
            return  # the start and the stop both report back
        self._mark_stopped(tr.role)
        if tr.loaded:
            took = now - tr.started
            self._record("stopped", tr.role, "shutdown", duration_s=took, label="shutdown")
        self._gauges(tr.role)
        self._transition = None
