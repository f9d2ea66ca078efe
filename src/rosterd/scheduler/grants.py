"""Who gets a lease on one node (DESIGN.md layer 6, pure): the node machine's grant rules.

:class:`GrantRules` hands the leases of a ready role to its waiters and keeps
the queue: oldest request first; per-role concurrency (``max_concurrency``
leases at once) and the node-wide limit (``NodeConcurrency``: a free slot goes
to the oldest grantable request across the node's roles); a busy role draining
for an older request of another role (``hold_since``) grants no lease to a
newer one; a request that failed on a backend (``newer_than``) waits for a
later generation and lets the others pass; queue timeouts (``QueueTimeoutError``);
``Cancel`` and ``Release`` of a lease. :class:`~rosterd.scheduler.machine.NodeMachine`
calls :meth:`GrantRules.expire` and :meth:`GrantRules.grant` in every step. It owns
the next queue deadline (``next_expiry``); the queues themselves are the roles' (the
shared :class:`~rosterd.scheduler.state.MachineState`). No clock, no I/O, no
logging: every event carries ``now`` and the rules return effects.
"""

from __future__ import annotations

import math
from collections import deque

from rosterd.errors import QueueTimeoutError
from rosterd.scheduler.events import Cancel, GrantLease, Release
from rosterd.scheduler.state import MachineState, RoleState, Waiter
from rosterd.scheduler.values import Phase


