"""Whether a node's backends are healthy (DESIGN.md layer 6, pure): the node machine's probe
and backoff policy.

:class:`HealthRules` keeps what happens when a backend stops serving:

- **Crash restarts.** A ready role whose process exited is ``restarting``: it
  keeps its memory, its leases are void, waiters wait for the ``ready`` of the
  new process, or fail when the supervisor gives up (``BackendChanged``).
- **Probes.** A ready role idle for ``probe_interval_s`` gets ``ProbeBackend``;
  so does a role a request ``Suspect``s (no byte within its deadline), at once and
  bounded by :data:`STALL_PROBE_TIMEOUT_S` (or ``probe_timeout_s`` when shorter): the
  stalled request was cut, so a backend that works answers one token in a moment, and
  one that does not is restarted seconds after the deadline, its requests revoked
  rather than left to wait out their own. One probe per role at a time; an answer
  for an older generation is ignored.
- **Unhealthy.** A failed probe revokes the role's leases (``backend_unhealthy``)
  and restarts it (``RestartBackend``); it keeps its memory. So does a ``Suspect``
  that is ``wedged`` (a request's progress check saw no progress), without a probe.
- **Waits for a restarted backend.** A request whose backend failed before
  answering (``Acquire.newer_than``) is granted only a later generation; a probe
  that passes makes the backend good for it again.
- **Load backoff.** After a failed load the role refuses requests with
  ``LoadBackoffError`` for ``load_backoff_s``, doubling per failure in a row up
  to ``max_load_backoff_s``.
- **Cancelled loads.** A load nobody waits for is aborted once a waiting
  request of another role needs its room.
- **A silent node.** A probe that never reached the backend because its node did not
  answer (``ProbeDone.unreachable``: a remote node's agent, silent after a power cut
  until Ray declares the node dead) is no verdict on the backend: the role is not
  restarted, its requests (new ones too) wait, and the probe is asked again every
  :data:`SILENT_NODE_REPROBE_S`, until it answers (the node is back) or the node is lost.
- **A lost node** (``NodeLost``): every role is ``lost``, holding nothing.

It asks :class:`~rosterd.scheduler.grants.GrantRules` to grant a restarted backend's
waiters at once, and reads the node's transition
(:class:`~rosterd.scheduler.transition.Transitions`) to abort a load nobody waits
for; :class:`~rosterd.scheduler.machine.NodeMachine` calls it. No clock, no I/O, no
logging: every event carries ``now`` and the rules return effects.
"""

from __future__ import annotations

import dataclasses
import math

from rosterd.errors import LoadBackoffError, LoadFailedError
from rosterd.residency import Wait, decide_by_pool
from rosterd.scheduler.events import (
    BackendChanged,
    LogNote,
    NodeLost,
    ProbeBackend,
    ProbeDone,
    RestartBackend,
    RevokeLeases,
    StopBackend,
    Suspect,
)
from rosterd.scheduler.grants import GrantRules
from rosterd.scheduler.state import MachineState, RoleState
from rosterd.scheduler.transition import Transitions
from rosterd.scheduler.values import Phase, Revocation, backoff_s

#: Where a client whose request failed on a backend is pointed for the details.
SEE_LOG = "see `rosterd ps` / the backend log"

#: How often a role whose node did not answer its probe is probed again, seconds: the
#: node's verdict comes from Ray (it declares a dead node within about 30 s by default),
#: or from the agent answering again.
SILENT_NODE_REPROBE_S = 2.0

#: How long the generation probe of a role a stalled request suspects may take, seconds:
#: one token on a second connection, whose slot the cut request has just freed.
STALL_PROBE_TIMEOUT_S = 5.0


