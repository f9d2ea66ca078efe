"""Shutdown on one node (DESIGN.md layer 6, pure): the last change, to serving nothing.

:class:`ShutdownRules` owns when ``Shutdown`` came (``since``) and whether it is done:
waiters fail (the machine's step), a load under way is aborted at once (``StopBackend``
while its start runs), leases drain up to ``drain_s`` (``at_once``: a second Ctrl-C
ends the drain now), then every resident role stops through the node's one transition,
and ``FinishShutdown``. No clock, no I/O, no logging: every call carries ``now`` and the
rules append effects to the shared :class:`~rosterd.scheduler.state.MachineState`.
"""

from __future__ import annotations

from rosterd.scheduler.events import FinishShutdown, FinishUnload, StopBackend
from rosterd.scheduler.state import MachineState
from rosterd.scheduler.transition import Transitions
from rosterd.scheduler.values import Phase


class ShutdownRules:
    """The node's shutdown (see the module); ``state``: the node's shared state,
    ``transitions``: its one transition."""

    def __init__(self, state: MachineState, transitions: Transitions) -> None:
        self.state = state
        self.transitions = transitions
        self.since: float | None = None  # when the drain counts from (None: no Shutdown)
        self.came: float | None = None  # when Shutdown came
        self.hurried = False  # a second Shutdown (at_once) ended the drain
        self.done = False  # FinishShutdown was said

    @property
    def under_way(self) -> bool:
        """Whether ``Shutdown`` was handled."""
        return self.since is not None

    def on_shutdown(self, now: float, *, at_once: bool = False) -> None:
        """``Shutdown`` came: the drain starts (``at_once``: it is over now); a load under
        way is aborted at once, and nothing more is stopped or loaded for it."""
        if self.came is None:
            self.came = now
        if at_once:  # the drain is over now: in-flight requests are cut at the next step
            self.since = min(self.since or now, now - self.state.limits.drain_s)
            self.hurried = True
        if self.under_way and not at_once:
            return
        if self.since is None:
            self.since = now
        tr = self.transitions.current
        if tr is None:
            return
        tr.evict.clear()  # shutdown stops whatever is resident itself
        tr.load = None
        if tr.step == "loading":
            # A load may take minutes: abort it rather than wait (RoleBackends.stop
            # makes a start under way fail promptly).
            tr.step = "aborting"
            tr.pending = {"load", "stop"}
            self.state.out.append(StopBackend(tr.role))

    def step(self, now: float) -> None:
        """Once the drain is over (no request in flight, or ``drain_s`` passed), stop every
        resident role, one transition; with none left, ``FinishShutdown``."""
        if self.transitions.current is not None or self.done:
            return
        assert self.since is not None
        busy = any(st.running for st in self.state.roles.values())
        if busy and now - self.since < self.state.limits.drain_s:
            return  # let in-flight requests finish, up to drain_s
        live = (Phase.READY, Phase.LOADING, Phase.RESTARTING, Phase.UNHEALTHY)
        resident = [r for r, st in self.state.roles.items() if st.phase in live]
        if resident:
            if self.state.drain_ended is None:  # what a request cut now is told
                hurried = busy and self.hurried
                self.state.drain_ended = (
                    now - (self.came if self.came is not None else now),
                    hurried,
                )
            self.transitions.begin(resident, None, "shutdown", "shutdown", None, now)
            return
        for st in self.state.roles.values():
            self.state.out.extend(FinishUnload(t) for t in st.unload_tickets)  # stopped, as asked
            st.unload_tickets.clear()
        self.done = True
        self.state.out.append(FinishShutdown())
