"""What to load, what to evict, who waits (DESIGN.md layer 6, pure): the node machine's
load rules, the residency policy's answers under the node's rules.

:class:`LoadRules` asks :func:`rosterd.residency.decide_by_pool` (host RAM and, on a node
with devices, the device a role is placed on) for each role with waiters
(interactive first, then by the oldest request) and keeps the rules of issue 5 and
USERS.md around its answer: no eviction under a request (busy roles drain in arrival
order, ``hold_since``, and are cut after ``drain_s``); turns (a batch request lets a
busy role serve its own queue first for up to ``max_wait_s``); minimum residency (held
only against the role it displaced, only while it has work); exclusions yield when
idle; warm-up never evicts; an unload takes no new requests; idle TTL. What it decides
it asks of the node's one transition (:class:`~rosterd.scheduler.transition.Transitions`).
No clock, no I/O, no logging: every call carries ``now`` and the rules append effects
to the shared :class:`~rosterd.scheduler.state.MachineState`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rosterd.errors import RoleRefusedError
from rosterd.residency import AlreadyResident, Load, Refuse, Wait, decide_by_pool
from rosterd.scheduler.events import FinishUnload, LogNote
from rosterd.scheduler.health import HealthRules
from rosterd.scheduler.state import MachineState
from rosterd.scheduler.transition import Transitions
from rosterd.scheduler.values import Phase


class LoadRules:
    """What to load, what to evict, who waits (see the module); ``state``: the node's
    shared state, ``health``: its load backoff, ``transitions``: its one transition."""

    def __init__(self, state: MachineState, health: HealthRules, transitions: Transitions) -> None:
        self.state = state
        self.health = health
        self.transitions = transitions

    def schedule_unloads(self, now: float) -> bool:
        for role, st in self.state.roles.items():
            if not st.unload_tickets:
                continue
            if st.phase in (Phase.STOPPED, Phase.LOST):
                self.state.out.extend(FinishUnload(t) for t in st.unload_tickets)
                st.unload_tickets.clear()
                st.unload_since = None
                continue
            since = st.unload_since if st.unload_since is not None else now
            if st.phase is Phase.READY and (
                st.running == 0 or now - since >= self.state.limits.drain_s
            ):
                self.transitions.begin((role,), None, "unload", "unload", None, now)
                return True
        return False

    def schedule_loads(self, now: float, holds: dict[str, float]) -> bool:
        try:
            return self._decide_loads(now, holds)
        finally:
            for role, st in self.state.roles.items():
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
        waiting = self.state.roles[for_role]
        in_turn = self.state.turn_left_s(for_role, since, now) > 0
        for b in blocking:
            st = self.state.roles[b]
            recent = self.state.recently_loaded(st, now, for_role)
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
        waiting.waiting_reason = (waiting.waiting_reason or "") + self.state.hold_note(
            blocking, for_role, since, now
        )

    def _decide_loads(self, now: float, holds: dict[str, float]) -> bool:
        pending = [
            (role, st)
            for role, st in self.state.roles.items()
            if st.phase is Phase.STOPPED and st.waiters
        ]
        for st in self.state.roles.values():
            if st.phase is not Phase.STOPPED or not st.waiters:
                st.turn_given, st.drain_from = False, None  # served, or nobody waits
        pending.sort(key=lambda p: (not p[1].spec.interactive, p[1].waiters[0].since, p[0]))
        for role, st in pending:
            if st.backoff_until is not None and now < st.backoff_until:
                for w in st.waiters:  # they came while the failed load was cleaned up
                    self.health.fail_backoff(w.ticket, role, now)
                st.waiters.clear()
                self.state.gauges(role)
                continue
            oldest = st.waiters[0].since
            drained = self.state.drained(role, oldest, now)
            warm_up_only = all(w.no_evict for w in st.waiters)
            node = self.state.node_state(now, ignore_in_flight=drained, for_role=role)
            decision = decide_by_pool(node, self.state.device_states(node), role)
            if isinstance(decision, AlreadyResident):
                continue
            if isinstance(decision, Refuse):
                yielding = self.state.exclusion_blockers(role)
                if yielding is not None:
                    # Exclusion precedence keeps the resident winner, but only while it
                    # is in use: an idle batch winner yields to a waiting request.
                    idle = [
                        b
                        for b in yielding
                        if self.state.can_yield(b, now, role)
                        or (drained and self.state.roles[b].phase is Phase.READY)
                    ]
                    if len(idle) == len(yielding):
                        st.waiting_reason = decision.reason
                        busy = [b for b in yielding if self.state.roles[b].running]
                        state = (
                            f"busy past --drain {self.state.limits.drain_s:g} s" if busy else "idle"
                        )
                        cause = f"{state}, yields to waiting {role} (they exclude each other)"
                        self.transitions.begin(yielding, None, cause, "exclusion", role, now)
                        return True
                    st.waiting_reason = f"{decision.reason}; waiting until it is idle"
                    if not warm_up_only:
                        self._hold(yielding, role, oldest, now, holds)
                    continue
                st.waiting_reason = decision.reason
                self.state.fail_waiters(role, RoleRefusedError, decision.reason)
                self.state.record("refused", role, decision.reason)
                continue
            if isinstance(decision, Wait):
                if decision.reason not in st.logged_waits:
                    st.logged_waits.add(decision.reason)
                    self.state.out.append(LogNote("info", f"{role} waits: {decision.reason}"))
                st.waiting_reason = decision.reason
                if not warm_up_only:
                    self._hold(decision.blocking, role, oldest, now, holds)
                continue
            assert isinstance(decision, Load)
            if decision.evict and warm_up_only:
                reason = f"not warmed up: it would evict {', '.join(decision.evict)}"
                self.state.fail_waiters(role, RoleRefusedError, reason)
                continue
            st.waiting_reason = decision.reason
            self.transitions.begin(decision.evict, role, decision.reason, "make_room", role, now)
            return True
        return False

    def schedule_idle(self, now: float) -> None:
        if math.isinf(self.state.limits.idle_ttl_s):
            return
        for role, st in self.state.roles.items():
            if (
                st.phase is Phase.READY
                and not st.spec.sticky
                and not st.spec.interactive
                and st.running == 0
                and not st.waiters
                and now - st.last_used >= self.state.limits.idle_ttl_s
            ):
                cause = f"idle for {now - st.last_used:.0f} s"
                self.transitions.begin((role,), None, cause, "idle_ttl", None, now)
                return