class GrantRules:
    """Who gets a lease on the node (see the module); ``state``: the node's shared state."""

    def __init__(self, state: MachineState) -> None:
        self.state = state
        # The earliest deadline of a waiter (seconds, the events' clock): ``expire``
        # looks at the queues only once it is due.
        self.next_expiry = math.inf

    def on_cancel(self, ev: Cancel) -> None:
        st = self.state.roles.get(ev.role)
        if st is not None:
            st.waiters = deque(w for w in st.waiters if w.ticket != ev.ticket)
            self.state.gauges(ev.role)

    def on_release(self, ev: Release, now: float) -> None:
        st = self.state.roles.get(ev.role)
        if st is not None and ev.generation == st.generation and st.running > 0:
            st.running -= 1
            st.last_used = now
            self.state.gauges(ev.role)

    def expire(self, now: float) -> None:
        """Fail every waiter whose ``timeout_s`` passed. Runs at every step, so it costs
        nothing until the earliest deadline (``next_expiry``) is due: a request's
        acquire and release stay O(1) in the number of waiting requests."""
        if now < self.next_expiry:
            return
        self.next_expiry = math.inf
        for role, st in self.state.roles.items():
            expired = [w for w in st.waiters if now - w.since >= w.timeout_s]
            for w in st.waiters:
                if now - w.since < w.timeout_s:
                    self.expires_at(w)
            if not expired:
                continue
            st.waiters = deque(w for w in st.waiters if w not in expired)
            why = st.waiting_reason or "still loading or busy"
            for w in expired:
                message = f"role {role!r} was not ready within {w.timeout_s:g} s ({why})"
                self.state.fail(w.ticket, QueueTimeoutError, message, self.state.retry_after())
            self.state.gauges(role)

    def expires_at(self, waiter: Waiter) -> None:
        """Note ``waiter``'s deadline: :meth:`expire` looks again once the earliest is due.

        The deadline is taken a hair early so that float rounding can never make the
        look come after the ``now - since >= timeout_s`` it must catch."""
        self.next_expiry = min(self.next_expiry, waiter.since + waiter.timeout_s - 1e-9)

    def grant(self, role: str, st: RoleState, now: float) -> int:
        """Hand leases to waiters, oldest first, while the role is ready and has free slots;
        how many were granted.

        A waiter that needs a newer generation (its request failed on this backend)
        keeps its place and lets the others pass. With a node-wide limit, a slot goes
        to the oldest waiter of the node: a waiter defers to an older one of another
        role that could take it now.
        """
        if st.phase is not Phase.READY or st.endpoint is None:
            return 0
        if st.unload_tickets or st.next_spec is not None:
            st.waiting_reason = (
                "it is being unloaded or restarted with a new configuration; it loads again after"
            )
            return 0  # an unload was asked: new requests wait and load the role again after it
        if st.suspected:
            if st.silent_retry_at is None:  # else it waits for its node's verdict, as it says
                st.waiting_reason = "a request got no byte in time: its backend is being probed"
            return 0
        if st.kv_saving:
            # kv_saves.py: the idle save of its KV cache never runs beside a request
            st.waiting_reason = "its KV cache is being saved while it was idle; a moment"
            return 0
        st.waiting_reason = None
        granted = 0
        kept: deque[Waiter] = deque()
        blocked = False  # a waiter that needs a slot or the room waits: so do those after it
        while st.waiters:
            waiter = st.waiters.popleft()
            if blocked:
                kept.append(waiter)
                continue
            if waiter.newer_than is not None and st.generation <= waiter.newer_than:
                st.waiting_reason = "its backend failed a request; waiting for the restart"
                kept.append(waiter)
                continue
            if waiter.take_slot and st.running >= self.role_cap(role):
                n, most = self.role_cap(role), self.state.limits.max_concurrency
                st.waiting_reason = (
                    f"all {n} slot(s) are busy, --max-concurrency {most}"
                    f" and the backend's {n} parallel slot(s)"
                    if n < most
                    else f"all {n} slot(s) are busy, --max-concurrency {n}"
                )
                blocked = True
                kept.append(waiter)
                continue
            if waiter.take_slot and st.hold_since is not None and waiter.since >= st.hold_since:
                # an older request waits for this role's room: let it drain
                st.waiting_reason = "it drains for an older request of another role"
                blocked = True
                kept.append(waiter)
                continue
            if waiter.take_slot and not self._node_slot_free():
                st.waiting_reason = (
                    f"the node already runs {self.state.node_running()} generations at once, "
                    "its limit (the node's max_concurrency)"
                )
                blocked = True
                kept.append(waiter)
                continue
            if waiter.take_slot and self._older_elsewhere(role, waiter.since):
                st.waiting_reason = "an older request of another role takes the node's free slot"
                blocked = True
                kept.append(waiter)
                continue
            granted += 1
            if waiter.take_slot:
                st.running += 1
                st.last_used = now
                st.kv_changed = True  # its slots change: saved again once it is idle
            waited = now - waiter.since
            lease = GrantLease(
                waiter.ticket, role, st.endpoint, st.generation, waited, waiter.take_slot
            )
            self.state.out.append(lease)
        st.waiters = kept
        self.state.gauges(role)
        return granted

    def _grantable(self, st: RoleState) -> bool:
        """Whether ``st``'s oldest waiter can be granted now."""
        if st.phase is not Phase.READY or st.endpoint is None or not st.waiters:
            return False
        if st.unload_tickets or st.next_spec is not None or st.suspected or st.kv_saving:
            return False  # unloading, restarting, being probed or saved: its requests wait
        waiter = st.waiters[0]
        if waiter.newer_than is not None and st.generation <= waiter.newer_than:
            return False  # it waits for the restarted backend
        if not waiter.take_slot:
            return True
        if st.running >= self.role_cap(st.spec.role):
            return False
        if st.hold_since is not None and waiter.since >= st.hold_since:
            return False  # an older request waits for this role's room: let it drain
        return self._node_slot_free()

    def role_cap(self, role: str) -> int:
        """Leases ``role`` may hold at once: ``max_concurrency``, and no more than the
        parallel slots its backend was launched with (``NodeConcurrency.role_caps``).
        Also how many requests a copy of ``role`` takes before one waits for a slot, for
        the choice among copies (``NodeMachine.copy_slots``)."""
        caps = self.state.concurrency.role_caps if self.state.concurrency is not None else {}
        return min(
            self.state.limits.max_concurrency, caps.get(role, self.state.limits.max_concurrency)
        )

    def _node_slot_free(self) -> bool:
        limit = self.state.node_limit()
        return limit is None or self.state.node_running() < limit

    def _older_elsewhere(self, role: str, since: float) -> bool:
        """Whether, under a node-wide limit, another role's grantable request is older."""
        if self.state.concurrency is None:
            return False
        for other, st in self.state.roles.items():
            if other != role and self._grantable(st):
                head = st.waiters[0]
                if head.take_slot and head.since < since:
                    return True
        return False
