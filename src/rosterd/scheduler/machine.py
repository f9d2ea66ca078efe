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

The machine is composed, not inherited: it holds the node's shared state
(:class:`~rosterd.scheduler.state.MachineState`) and the rule families, each a
class of its own with its own fields, built here and handed the state and the
families it works with: :class:`~rosterd.scheduler.grants.GrantRules` (who gets a
lease: per-role and node-wide concurrency, queue timeouts),
:class:`~rosterd.scheduler.transition.Transitions` (the one transition: stops, then
a load), :class:`~rosterd.scheduler.health.HealthRules` (probes, ``unhealthy``, crash
restarts, load backoff, cancelled loads, a lost node),
:class:`~rosterd.scheduler.loads.LoadRules` (what to load or evict, who waits),
:class:`~rosterd.scheduler.replan.ReplanRules` (``Reconfigure``, ``MeasuredPeak``),
:class:`~rosterd.scheduler.kv_saves.KvSaveRules` (a role's KV cache saved while it is
idle) and :class:`~rosterd.scheduler.shutdown.ShutdownRules`. This module keeps the event
dispatch, the step after every event (the order in which the families decide), the
answers of the transition's starts and stops, and the reads the node loop and
``/status`` make. ``docs/scheduler.md`` states each rule and draws the state table.
"""

from __future__ import annotations

from collections.abc import Mapping

from rosterd.errors import (
    LoadFailedError,
    QueueFullError,
    RoleMovedError,
    RoleUnavailableError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.scheduler.events import (
    Acquire,
    BackendChanged,
    Cancel,
    Effect,
    Event,
    FinishUnload,
    KvSaveDone,
    LoadDone,
    LogNote,
    MeasuredPeak,
    NodeLost,
    ProbeDone,
    Reconfigure,
    Release,
    Shutdown,
    StopBackend,
    StopDone,
    Suspect,
    Tick,
    Unload,
)
from rosterd.scheduler.grants import GrantRules
from rosterd.scheduler.health import SEE_LOG, HealthRules
from rosterd.scheduler.kv_saves import KvSaveRules
from rosterd.scheduler.loads import LoadRules
from rosterd.scheduler.replan import ReplanRules
from rosterd.scheduler.shutdown import ShutdownRules
from rosterd.scheduler.state import MachineState, Waiter
from rosterd.scheduler.transition import Transitions
from rosterd.scheduler.values import (
    DevicePool,
    NodeConcurrency,
    Phase,
    SchedulerLimits,
    client_reason,
)
from rosterd.scheduler.views import RoleSnapshot
from rosterd.spec import InferenceSpec

_SHUTTING_DOWN = "rosterd is shutting down"


class NodeMachine:
    """The pure scheduler of one node: ``handle(event) -> effects``.

    Built as ``NodeMachine(capacity_bytes, specs, limits, concurrency, unavailable=...,
    memory=..., devices=...)`` (see ``MachineState``).
    """

    def __init__(
        self,
        capacity_bytes: int,
        specs: Mapping[str, InferenceSpec],
        limits: SchedulerLimits,
        concurrency: NodeConcurrency | None = None,
        *,
        unavailable: Mapping[str, str] | None = None,
        memory: Mapping[str, Mapping[str, object]] | None = None,
        devices: Mapping[str, DevicePool] | None = None,
    ) -> None:
        state = MachineState(
            capacity_bytes,
            specs,
            limits,
            concurrency,
            unavailable=unavailable,
            memory=memory,
            devices=devices,
        )
        self.state = state
        self.grants = GrantRules(state)
        self.transitions = Transitions(state)
        self.health = HealthRules(state, self.grants, self.transitions)
        self.shutdown = ShutdownRules(state, self.transitions)
        self.loads = LoadRules(state, self.health, self.transitions)
        self.replan = ReplanRules(state, self.grants, self.transitions, self.shutdown)
        self.kv_saves = KvSaveRules(state)

    # ---- what the node loop and /status read ---------------------------------------

    @property
    def capacity_bytes(self) -> int:
        """The node's budget in force."""
        return self.state.capacity_bytes

    @property
    def specs(self) -> dict[str, InferenceSpec]:
        """Every role the machine holds (placed or retiring) -> its spec in force."""
        return self.state.specs

    @property
    def lost_reason(self) -> str | None:
        """Why the node is lost (``NodeLost``), ``None`` while it is not."""
        return self.state.lost_reason

    @property
    def shutting_down(self) -> bool:
        """Whether ``Shutdown`` was handled."""
        return self.shutdown.under_way

    @property
    def transition_under_way(self) -> bool:
        """Whether a start or stop is under way on the node."""
        return self.transitions.under_way

    def resident(self) -> tuple[str, ...]:
        """The roles holding memory, by id (``MachineState.resident``)."""
        return self.state.resident()

    def resident_bytes(self) -> int:
        """The spec bytes of :meth:`resident`."""
        return self.state.resident_bytes()

    def node_running(self) -> int:
        """Leases taken with a slot across the node's roles: requests running now."""
        return self.state.node_running()

    def node_limit(self) -> int | None:
        """Generations the node may run at once now (``None``: no node-wide limit)."""
        return self.state.node_limit()

    def placed(self) -> dict[str, InferenceSpec]:
        """The roles placed here, with the spec each serves (``MachineState.placed``)."""
        return self.state.placed()

    def role_ids(self) -> tuple[str, ...]:
        """Every role the machine holds: placed, or retiring, by id."""
        return self.state.role_ids()

    def serves(self, role: str) -> bool:
        """Whether ``role`` takes requests here: placed, not retiring, not unavailable."""
        return self.state.serves(role)

    def copy_load(self, role: str) -> tuple[Phase, bool, int]:
        """``role``'s phase, whether it is suspect, and its requests, queued or running
        (``MachineState.copy_load``)."""
        return self.state.copy_load(role)

    def copy_slots(self, role: str) -> int:
        """How many of ``role``'s requests run here at once before the next waits for a
        slot, at least 1: its own cap (``GrantRules.role_cap``: ``max_concurrency`` and
        its backend's parallel slots), no more than the node-wide limit when there is one.
        What the choice among a role's copies counts as a copy's slots
        (``rosterd.replica_choice.Copy.slots``)."""
        slots = self.grants.role_cap(role)
        node_limit = self.state.node_limit()
        if node_limit is not None:
            slots = min(slots, node_limit)
        return max(1, slots)

    def waiting_reason(self, role: str) -> str | None:
        """Why ``role``'s waiters wait, as last decided (``None``: nothing said)."""
        return self.state.waiting_reason(role)

    def role_snapshot(self, role: str, now: float) -> RoleSnapshot:
        """``role``'s state at ``now``, read-only (``MachineState.role_snapshot``)."""
        return self.state.role_snapshot(role, now)

    # ---- the one entry point ----------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply ``event``; the effects to carry out, in order.

        ``now`` never goes back: an event older than one already handled counts
        as happening at the later time.
        """
        now = self.state.now = max(self.state.now, event.now)
        self.state.out = []
        if isinstance(event, Acquire):
            self._on_acquire(event, now)
        elif isinstance(event, Cancel):
            self.grants.on_cancel(event)
        elif isinstance(event, Release):
            self.grants.on_release(event, now)
        elif isinstance(event, Unload):
            self._on_unload(event, now)
        elif isinstance(event, BackendChanged):
            self.health.on_backend_changed(event, now)
        elif isinstance(event, NodeLost):
            self.health.on_node_lost(event)
        elif isinstance(event, LoadDone):
            self._on_load_done(event, now)
        elif isinstance(event, StopDone):
            self._on_stop_done(event, now)
        elif isinstance(event, Suspect):
            self.health.on_suspect(event)
        elif isinstance(event, ProbeDone):
            self.health.on_probe_done(event, now)
        elif isinstance(event, KvSaveDone):
            self.kv_saves.on_saved(event)
        elif isinstance(event, Shutdown):
            self.shutdown.on_shutdown(now, at_once=event.at_once)
        elif isinstance(event, Reconfigure):
            self.replan.on_reconfigure(event, now)
        elif isinstance(event, MeasuredPeak):
            self.replan.on_measured_peak(event, now)
        else:
            assert isinstance(event, Tick)
        self._step(now)
        out, self.state.out = self.state.out, []
        return out

    def _on_acquire(self, ev: Acquire, now: float) -> None:
        st = self.state.roles.get(ev.role)
        if st is not None and st.moved_to is not None:
            moved = f"role {ev.role!r} moved to node {st.moved_to!r} (a re-plan)"
            self.state.fail(ev.ticket, RoleMovedError, moved)
        elif st is None or st.retiring_since is not None:
            self.state.fail(
                ev.ticket, UnknownRoleError, f"role {ev.role!r} is not placed on this node"
            )
        elif st.unavailable is not None:
            why = f"role {ev.role!r} is unavailable: {client_reason(st.unavailable)}"
            self.state.fail(ev.ticket, RoleUnavailableError, why)  # no load is tried
        elif self.shutdown.under_way:
            self.state.fail(ev.ticket, ShuttingDownError, _SHUTTING_DOWN)
        elif len(st.waiters) >= self.state.limits.max_queue:
            message = (
                f"role {ev.role!r} has {len(st.waiters)} requests queued "
                f"(limit {self.state.limits.max_queue}); retry later"
            )
            self.state.fail(ev.ticket, QueueFullError, message, self.state.retry_after())
        elif st.phase is Phase.STOPPED and st.backoff_until is not None and now < st.backoff_until:
            self.health.fail_backoff(ev.ticket, ev.role, now)
        else:
            waiter = Waiter(ev.ticket, now, ev.timeout_s, ev.take_slot, ev.no_evict, ev.newer_than)
            st.waiters.append(waiter)
            self.grants.expires_at(waiter)
            self.state.gauges(ev.role)
            if ev.newer_than is not None and st.generation <= ev.newer_than:
                # The request failed on this backend before it answered, but no crash was
                # seen: find out whether it is alive (a restart gives a new generation).
                self.health.probe(ev.role, "a request could not reach its backend")

    def _on_unload(self, ev: Unload, now: float) -> None:
        st = self.state.roles.get(ev.role)
        if st is None:
            self.state.out.append(FinishUnload(ev.ticket))
            return
        st.unload_tickets.append(ev.ticket)
        if st.unload_since is None:
            st.unload_since = now

    def _on_load_done(self, ev: LoadDone, now: float) -> None:
        tr = self.transitions.current
        if tr is None or tr.role != ev.role or tr.step not in ("loading", "aborting"):
            return  # not the start this machine asked for
        st = self.state.roles[ev.role]
        took = now - tr.started
        displaced = frozenset(st.evicted_for)
        st.evicted_for.clear()
        if tr.step == "aborting":
            tr.pending.discard("load")
            if ev.error is not None and tr.abort_label == "shutdown":
                self.state.record("load_failed", ev.role, ev.error, duration_s=took)
            elif ev.error is None:
                tr.loaded = True  # the stop under way stops it
            self.transitions.finish_abort(tr, now)
            return
        if ev.error is not None or ev.endpoint is None:
            error = ev.error or "no endpoint"
            st.phase = Phase.STOPPED
            # The full error (log tail, paths) goes to the log; clients get the gist.
            short = ev.client_message or client_reason(error)
            message = f"backend for role {ev.role!r} failed to load: {short}; {SEE_LOG}"
            self.state.fail_waiters(ev.role, LoadFailedError, message)
            self.health.back_off(st, now)
            self.state.note_error(ev.role, f"load failed: {short}", now)
            self.state.record("load_failed", ev.role, error, duration_s=took)
            tr.step = "cleanup"  # a half-started process must not keep holding memory
            self.state.out.append(StopBackend(ev.role))
            return
        self.state.load_seconds.append(took)
        st.phase = Phase.READY
        st.endpoint = ev.endpoint
        st.generation += 1
        st.loaded_at = now
        st.last_used = st.last_probe = now
        st.displaced = displaced
        st.load_failures = 0
        st.kv_changed = st.kv_saving = False  # what it restored is saved already
        st.backoff_until = None
        st.waiting_reason = None
        st.logged_waits.clear()
        if any(w.take_slot for w in st.waiters):
            label = "request"
        elif any(w.no_evict for w in st.waiters):
            label = "warm-up"
        else:
            label = "load"
        self.state.record("loaded", ev.role, tr.cause, duration_s=took, label=label)
        self.transitions.current = None
        self.grants.grant(ev.role, st, now)

    def _on_stop_done(self, ev: StopDone, now: float) -> None:
        tr = self.transitions.current
        if tr is None or tr.role != ev.role or tr.step not in ("stopping", "cleanup", "aborting"):
            return
        if ev.error is not None and tr.step != "cleanup":
            # stop must not wedge the node; the supervisor reaps what is left
            self.state.out.append(LogNote("warning", f"stopping {ev.role} failed: {ev.error}"))
        if tr.step == "cleanup":
            self.transitions.current = None
        elif tr.step == "aborting":
            tr.pending.discard("stop")
            self.transitions.finish_abort(tr, now)
        else:
            self.transitions.finish_stop(tr, now)

    def _step(self, now: float) -> None:
        """After every event, the families decide in this order: queue timeouts, the re-plan
        settled (retired roles forgotten, new specs taken), a revoking stop issued, the
        grants; then shutdown alone, or the probes, the idle KV saves and, with the node
        still, one of: an unload, a re-plan's stop, a load (or the evictions it needs), an
        idle TTL."""
        self.grants.expire(now)
        self.replan.settle(now)
        tr = self.transitions.current
        released = (
            tr is not None and tr.step == "revoking" and self.state.roles[tr.role].running == 0
        )
        if tr is not None and tr.step == "revoking" and (released or now >= tr.revoke_until):
            self.transitions.issue_stop(tr, now)
        granted = 1
        while granted:  # again while grants happen: a waiter may have deferred to an older one
            granted = 0
            for role, st in self.state.roles.items():
                if not st.waiters:
                    st.logged_waits.clear()
                    continue
                if self.shutdown.under_way:
                    self.state.fail_waiters(role, ShuttingDownError, _SHUTTING_DOWN)
                granted += self.grants.grant(role, st, now)
            if self.state.concurrency is None:
                break  # no waiter defers without a node-wide limit
        if self.shutdown.under_way:
            self.shutdown.step(now)
            return
        self.health.schedule_probes(now)
        self.kv_saves.schedule(now)
        if self.transitions.current is not None:
            self.health.cancel_unwanted_load(now)
            return
        if self.loads.schedule_unloads(now):
            return
        holds: dict[str, float] = {}
        if self.replan.schedule(now, holds):
            return
        if self.loads.schedule_loads(now, holds):
            return
        self.loads.schedule_idle(now)