class HealthRules:
    """The node's probe and backoff policy (see the module); ``state``: the node's shared
    state, ``grants``: who gets a lease, ``transitions``: the node's one transition."""

    def __init__(self, state: MachineState, grants: GrantRules, transitions: Transitions) -> None:
        self.state = state
        self.grants = grants
        self.transitions = transitions

    def back_off(self, st: RoleState, now: float) -> None:
        """Count a failed load of ``st`` and refuse its requests for the backoff after it."""
        # Back off as crash restarts do: a broken model is not reloaded by every request.
        st.load_failures += 1
        limits = self.state.limits
        delay = backoff_s(st.load_failures, limits.load_backoff_s, limits.max_load_backoff_s)
        st.backoff_until = now + delay

    def fail_backoff(self, ticket: int, role: str, now: float) -> None:
        st = self.state.roles[role]
        assert st.backoff_until is not None
        left = st.backoff_until - now
        message = (
            f"role {role!r} failed to load {st.load_failures} time(s) in a row "
            f"(last: {st.last_error}); the next load is tried in {left:.1f} s; {SEE_LOG}"
        )
        self.state.fail(ticket, LoadBackoffError, message, left)

    def on_backend_changed(self, ev: BackendChanged, now: float) -> None:
        role = ev.role
        st = self.state.roles.get(role)
        if st is None:
            return
        restarting = (Phase.RESTARTING, Phase.UNHEALTHY)
        if ev.kind in ("exited", "restarting") and st.phase is Phase.READY:
            st.phase = Phase.RESTARTING
            st.generation += 1  # leases of the dead process are void
            st.running = 0
            st.probing = st.suspected = False
            if st.endpoint is not None:  # same address and name; no live pid until it is back
                st.endpoint = dataclasses.replace(st.endpoint, pid=None)
            st.waiting_reason = "its backend crashed and is being restarted"
            why = ev.exit_reason or "exited"
            self.state.note_error(role, f"backend {why}", now)
            self.state.record("crashed", role, f"backend pid {ev.pid} {why}; restarting")
            self.state.gauges(role)
        elif ev.kind == "ready" and st.phase in restarting and st.endpoint is not None:
            st.phase = Phase.READY
            pid = ev.pid if ev.pid_is_local else None  # never take a remote pid for ours
            st.endpoint = dataclasses.replace(st.endpoint, pid=pid)
            st.last_used = st.last_probe = now
            st.waiting_reason = None
            self.state.record("restarted", role, f"backend restarted as pid {ev.pid}")
            self.grants.grant(role, st, now)
        elif ev.kind == "restart_failed" and st.phase in restarting:
            if not ev.final:
                st.waiting_reason = "its backend was restarted; that failed, trying again"
                self.state.note_error(role, f"restart failed: {ev.detail}", now)
                return
            st.phase = Phase.STOPPED  # the supervisor gave up: no process is left
            st.endpoint = None
            st.loaded_at = None
            self.state.note_error(role, f"restart given up: {ev.detail}", now)
            message = f"backend for role {role!r} crashed and could not be restarted"
            self.state.out.append(LogNote("warning", f"{message}: {ev.detail}"))
            self.state.fail_waiters(role, LoadFailedError, f"{message}; {SEE_LOG}")
            self.state.record("restart_failed", role, "the supervisor gave up restarting it")
            self.state.gauges(role)

    def on_node_lost(self, ev: NodeLost) -> None:
        if self.state.lost_reason is not None:
            return
        self.state.lost_reason = ev.reason
        # Nothing of the node answers any more: a start or stop under way ends with it
        # (its LoadDone/StopDone are then ignored), and no new one is asked for.
        self.transitions.current = None
        for role, st in self.state.roles.items():
            if st.running:
                # A power cut leaves their connections open, unanswered: cut them, and
                # let the router send those not answered yet where the role goes next.
                message = f"the node serving role {role} is lost ({ev.reason})"
                revocation = Revocation("node_lost", message, resend=True)
                self.state.out.append(RevokeLeases(role, st.generation, revocation))
            st.phase = Phase.LOST
            st.endpoint = None
            st.generation += 1  # leases of its processes are void
            st.running = 0
            st.loaded_at = None
            st.hold_since = None
            st.probing = st.suspected = False
            st.silent_retry_at = None
            st.waiting_reason = f"{ev.reason}; waiting for it to be served elsewhere"
            self.state.record("lost", role, ev.reason)
            self.state.gauges(role)

    def on_suspect(self, ev: Suspect) -> None:
        st = self.state.roles.get(ev.role)
        if st is not None and st.generation == ev.generation and st.phase is Phase.READY:
            if ev.wedged:
                self._mark_unhealthy(ev.role, ev.reason, ev.now, why=ev.reason)
                return
            self.probe(
                ev.role, ev.reason, min(self.state.limits.probe_timeout_s, STALL_PROBE_TIMEOUT_S)
            )
            st.suspected = True  # no new request goes to it until the probe answered

    def on_probe_done(self, ev: ProbeDone, now: float) -> None:
        st = self.state.roles.get(ev.role)
        if st is None or ev.generation != st.generation:
            return  # a probe of a process that is gone already
        st.probing = False
        if st.phase is not Phase.READY:
            st.suspected = False
            return
        if ev.unreachable:
            self._node_silent(ev.role, ev.detail, now)
            return
        st.suspected = False
        if st.silent_retry_at is not None:
            st.silent_retry_at = None
            self.state.record("node_answers", ev.role, "its node answers again; serving it there")
        if ev.ok:
            st.last_probe = now
            for w in st.waiters:
                w.newer_than = None  # alive after all: send those requests to it again
            return
        self._mark_unhealthy(ev.role, ev.detail or "the generation probe failed", now)

    def _node_silent(self, role: str, detail: str, now: float) -> None:
        """``role``'s node did not answer its probe: hold its requests for the node's verdict
        (back: served there; lost: the role moves), probe again later, restart nothing."""
        st = self.state.roles[role]
        st.suspected = True  # no new request goes to a backend nobody can reach
        if st.silent_retry_at is None:
            self.state.note_error(role, f"its node does not answer: {detail}", now)
            self.state.record("node_silent", role, f"{detail}; waiting for the node's verdict")
        st.silent_retry_at = now + SILENT_NODE_REPROBE_S
        st.waiting_reason = (
            f"its node does not answer ({detail}); waiting for the node's verdict: "
            "back (served there) or lost (served elsewhere)"
        )

    def probe(self, role: str, reason: str, timeout_s: float | None = None) -> None:
        """Run ``role``'s generation probe unless one is under way (ready roles only), within
        ``timeout_s`` seconds (``None``: ``probe_timeout_s``)."""
        st = self.state.roles[role]
        if st.phase is not Phase.READY or st.probing:
            return
        st.probing = True
        self.state.out.append(LogNote("info", f"probing {role}: {reason}"))
        if timeout_s is None:
            timeout_s = self.state.limits.probe_timeout_s
        self.state.out.append(ProbeBackend(role, st.generation, timeout_s))

    def _mark_unhealthy(self, role: str, detail: str, now: float, why: str | None = None) -> None:
        """``role``'s backend answers HTTP but does not generate: end its requests, restart it.

        It keeps its memory (the same role comes back); waiters wait for the restart.
        ``why``: what found it (default: its generation probe failed with ``detail``).
        """
        st = self.state.roles[role]
        old = st.generation
        st.phase = Phase.UNHEALTHY
        st.generation += 1  # leases of the wedged process are void
        st.running = 0
        if st.endpoint is not None:
            st.endpoint = dataclasses.replace(st.endpoint, pid=None)
        why = why or f"its generation probe failed ({detail})"
        st.waiting_reason = f"its backend stopped generating ({detail}) and is being restarted"
        self.state.note_error(role, f"unhealthy: {why}", now)
        message = f"the backend of role {role} stopped generating ({detail}); it is being restarted"
        self.state.out.append(RevokeLeases(role, old, Revocation("backend_unhealthy", message)))
        self.state.record("unhealthy", role, f"{why}; restarting it")
        self.state.out.append(RestartBackend(role))
        self.state.gauges(role)

    def schedule_probes(self, now: float) -> None:
        """Probe each ready role idle for ``probe_interval_s`` (since its last request or probe)."""
        for role, st in self.state.roles.items():
            retry_at = st.silent_retry_at
            if retry_at is not None and now >= retry_at and st.phase is Phase.READY:
                self.probe(role, "its node did not answer; asking again")
        interval = self.state.limits.probe_interval_s
        if math.isinf(interval):
            return
        for role, st in self.state.roles.items():
            if (
                st.phase is Phase.READY
                and not st.probing
                and st.running == 0
                and not st.unload_tickets
                and now - max(st.last_used, st.last_probe) >= interval
            ):
                self.probe(role, f"idle for {interval:g} s")

    def cancel_unwanted_load(self, now: float) -> None:
        """Abort the load under way when nobody waits for it any more and a waiting request of
        another role needs its room; otherwise the load finishes and the role stays."""
        tr = self.transitions.current
        assert tr is not None
        if tr.step != "loading" or self.state.roles[tr.role].waiters:
            return
        for role, st in self.state.roles.items():
            if role == tr.role or st.phase is not Phase.STOPPED or not st.waiters:
                continue
            if all(w.no_evict for w in st.waiters):
                continue  # a warm-up never evicts, nor cancels a load
            state = self.state.node_state(now, ignore_in_flight=False, for_role=role)
            decision = decide_by_pool(state, self.state.device_states(state), role)
            if isinstance(decision, Wait) and tr.role in decision.blocking:
                cause = f"nobody waits for it any more and {role} needs its room"
                self.state.record("load_cancelled", tr.role, cause)
                tr.step, tr.pending, tr.abort_label = "aborting", {"load", "stop"}, "make_room"
                self.state.out.append(StopBackend(tr.role))
                return
