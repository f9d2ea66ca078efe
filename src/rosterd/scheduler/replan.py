"""A re-plan on one node (DESIGN.md layer 6, pure): the node machine's rules for
``Reconfigure`` and ``MeasuredPeak``.

A reload of the roster, overlay or fleet, or a node of the fleet lost, changes
what a node serves while it serves. The change reaches the node's machine as one
event, ``Reconfigure`` (``rosterd.scheduler.events``): the desired state whole
(specs, capacity, concurrency, unavailable roles, memory figures, what must
restart, what moved). :class:`ReplanRules` compares it with the machine's own
state and acts on the difference, level-based as controller-runtime's reconciler
does: the same desired state taken twice changes nothing, and nothing depends on
what came before it. The changes stay under the machine's own rules: one
transition per node, memory free only at ``StopDone``, no eviction under a
request before ``drain_s``.

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
  requests) and are cut after ``drain_s``. The same per device pool (issue 29): a
  device whose resident roles hold more than its new capacity (a reload declared a
  smaller ``memory_gb`` or a larger ``reserved_gb``) or whose roles grew past it evicts
  what that pool chooses, by the same rule, at once.
- **A new node-wide concurrency limit** (the fleet's ``max_concurrency`` or the
  roles' slots changed) applies to the next grant; leases already given run on.
- **A measured peak** (``MeasuredPeak``) past the counted figure by more than
  :data:`MEASURED_OVER_COUNTED`: the count follows the measurement, as a new spec
  without a restart does (the spec's overhead grows by the difference).

Evictions of a re-plan count under the metric label ``replan``. No clock, no
I/O, no logging: every event carries ``now`` and the rules return effects.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Final

from rosterd.errors import RoleMovedError, UnknownRoleError
from rosterd.residency import fit_to_capacity, gib
from rosterd.scheduler.events import (
    FinishUnload,
    ForgetRole,
    LogNote,
    MeasuredPeak,
    Reconfigure,
    Reconfigured,
    UpdateGauges,
)
from rosterd.scheduler.grants import GrantRules
from rosterd.scheduler.shutdown import ShutdownRules
from rosterd.scheduler.state import MachineState, RoleState, Waiter
from rosterd.scheduler.transition import Transitions
from rosterd.scheduler.values import (
    HOLDS_MEMORY,
    NodeChange,
    Phase,
)
from rosterd.spec import InferenceSpec, LatencyClass, MemorySpec

#: How far a running backend's measured RSS may pass the figure counted for it before the
#: count follows the measurement (issue 20: llama-server's RAM prompt cache grew one role
#: to 1.85x its counted figure over twelve conversations, and nothing was said).
MEASURED_OVER_COUNTED: Final[float] = 1.10


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


class ReplanRules:
    """The re-plan rules of :class:`~rosterd.scheduler.machine.NodeMachine` (see the module).

    ``NodeMachine`` calls :meth:`on_reconfigure` and :meth:`on_measured_peak` for their
    events, :meth:`settle` early in every step and :meth:`schedule` when no transition
    is under way. ``state``: the node's shared state; ``grants``, ``transitions``,
    ``shutdown``: the rules it works with. It owns its timers: since when the resident
    roles exceed the capacity, since when two of them exclude each other.
    """

    def __init__(
        self,
        state: MachineState,
        grants: GrantRules,
        transitions: Transitions,
        shutdown: ShutdownRules,
    ) -> None:
        self.state = state
        self.grants = grants
        self.transitions = transitions
        self.shutdown = shutdown
        self._over_since: float | None = None  # since when the resident roles exceed capacity
        self._conflict_since: float | None = None  # since when two resident roles exclude
        self._new_capacity = False  # a Reconfigure changed the budget since the roles last fit
        # The same per device pool: since when its resident roles exceed it, and the devices
        # whose capacity a Reconfigure changed since their roles last fit.
        self._device_over_since: dict[str, float] = {}
        self._new_device_capacity: set[str] = set()
        # Restart loads are waiters nobody outside waits on: negative tickets, which no
        # node loop hands out, so their grants and failures are answered to no one.
        self._restart_tickets = itertools.count(-1, -1)

    def on_reconfigure(self, ev: Reconfigure, now: float) -> None:
        """Compare ``ev``'s desired state with the machine's own and act on the difference
        (level-based: what woke it does not matter, and the same state twice changes
        nothing). What changed goes out as ``Reconfigured``."""
        placed = self.state.placed()  # each role's spec in force, or the one it restarts with
        before = self.state.capacity_bytes
        if ev.capacity_bytes != before:
            self.state.capacity_bytes = ev.capacity_bytes
            self._new_capacity = True
            if self.state.resident_bytes() > self.state.capacity_bytes and self._over_since is None:
                self._over_since = now
            self.state.out.append(LogNote("info", f"capacity is now {gib(ev.capacity_bytes)}"))
        if ev.concurrency is not None:
            self.state.concurrency = ev.concurrency
        devices_changed: list[tuple[str, int, int]] = []
        if dict(ev.devices) != self.state.devices:
            # Level-based as the rest: the pools in force from now on; a load asks each, and
            # a pool its resident roles no longer fit evicts at once (``_schedule_fit``).
            for device, pool in sorted(ev.devices.items()):
                was = self.state.devices.get(device)
                if was is not None and was.capacity_bytes != pool.capacity_bytes:
                    self._new_device_capacity.add(device)
                    devices_changed.append((device, was.capacity_bytes, pool.capacity_bytes))
                    self.state.out.append(
                        LogNote(
                            "info", f"device {device}: capacity is now {gib(pool.capacity_bytes)}"
                        )
                    )
            self.state.devices = dict(ev.devices)
        retired = sorted(set(placed) - set(ev.specs))
        added = sorted(set(ev.specs) - set(placed))
        restarted: list[str] = []
        updated: list[str] = []
        for role in retired:
            self._on_retire(role, ev.moved.get(role), now)
        for role in sorted(set(placed) & set(ev.specs)):
            new = ev.specs[role]
            if role in ev.restart or launch_changed(placed[role], new):
                restarted.append(role)
                self._on_replace_spec(new, True, now)
            elif new != placed[role]:
                updated.append(role)
                self._on_replace_spec(new, False, now)
        for role in added:
            self._add_role(ev.specs[role], ev.restart, now)
        for role, st in self.state.roles.items():
            st.unavailable = ev.unavailable.get(role) if role in ev.specs else None
            figures = ev.memory.get(role)
            if figures is not None:
                st.memory = dict(figures)
        changed = (before, ev.capacity_bytes) if ev.capacity_bytes != before else None
        change = NodeChange(
            tuple(added),
            tuple(retired),
            tuple(restarted),
            tuple(updated),
            changed,
            tuple(devices_changed),
        )
        self.state.out.append(Reconfigured(change))

    def _add_role(self, spec: InferenceSpec, restart: frozenset[str], now: float) -> None:
        """Place ``spec.role`` here: stopped until a request wants it, or, still retiring,
        taken back (restarting if what it launches changed, or it is named in ``restart``)."""
        st = self.state.roles.get(spec.role)
        if st is None:
            self.state.specs[spec.role] = spec
            self.state.roles[spec.role] = RoleState(spec)
            self.state.roles = dict(sorted(self.state.roles.items()))  # ties break by id
            return
        st.retiring_since = st.moved_to = None  # taken back before it was forgotten
        again = spec.role in restart or launch_changed(st.spec, spec)
        if spec != st.spec or st.next_spec is not None:
            self._on_replace_spec(spec, again, now)

    def on_measured_peak(self, ev: MeasuredPeak, now: float) -> None:
        """Show ``ev.run_peak_bytes``; count ``ev.peak_bytes`` from now on when it passes
        the counted figure by more than ``MEASURED_OVER_COUNTED``: the spec's overhead
        grows by the difference, at once, without a restart (the machine evicts other
        roles if the node no longer fits, as for a re-plan). Said once per role."""
        st = self.state.roles.get(ev.role)
        if st is None:
            return
        self._measured_on_devices(ev)
        if st.memory is not None:
            st.memory["run_peak_bytes"] = ev.run_peak_bytes
        spec = st.next_spec or st.spec
        counted = spec.memory.resident_bytes
        if st.retiring_since is not None or ev.peak_bytes <= counted * MEASURED_OVER_COUNTED:
            return
        grown = dataclasses.replace(
            spec,
            memory=dataclasses.replace(
                spec.memory, overhead_bytes=spec.memory.overhead_bytes + ev.peak_bytes - counted
            ),
        )
        if st.memory is not None:
            st.memory.update(counted_bytes=ev.peak_bytes, counted_from="live")
        if not st.grew:
            st.grew = True
            self.state.out.append(
                LogNote(
                    "warning",
                    f"role {ev.role} holds {ev.peak_bytes / 2**20:.0f} MiB, "
                    f"{(ev.peak_bytes / counted - 1) * 100:.0f}% more than the "
                    f"{counted / 2**20:.0f} MiB counted for it; counting what it holds from now on",
                )
            )
        self._on_replace_spec(grown, False, now)

    def _measured_on_devices(self, ev: MeasuredPeak) -> None:
        """Per device ``ev`` measured: the pool counts what the role holds there from now
        on when it passes the bytes counted by more than ``MEASURED_OVER_COUNTED`` (the
        host's rule, per pool; issue 29). Said once per role and device; where the device
        no longer holds its resident roles, it evicts to fit at once
        (:meth:`_schedule_device_fit`), as host RAM does."""
        for device, held in sorted(ev.device_bytes.items()):
            pool = self.state.devices.get(device)
            counted = pool.bytes_by_role.get(ev.role) if pool is not None else None
            if pool is None or counted is None or held <= counted * MEASURED_OVER_COUNTED:
                continue
            grown = {**pool.bytes_by_role, ev.role: held}
            self.state.devices[device] = dataclasses.replace(pool, bytes_by_role=grown)
            self.state.out.append(
                LogNote(
                    "warning",
                    f"role {ev.role} holds {held / 2**20:.0f} MiB on device {device}, "
                    f"{(held / max(counted, 1) - 1) * 100:.0f}% more than the "
                    f"{counted / 2**20:.0f} MiB counted for it there; counting what it holds "
                    "from now on",
                )
            )

    def _on_retire(self, role: str, moved_to: str | None, now: float) -> None:
        st = self.state.roles.get(role)
        if st is None or st.retiring_since is not None:
            return
        st.retiring_since = now
        st.moved_to = moved_to
        if st.next_spec is not None:
            st.spec = self.state.specs[role] = st.next_spec  # it stops anyway; no restart
            st.next_spec, st.restart_after = None, False
        self.transitions.cancel_load_of(role)

    def _on_replace_spec(self, spec: InferenceSpec, restart: bool, now: float) -> None:
        role = spec.role
        st = self.state.roles.get(role)
        if st is None:
            return
        if st.next_spec is not None:
            st.next_spec = spec  # a restart is pending already: it takes this spec
            return
        if not restart or st.phase is Phase.STOPPED:
            self.transitions.cancel_load_of(role)  # a load decided on the old memory figure
            st.spec = self.state.specs[role] = spec
            return
        st.next_spec = spec
        st.respec_since = now
        st.restart_after = st.phase in HOLDS_MEMORY and st.phase is not Phase.STOPPING

    def settle(self, now: float) -> None:
        """Forget retired roles that stopped; give stopped roles their pending spec (and
        queue their restart). Runs in every step, transition or not."""
        tr = self.transitions.current
        held = set() if tr is None else {tr.role, *tr.evict, tr.load}
        for role in list(self.state.roles):
            st = self.state.roles[role]
            # A lost role holds nothing and its node does nothing: forget it at once.
            lost = st.phase is Phase.LOST and st.retiring_since is not None
            if (st.phase is not Phase.STOPPED and not lost) or role in held:
                continue
            if st.retiring_since is not None:
                self._forget(role, st)
            elif st.next_spec is not None:
                st.spec = self.state.specs[role] = st.next_spec
                st.next_spec = None
                if st.restart_after and not self.shutdown.under_way:
                    ticket = next(self._restart_tickets)
                    timeout = self.state.limits.queue_timeout_s
                    restart_waiter = Waiter(ticket, now, timeout, False, True)
                    st.waiters.append(restart_waiter)
                    self.grants.expires_at(restart_waiter)
                    self.state.gauges(role)
                st.restart_after = False

    def _forget(self, role: str, st: RoleState) -> None:
        del self.state.roles[role]
        del self.state.specs[role]
        why = f"role {role!r} is no longer served here (a re-plan removed it)"
        error: type[UnknownRoleError] = UnknownRoleError
        if st.moved_to is not None:
            why = f"role {role!r} moved to node {st.moved_to!r} (a re-plan)"
            error = RoleMovedError
        for w in st.waiters:
            self.state.fail(w.ticket, error, why)
        self.state.out.extend(FinishUnload(t) for t in st.unload_tickets)
        if st.gauges != (0, 0):
            self.state.out.append(UpdateGauges(role, 0, 0))
        self.state.out.append(
            LogNote("info", f"{role} retired: a re-plan removed it from this node")
        )
        self.state.out.append(ForgetRole(role))

    def schedule(self, now: float, holds: dict[str, float]) -> bool:
        """Begin the stop a re-plan needs next, if any (``True``); busy roles that must
        go for the capacity get their hold in ``holds``."""
        drain_s = self.state.limits.drain_s
        for role, st in self.state.roles.items():
            if st.retiring_since is not None:
                idle = st.running == 0 and not st.waiters
                drained = now - st.retiring_since >= drain_s
                cause = "a re-plan removed it from this node"
            elif st.next_spec is not None:
                idle = st.running == 0
                drained = now - st.respec_since >= drain_s
                cause = "a re-plan changed what it launches; restarting it"
            else:
                continue
            if st.phase is Phase.RESTARTING or (st.phase is Phase.READY and (idle or drained)):
                self.transitions.begin((role,), None, cause, REPLAN_LABEL, None, now)
                return True
        return self._schedule_exclusions(now, holds) or self._schedule_fit(now, holds)

    def _schedule_exclusions(self, now: float, holds: dict[str, float]) -> bool:
        """Stop one of two resident roles that a re-plan made exclude each other (a new
        ``excludes`` applies at once, without a restart): the one kept has the residency
        policy's precedence (interactive, then sticky, then the smaller id); the other
        stops when idle, or after ``drain_s`` (newer requests wait meanwhile)."""
        held = [r for r, st in self.state.roles.items() if st.phase in HOLDS_MEMORY]
        pair = next(
            (
                (a, b)
                for i, a in enumerate(held)
                for b in held[i + 1 :]
                if b in self.state.roles[a].spec.excludes or a in self.state.roles[b].spec.excludes
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
            spec = self.state.roles[role].spec
            return (spec.latency_class is not LatencyClass.INTERACTIVE, not spec.sticky, role)

        keep, stop = sorted(pair, key=keep_first)
        st = self.state.roles[stop]
        if st.phase is not Phase.READY:
            return False  # a load or stop of it is under way: decided again after it
        if st.running and now - self._conflict_since < self.state.limits.drain_s:
            holds[stop] = min(holds.get(stop, self._conflict_since), self._conflict_since)
            return False
        cause = f"a re-plan made it exclude {keep}, which stays resident"
        self.transitions.begin((stop,), None, cause, REPLAN_LABEL, None, now)
        return True

    def _schedule_fit(self, now: float, holds: dict[str, float]) -> bool:
        if self.state.resident_bytes() <= self.state.capacity_bytes:
            self._over_since = None
            self._new_capacity = False
            return self._schedule_device_fit(now, holds)
        if self._over_since is None:  # a resident role's memory grew
            self._over_since = now
        since = self._over_since
        drained = now - since >= self.state.limits.drain_s
        fit = fit_to_capacity(self.state.node_state(now, ignore_in_flight=drained, for_role=None))
        evict = [
            *fit.evict,
            *(b for b in fit.blocking if drained or self.state.roles[b].phase is Phase.RESTARTING),
        ]
        if evict:
            cause = (
                f"the node's capacity is now {gib(self.state.capacity_bytes)}: {fit.reason}"
                if self._new_capacity
                else f"a re-plan raised the resident roles' memory over the node's capacity "
                f"of {gib(self.state.capacity_bytes)}: {fit.reason}"
            )
            self.transitions.begin(evict, None, cause, REPLAN_LABEL, None, now)
            return True
        for b in fit.blocking:  # they drain: newer requests wait for the capacity
            if self.state.roles[b].phase is Phase.READY and self.state.roles[b].running:
                holds[b] = min(holds.get(b, since), since)
        return False

    def _schedule_device_fit(self, now: float, holds: dict[str, float]) -> bool:
        """Host RAM's fit (:meth:`_schedule_fit`) per device pool (issue 29): where the
        resident roles hold more of a device than its capacity (a reload declared a smaller
        ``memory_gb`` or a larger ``reserved_gb``, a probe found less free, a measurement
        grew), the pool that is over chooses what leaves it, at once, by the same rule:
        idle roles before busy ones, in the policy's eviction order (least recently used
        first); a busy one drains and is cut after ``drain_s``. Devices in id order."""
        if not self.state.devices:
            self._device_over_since.clear()
            return False
        # Every pool's state from one look at the node: the loop returns at its first
        # eviction, so nothing it reads changes between devices.
        states = self.state.device_states(
            self.state.node_state(now, ignore_in_flight=False, for_role=None)
        )
        over = False
        for device in sorted(self.state.devices):
            pool = states[device]
            used = sum(pool.specs[r].memory.resident_bytes for r in pool.resident)
            if used <= pool.capacity_bytes:
                self._device_over_since.pop(device, None)
                self._new_device_capacity.discard(device)
                continue
            over = True
            since = self._device_over_since.setdefault(device, now)
            drained = now - since >= self.state.limits.drain_s
            if drained:
                host = self.state.node_state(now, ignore_in_flight=True, for_role=None)
                pool = self.state.device_states(host)[device]
            fit = fit_to_capacity(pool)
            evict = [
                *fit.evict,
                *(
                    b
                    for b in fit.blocking
                    if drained or self.state.roles[b].phase is Phase.RESTARTING
                ),
            ]
            if evict:
                capacity = gib(pool.capacity_bytes)
                cause = (
                    f"device {device}'s capacity is now {capacity}: {fit.reason}"
                    if device in self._new_device_capacity
                    else f"the resident roles' memory on device {device} grew over its capacity "
                    f"of {capacity}: {fit.reason}"
                )
                self.transitions.begin(evict, None, cause, REPLAN_LABEL, None, now)
                return True
            for b in fit.blocking:  # they drain: newer requests wait for the device's room
                if self.state.roles[b].phase is Phase.READY and self.state.roles[b].running:
                    holds[b] = min(holds.get(b, since), since)
        if not over:
            self._device_over_since.clear()
        return False
