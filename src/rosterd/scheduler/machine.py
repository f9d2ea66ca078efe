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
after ``drain_s``, but a batch request lets a busy role serve its queue first
for up to ``max_wait_s`` (turns); an unload takes no new requests; minimum
residency (held only against the role it displaced, only while it has work);
exclusions yield when idle; idle TTL; a bounded queue; warm-up never evicts;
shutdown is an event.

This module keeps the event dispatch, the step after every event and the
transition; the rest of the rules are in the halves it extends:
:class:`~rosterd.scheduler.grants.GrantRules` (who gets a lease: per-role and
node-wide concurrency, queue timeouts), :class:`~rosterd.scheduler.health.HealthRules`
(probes, ``unhealthy``, crash restarts, load backoff, cancelled loads, a lost
node) and :class:`~rosterd.scheduler.replan.ReplanRules` (a new capacity, a
role added, retired or respecified). ``docs/scheduler.md`` states each rule and
draws the state table.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from rosterd.errors import (
    LoadFailedError,
    QueueFullError,
    RoleMovedError,
    RoleRefusedError,
    RoleUnavailableError,
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
    FinishUnload,
    LoadDone,
    LogNote,
    MeasuredPeak,
    NodeLost,
    ProbeDone,
    Reconfigure,
    Release,
    RevokeLeases,
    Shutdown,
    StartBackend,
    StopBackend,
    StopDone,
    Suspect,
    Tick,
    Unload,
)
from rosterd.scheduler.health import SEE_LOG, HealthRules
from rosterd.scheduler.replan import ReplanRules
from rosterd.scheduler.state import Transition, Waiter
from rosterd.scheduler.values import Phase, client_reason

#: How long a stop waits for the router to end revoked requests, seconds.
REVOKE_WAIT_S = 1.0

_SHUTTING_DOWN = "rosterd is shutting down"


