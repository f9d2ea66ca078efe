"""A re-plan on one node (DESIGN.md layer 6, pure): the node machine's rules for
``SetCapacity``, ``SetConcurrency``, ``RetireRole``, ``ReplaceSpec`` and ``AddRole``.

A reload of the roster, overlay or fleet, or a node of the fleet lost, changes
what a node serves while it serves. The change reaches the node's machine as
these events (``rosterd.scheduler.events``), and :class:`ReplanRules` keeps them
under the machine's own rules: one transition per node, memory free only at
``StopDone``, no eviction under a request before ``drain_s``.

- **A new role** is stopped until a request wants it.
- **A retired role** takes no new request (``UnknownRoleError``); the requests
  it has are served; once it is idle (or ``drain_s`` after the retirement,
  cutting what is left) it stops, and then it is forgotten (``ForgetRole``).
  A role retired because it moved to another node fails the waiters it could
  not serve with ``RoleMovedError`` (the fleet scheduler queues them on the new
  node); a ``lost`` role, holding nothing, is forgotten at once.
- **A new spec with a restart** (what the role launches changed): the role
  grants no new lease; once its requests finished (or after ``drain_s``) it
  stops, takes the new spec and, if it was resident, loads again as a warm-up
  does (evicting nothing). Without a restart the spec applies at once.
- **A new exclusion** between two resident roles: one of them stops (the one with
  the residency policy's precedence stays: interactive, then sticky, then the
  smaller id), when idle or after ``drain_s``.
- **A new capacity**: while the resident roles hold more than it, they are
  evicted to fit (:func:`rosterd.residency.fit_to_capacity`: idle ones first,
  in the policy's eviction order); busy ones drain (no new leases to newer
  requests) and are cut after ``drain_s``.
- **A new node-wide concurrency limit** (the fleet's ``max_concurrency`` or the
  roles' slots changed) applies to the next grant; leases already given run on.

Evictions of a re-plan count under the metric label ``replan``. No clock, no
I/O, no logging: every event carries ``now`` and the rules return effects.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping

from rosterd.errors import RoleMovedError, UnknownRoleError
from rosterd.residency import fit_to_capacity, gib
from rosterd.scheduler.events import (
    AddRole,
    FinishShutdown,
    FinishUnload,
    ForgetRole,
    LogNote,
    ReplaceSpec,
    RetireRole,
    SetCapacity,
    SetConcurrency,
    StopBackend,
    UpdateGauges,
)
from rosterd.scheduler.state import MachineState, RoleState, Waiter
from rosterd.scheduler.values import HOLDS_MEMORY, NodeConcurrency, Phase, SchedulerLimits
from rosterd.spec import InferenceSpec, LatencyClass, MemorySpec

ReplanEvent = SetCapacity | SetConcurrency | RetireRole | ReplaceSpec | AddRole


def launch_changed(old: InferenceSpec, new: InferenceSpec) -> bool:
    """Whether ``new`` launches another backend than ``old`` (flavor, model, port): a
    change of scheduling facts only (memory figures, latency class, sticky, excludes)
    needs no restart, so a sticky role keeps its warm KV cache."""

    def launched(spec: InferenceSpec) -> InferenceSpec:
        return dataclasses.replace(
            spec, memory=MemorySpec(), sticky=True, latency_class=LatencyClass.BATCH, excludes=()
        )

    return launched(old) != launched(new)


#: The metric label (and event label) of an eviction a re-plan caused.
REPLAN_LABEL = "replan"


class ReplanRules(MachineState):
    """The re-plan half of :class:`~rosterd.scheduler.machine.NodeMachine` (see the module).

    ``NodeMachine`` calls :meth:`_on_replan` for the five events,
    :meth:`_settle_replan` early in every step and :meth:`_schedule_replan`
    when no transition is under way; it provides ``_begin_transition``.
    """

    def __init__(
        self,
        capacity_bytes: int,
        specs: Mapping[str, InferenceSpec],
        limits: SchedulerLimits,
        concurrency: NodeConcurrency | None = None,
    ) -> None:
        super().__init__(capacity_bytes, specs, limits, concurrency)
        self._over_since: float | None = None  # since when the resident roles exceed capacity
        self._conflict_since: float | None = None  # since when two resident roles exclude
        self._new_capacity = False  # SetCapacity came since the roles last fit
        # Restart loads are waiters nobody outside waits on: negative tickets, which no
        # node loop hands out, so their grants and failures are answered to no one.
        self._restart_tickets = itertools.count(-1, -1)

    def _begin_transition(
        self,
        evict: Iterable[str],
        load: str | None,
        cause: str,
        label: str,
        for_role: str | None,
        now: float,
    ) -> None:
        raise NotImplementedError  # NodeMachine's: stop ``evict``, then load ``load``

    def retiring(self, role: str) -> bool:
        """Whether ``role`` is retiring here (draining before it is forgotten)."""
        st = self._roles.get(role)
        return st is not None and st.retiring_since is not None

    # ---- events ----------------------------------------------------------------------

    def _on_replan(self, event: ReplanEvent, now: float) -> None:
        if isinstance(event, SetCapacity):
            self.capacity_bytes = event.capacity_bytes
            self._new_capacity = True
            if self.resident_bytes() > self.capacity_bytes and self._over_since is None:
                self._over_since = now
            self._out.append(LogNote("info", f"capacity is now {gib(event.capacity_bytes)}"))
        elif isinstance(event, SetConcurrency):
            self.concurrency = event.concurrency
        elif isinstance(event, RetireRole):
            self._on_retire(event.role, event.moved_to, now)
        elif isinstance(event, ReplaceSpec):
            self._on_replace_spec(event.spec, event.restart, now)
        else:
            st = self._roles.get(event.spec.role)
            if st is None:
                self.specs[event.spec.role] = event.spec
                self._roles[event.spec.role] = RoleState(event.spec)
                self._roles = dict(sorted(self._roles.items()))  # ties break by id
            else:
                st.retiring_since = st.moved_to = None  # taken back before it was forgotten
                if event.spec != st.spec or st.next_spec is not None:
                    self._on_replace_spec(event.spec, event.restart, now)

    def _on_retire(self, role: str, moved_to: str | None, now: float) -> None:
        st = self._roles.get(role)
        if st is None or st.retiring_since is not None:
            return
        st.retiring_since = now
        st.moved_to = moved_to
        if st.next_spec is not None:
            st.spec = self.specs[role] = st.next_spec  # it stops anyway; no restart
            st.next_spec, st.restart_after = None, False
        self._cancel_load_of(role)

    def _on_replace_spec(self, spec: InferenceSpec, restart: bool, now: float) -> None:
        role = spec.role
        st = self._roles.get(role)
        if st is None:
            return
        if st.next_spec is not None:
            st.next_spec = spec  # a restart is pending already: it takes this spec
            return
        if not restart or st.phase is Phase.STOPPED:
            self._cancel_load_of(role)  # a load decided on the old memory figure
            st.spec = self.specs[role] = spec
            return
        st.next_spec = spec
        st.respec_since = now
        st.restart_after = st.phase in HOLDS_MEMORY and st.phase is not Phase.STOPPING

    def _cancel_load_of(self, role: str) -> None:
        """Drop the pending load of ``role`` from the transition (and the evictions made
        for it that have not begun); its waiters are decided on again."""
        tr = self._transition
        if tr is not None and tr.load == role:
            tr.load = None
            if tr.for_role == role:
                tr.evict.clear()

    # ---- the step ----------------------------------------------------------------------

    def _settle_replan(self, now: float) -> None:
        """Forget retired roles that stopped; give stopped roles their pending spec (and
        queue their restart). Runs in every step, transition or not."""
        tr = self._transition
        held = set() if tr is None else {tr.role, *tr.evict, tr.load}
        for role in list(self._roles):
            st = self._roles[role]
            # A lost role holds nothing and its node does nothing: forget it at once.
            lost = st.phase is Phase.LOST and st.retiring_since is not None
            if (st.phase is not Phase.STOPPED and not lost) or role in held:
                continue
            if st.retiring_since is not None:
                self._forget(role, st)
            elif st.next_spec is not None:
                st.spec = self.specs[role] = st.next_spec
                st.next_spec = None
                if st.restart_after and not self.shutting_down:
                    ticket = next(self._restart_tickets)
                    timeout = self.limits.queue_timeout_s
                    restart_waiter = Waiter(ticket, now, timeout, False, True)
                    st.waiters.append(restart_waiter)
                    self._expires_at(restart_waiter)
                    self._gauges(role)
                st.restart_after = False

    def _forget(self, role: str, st: RoleState) -> None:
        del self._roles[role]
        del self.specs[role]
        why = f"role {role!r} is no longer served here (a re-plan removed it)"
        error: type[UnknownRoleError] = UnknownRoleError
        if st.moved_to is not None:
            why = f"role {role!r} moved to node {st.moved_to!r} (a re-plan)"
            error = RoleMovedError
        for w in st.waiters:
            self._fail(w.ticket, error, why)
        self._out.extend(FinishUnload(t) for t in st.unload_tickets)
        if st.gauges != (0, 0):
            self._out.append(UpdateGauges(role, 0, 0))
        self._out.append(LogNote("info", f"{role} retired: a re-plan removed it from this node"))
        self._out.append(ForgetRole(role))

    def _schedule_replan(self, now: float, holds: dict[str, float]) -> bool:
        """Begin the stop a re-plan needs next, if any (``True``); busy roles that must
        go for the capacity get their hold in ``holds``."""
        drain_s = self.limits.drain_s
        for role, st in self._roles.items():
            if st.retiring_since is not None:
                idle = st.in_flight == 0 and not st.waiters
                drained = now - st.retiring_since >= drain_s
                cause = "a re-plan removed it from this node"
            elif st.next_spec is not None:
                idle = st.in_flight == 0
                drained = now - st.respec_since >= drain_s
                cause = "a re-plan changed what it launches; restarting it"
            else:
                continue
            if st.phase is Phase.RESTARTING or (st.phase is Phase.READY and (idle or drained)):
                self._begin_transition((role,), None, cause, REPLAN_LABEL, None, now)
                return True
        return self._schedule_exclusions(now, holds) or self._schedule_fit(now, holds)

    def _schedule_exclusions(self, now: float, holds: dict[str, float]) -> bool:
        """Stop one of two resident roles that a re-plan made exclude each other (a new
        ``excludes`` applies at once, without a restart): the one kept has the residency
        policy's precedence (interactive, then sticky, then the smaller id); the other
        stops when idle, or after ``drain_s`` (newer requests wait meanwhile)."""
        held = [r for r, st in self._roles.items() if st.phase in HOLDS_MEMORY]
        pair = next(
            (
                (a, b)
                for i, a in enumerate(held)
                for b in held[i + 1 :]
                if b in self._roles[a].spec.excludes or a in self._roles[b].spec.excludes
            ),
            None,
        )
        if pair is None:
            self._conflict_since = None
            return False
        if self._conflict_since is None:
            self._conflict_since = now

        def keep_first(role: str) -> tuple[bool, bool, str]:
            # The residency policy's precedence (interactive, then sticky, then the
            # smaller id), so the set kept is the one requests would have led to.
            spec = self._roles[role].spec
            return (spec.latency_class is not LatencyClass.INTERACTIVE, not spec.sticky, role)

        keep, stop = sorted(pair, key=keep_first)
        st = self._roles[stop]
        if st.phase is not Phase.READY:
            return False  # a load or stop of it is under way: decided again after it
        if st.in_flight and now - self._conflict_since < self.limits.drain_s:
            holds[stop] = min(holds.get(stop, self._conflict_since), self._conflict_since)
            return False
        cause = f"a re-plan made it exclude {keep}, which stays resident"
        self._begin_transition((stop,), None, cause, REPLAN_LABEL, None, now)
        return True

    def _schedule_fit(self, now: float, holds: dict[str, float]) -> bool:
        if self.resident_bytes() <= self.capacity_bytes:
            self._over_since = None
            self._new_capacity = False
            return False
        if self._over_since is None:  # a resident role's memory grew
            self._over_since = now
        since = self._over_since
        drained = now - since >= self.limits.drain_s
        fit = fit_to_capacity(self._node_state(now, ignore_in_flight=drained, for_role=None))
        evict = [
            *fit.evict,
            *(b for b in fit.blocking if drained or self._roles[b].phase is Phase.RESTARTING),
        ]
        if evict:
            cause = (
                f"the node's capacity is now {gib(self.capacity_bytes)}: {fit.reason}"
                if self._new_capacity
                else f"a re-plan raised the resident roles' memory over the node's capacity "
                f"of {gib(self.capacity_bytes)}: {fit.reason}"
            )
            self._begin_transition(evict, None, cause, REPLAN_LABEL, None, now)
            return True
        for b in fit.blocking:  # they drain: newer requests wait for the capacity
            if self._roles[b].phase is Phase.READY and self._roles[b].in_flight:
                holds[b] = min(holds.get(b, since), since)
        return False

    # ---- shutdown: the last change, to serving nothing ----------------------------------

    def _on_shutdown(self, now: float, *, at_once: bool = False) -> None:
        if at_once:  # the drain is over now: in-flight requests are cut at the next step
            self._shutdown_since = min(self._shutdown_since or now, now - self.limits.drain_s)
        if self.shutting_down and not at_once:
            return
        if self._shutdown_since is None:
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

    def _shutdown_step(self, now: float) -> None:
        if self._transition is not None or self._shut_down:
            return
        assert self._shutdown_since is not None
        busy = any(st.in_flight for st in self._roles.values())
        if busy and now - self._shutdown_since < self.limits.drain_s:
            return  # let in-flight requests finish, up to drain_s
        live = (Phase.READY, Phase.LOADING, Phase.RESTARTING, Phase.UNHEALTHY)
        resident = [r for r, st in self._roles.items() if st.phase in live]
        if resident:
            self._begin_transition(resident, None, "shutdown", "shutdown", None, now)
            return
        for st in self._roles.values():
            self._out.extend(FinishUnload(t) for t in st.unload_tickets)  # stopped, as asked
            st.unload_tickets.clear()
        self._shut_down = True
        self._out.append(FinishShutdown())
