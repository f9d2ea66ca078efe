"""The node's one transition (DESIGN.md layer 6, pure): "stop these roles, then load that one".

:class:`Transitions` owns the transition under way (``current``, a :class:`Transition`,
``None`` when the node is still) and its steps: a busy role's leases revoked
(``RevokeLeases``) and their releases awaited up to ``REVOKE_WAIT_S``, each stop
(``StopBackend``, memory free only at ``StopDone``), then the load (``StartBackend``);
and the abort of a load nobody waits for. One transition per node at a time: every
rule that wants a role loaded or stopped asks it here (:meth:`Transitions.begin`).
No clock, no I/O, no logging: every call carries ``now`` and the steps append effects
to the shared :class:`~rosterd.scheduler.state.MachineState`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from rosterd.residency import excludes_each_other
from rosterd.scheduler.events import RevokeLeases, StartBackend, StopBackend
from rosterd.scheduler.state import MachineState
from rosterd.scheduler.values import Phase

#: How long a stop waits for the router to end revoked requests, seconds.
REVOKE_WAIT_S = 1.0

#: What the transition under way waits for: revoked leases' releases, a stop, a
#: start, the stop after a failed start, or both after a shutdown abort.
Step = Literal["revoking", "stopping", "loading", "cleanup", "aborting"]


@dataclass(eq=False)
class Transition:
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
    abort_label: str = "shutdown"  # aborting: why (the eviction label if the start had won)


class Transitions:
    """The node's transition under way and its steps (see the module); ``state``: the
    node's shared state."""

    def __init__(self, state: MachineState) -> None:
        self.state = state
        #: The transition under way (``None``: no start or stop is).
        self.current: Transition | None = None

    @property
    def under_way(self) -> bool:
        """Whether a start or stop is under way on the node."""
        return self.current is not None

    def begin(
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
        self.current = Transition(deque(evict), load, cause, label, for_role)
        self.advance(now)

    def advance(self, now: float) -> None:
        """The next step of the transition: the next stop, else the load, else it is over."""
        tr = self.current
        assert tr is not None
        if tr.evict:
            self._begin_stop(tr, tr.evict.popleft(), now)
        elif tr.load is not None:
            role, tr.load = tr.load, None
            st = self.state.roles[role]
            st.phase = Phase.LOADING
            tr.role, tr.step, tr.started = role, "loading", now
            self.state.record("loading", role, tr.cause)
            self.state.out.append(StartBackend(role))
        else:
            self.current = None

    def _begin_stop(self, tr: Transition, role: str, now: float) -> None:
        st = self.state.roles[role]
        st.phase = Phase.STOPPING
        cause = tr.cause if tr.load is None else f"evicted for {tr.load}: {tr.cause}"
        label = tr.label
        if tr.load is not None and excludes_each_other(
            self.state.specs[role], self.state.specs[tr.load]
        ):
            label = "exclusion"
        tr.role = role
        cut = st.running
        if cut:
            cause += f"; {cut} request(s) in flight cut {self.state.cut_after(label)}"
            revocation = self.state.revocation(role, label, tr.for_role)
            self.state.out.append(RevokeLeases(role, st.generation, revocation))
            if label in ("make_room", "exclusion"):
                label = "drain"
        tr.stop_cause, tr.stop_label = cause, label
        if cut:
            # The router ends the revoked requests at once; their releases still
            # count against this generation. The stop waits for them, briefly.
            tr.step, tr.revoke_until = "revoking", now + REVOKE_WAIT_S
            return
        self.issue_stop(tr, now)

    def issue_stop(self, tr: Transition, now: float) -> None:
        """Stop ``tr.role`` now (its revoked leases were released, or waited for long enough)."""
        st = self.state.roles[tr.role]
        st.generation += 1  # leases of the stopped process are void from here on
        tr.step, tr.started = "stopping", now
        self.state.record("stopping", tr.role, tr.stop_cause)
        self.state.out.append(StopBackend(tr.role))

    def finish_stop(self, tr: Transition, now: float) -> None:
        """``tr.role`` stopped (its ``StopDone``): its memory is free; on to the next step."""
        role = tr.role
        self.state.mark_stopped(role)
        for_state = self.state.roles.get(tr.for_role) if tr.for_role is not None else None
        if for_state is not None and tr.for_role != role:  # None too once it was retired
            for_state.evicted_for.add(role)  # min residency holds it against role
        took = now - tr.started
        self.state.record("stopped", role, tr.stop_cause, duration_s=took, label=tr.stop_label)
        self.state.gauges(role)
        self.advance(now)

    def finish_abort(self, tr: Transition, now: float) -> None:
        """An aborted load heard back (its ``LoadDone`` or ``StopDone``): once both came, the
        role is stopped and the transition is over."""
        if tr.pending:
            return  # the start and the stop both report back
        self.state.mark_stopped(tr.role)
        if tr.loaded or tr.abort_label != "shutdown":
            took = now - tr.started
            label = tr.abort_label
            cause = "shutdown" if label == "shutdown" else "load cancelled"
            self.state.record("stopped", tr.role, cause, duration_s=took, label=label)
        self.state.gauges(tr.role)
        self.current = None

    def cancel_load_of(self, role: str) -> None:
        """Drop the pending load of ``role`` from the transition (and the evictions made
        for it that have not begun); its waiters are decided on again."""
        tr = self.current
        if tr is not None and tr.load == role:
            tr.load = None
            if tr.for_role == role:
                tr.evict.clear()