class NodeMachine(HealthRules, ReplanRules):
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
        elif isinstance(event, NodeLost):
            self._on_node_lost(event)
        elif isinstance(event, LoadDone):
            self._on_load_done(event, now)
        elif isinstance(event, StopDone):
            self._on_stop_done(event, now)
        elif isinstance(event, Suspect):
            self._on_suspect(event)
        elif isinstance(event, ProbeDone):
            self._on_probe_done(event, now)
        elif isinstance(event, Shutdown):
            self._on_shutdown(now, at_once=event.at_once)
        elif isinstance(event, Reconfigure):
            self._on_reconfigure(event, now)
        elif isinstance(event, MeasuredPeak):
            self._on_measured_peak(event, now)
        else:
            assert isinstance(event, Tick)
        self._step(now)
        out, self._out = self._out, []
        return out

    # ---- events ---------------------------------------------------------------------

    def _on_acquire(self, ev: Acquire, now: float) -> None:
        st = self._roles.get(ev.role)
        if st is not None and st.moved_to is not None:
            moved = f"role {ev.role!r} moved to node {st.moved_to!r} (a re-plan)"
            self._fail(ev.ticket, RoleMovedError, moved)
        elif st is None or st.retiring_since is not None:
            self._fail(ev.ticket, UnknownRoleError, f"role {ev.role!r} is not placed on this node")
        elif st.unavailable is not None:
            why = f"role {ev.role!r} is unavailable: {client_reason(st.unavailable)}"
            self._fail(ev.ticket, RoleUnavailableError, why)  # no load is tried
        elif self.shutting_down:
            self._fail(ev.ticket, ShuttingDownError, _SHUTTING_DOWN)
        elif len(st.waiters) >= self.limits.max_queue:
            message = (
                f"role {ev.role!r} has {len(st.waiters)} requests queued "
                f"(limit {self.limits.max_queue}); retry later"
            )
            self._fail(ev.ticket, QueueFullError, message, self._retry_after())
        elif st.phase is Phase.STOPPED and st.backoff_until is not None and now < st.backoff_until:
            self._fail_backoff(ev.ticket, ev.role, now)
        else:
            waiter = Waiter(ev.ticket, now, ev.timeout_s, ev.take_slot, ev.no_evict, ev.newer_than)
            st.waiters.append(waiter)
            self._expires_at(waiter)
            self._gauges(ev.role)
            if ev.newer_than is not None and st.generation <= ev.newer_than:
                # The request failed on this backend before it answered, but no crash was
                # seen: find out whether it is alive (a restart gives a new generation).
                self._probe(ev.role, "a request could not reach its backend")

    def _on_unload(self, ev: Unload, now: float) -> None:
        st = self._roles.get(ev.role)
        if st is None:
            self._out.append(FinishUnload(ev.ticket))
            return
        st.unload_tickets.append(ev.ticket)
        if st.unload_since is None:
            st.unload_since = now

    def _on_load_done(self, ev: LoadDone, now: float) -> None:
        tr = self._transition
        if tr is None or tr.role != ev.role or tr.step not in ("loading", "aborting"):
            return  # not the start this machine asked for
        st = self._roles[ev.role]
        took = now - tr.started
        displaced = frozenset(st.evicted_for)
        st.evicted_for.clear()
        if tr.step == "aborting":
            tr.pending.discard("load")
            if ev.error is not None and tr.abort_label == "shutdown":
                self._record("load_failed", ev.role, ev.error, duration_s=took)
            elif ev.error is None:
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
            self._back_off(st, now)
            self._note_error(ev.role, f"load failed: {short}", now)
            self._record("load_failed", ev.role, error, duration_s=took)
            tr.step = "cleanup"  # a half-started process must not keep holding memory
            self._out.append(StopBackend(ev.role))
            return
        self._load_seconds.append(took)
        st.phase = Phase.READY
        st.endpoint = ev.endpoint
        st.generation += 1
        st.loaded_at = now
        st.last_used = st.last_probe = now
        st.displaced = displaced
        st.load_failures = 0
        st.backoff_until = None
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

    # ---- the decision step, after every event ------------------------------------------

    def _step(self, now: float) -> None:
        self._expire(now)
        self._settle_replan(now)
        tr = self._transition
        released = tr is not None and tr.step == "revoking" and self._roles[tr.role].running == 0
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
        self._schedule_probes(now)
        if self._transition is not None:
            self._cancel_unwanted_load(now)
            return
        if self._schedule_unloads(now):
            return
        holds: dict[str, float] = {}
        if self._schedule_replan(now, holds):
            return
        if self._schedule_loads(now, holds):
            return
        self._schedule_idle(now)

    def _schedule_unloads(self, now: float) -> bool:
        for role, st in self._roles.items():
            if not st.unload_tickets:
                continue
            if st.phase in (Phase.STOPPED, Phase.LOST):
                self._out.extend(FinishUnload(t) for t in st.unload_tickets)
                st.unload_tickets.clear()
                st.unload_since = None
                continue
            since = st.unload_since if st.unload_since is not None else now
            if st.phase is Phase.READY and (st.running == 0 or now - since >= self.limits.drain_s):
                self._begin_transition((role,), None, "unload", "unload", None, now)
                return True
        return False

    def _schedule_loads(self, now: float, holds: dict[str, float]) -> bool:
        try:
            return self._decide_loads(now, holds)
        finally:
            for role, st in self._roles.items():
                st.hold_since = holds.get(role)

    def _hold(
        self,
        blocking: Iterable[str],
        for_role: str,
        since: float,
        now: float,
        holds: dict[str, float],
    ) -> None:
        """Make busy ``blocking`` roles drain for a request that arrived at ``since``.

        Roles still inside their minimum residency are left alone: they cannot
        be evicted yet anyway, so serving their requests meanwhile costs nothing.
        So are roles in their turn (``_turn_left_s``): they serve their queue first.
        """
        waiting = self._roles[for_role]
        in_turn = self._turn_left_s(for_role, since, now) > 0
        for b in blocking:
            st = self._roles[b]
            recent = self._recently_loaded(st, now, for_role)
            # its own queue, not only requests in flight: a lone long request gets no
            # turn, its drain starts at once (as before turns)
            turn = in_turn and bool(st.waiters)
            waiting.turn_given = waiting.turn_given or turn
            if st.phase is Phase.READY and st.running > 0 and not recent and not turn:
                # After a turn, b grants nothing new, however old: its queue had its
                # turn and waits for the next one, so a backlog swaps once per turn.
                hold = -math.inf if waiting.turn_given else since
                holds[b] = min(holds.get(b, hold), hold)
                if waiting.turn_given and waiting.drain_from is None:
                    waiting.drain_from = now  # the turn is over: the drain starts now
        waiting.waiting_reason = (waiting.waiting_reason or "") + self._hold_note(
            blocking, for_role, since, now
        )

    def _decide_loads(self, now: float, holds: dict[str, float]) -> bool:
        pending = [
            (role, st)
            for role, st in self._roles.items()
            if st.phase is Phase.STOPPED and st.waiters
        ]
        for st in self._roles.values():
            if st.phase is not Phase.STOPPED or not st.waiters:
                st.turn_given, st.drain_from = False, None  # served, or nobody waits
        pending.sort(key=lambda p: (not p[1].spec.interactive, p[1].waiters[0].since, p[0]))
        for role, st in pending:
            if st.backoff_until is not None and now < st.backoff_until:
                for w in st.waiters:  # they came while the failed load was cleaned up
                    self._fail_backoff(w.ticket, role, now)
                st.waiters.clear()
                self._gauges(role)
                continue
            oldest = st.waiters[0].since
            drained = self._drained(role, oldest, now)
            warm_up_only = all(w.no_evict for w in st.waiters)
            node = self._node_state(now, ignore_in_flight=drained, for_role=role)
            decision = decide(node, role)
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
                        if self._can_yield(b, now, role)
                        or (drained and self._roles[b].phase is Phase.READY)
                    ]
                    if len(idle) == len(yielding):
                        st.waiting_reason = decision.reason
                        busy = [b for b in yielding if self._roles[b].running]
                        state = f"busy past --drain {self.limits.drain_s:g} s" if busy else "idle"
                        cause = f"{state}, yields to waiting {role} (they exclude each other)"
                        self._begin_transition(yielding, None, cause, "exclusion", role, now)
                        return True
                    st.waiting_reason = f"{decision.reason}; waiting until it is idle"
                    if not warm_up_only:
                        self._hold(yielding, role, oldest, now, holds)
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
                    self._hold(decision.blocking, role, oldest, now, holds)
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
                and st.running == 0
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
        cut = st.running
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
        for_state = self._roles.get(tr.for_role) if tr.for_role is not None else None
        if for_state is not None and tr.for_role != role:  # None too once it was retired
            for_state.evicted_for.add(role)  # min residency holds it against role
        took = now - tr.started
        self._record("stopped", role, tr.stop_cause, duration_s=took, label=tr.stop_label)
        self._gauges(role)
        self._advance(now)

    def _finish_abort(self, tr: Transition, now: float) -> None:
        if tr.pending:
            return  # the start and the stop both report back
        self._mark_stopped(tr.role)
        if tr.loaded or tr.abort_label != "shutdown":
            took = now - tr.started
            label = tr.abort_label
            cause = "shutdown" if label == "shutdown" else "load cancelled"
            self._record("stopped", tr.role, cause, duration_s=took, label=label)
        self._gauges(tr.role)
        self._transition = None
