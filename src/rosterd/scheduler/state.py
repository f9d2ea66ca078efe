"""The node state machine's shared state and bookkeeping (DESIGN.md layer 6, pure).

``MachineState`` holds what every rule family of ``NodeMachine`` (``machine.py``)
decides on: the node's budget, limits and roles (each role's phase, leases out,
queued waiters, its spec, whether it can be served, its memory figures), and the
effects gathered while one event is handled. Each rule family keeps its own fields
beside it (the grants their next deadline, the transition the one under way, the
re-plan its timers, the shutdown its start); this is what they share. Its helpers
read that state for the residency policy and for display, and append effects; none
reads a clock, does I/O or logs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from rosterd.backends.values import Endpoint
from rosterd.errors import SchedulerError
from rosterd.residency import NodeState, excludes_each_other
from rosterd.scheduler.events import Effect, FailWaiter, RecordEvent, UpdateGauges
from rosterd.scheduler.values import (
    HOLDS_MEMORY,
    DevicePool,
    NodeConcurrency,
    Phase,
    Revocation,
    SchedulerLimits,
    client_reason,
)
from rosterd.scheduler.views import LATENCY_CLASS_NAME, SHOWN_PHASE, RoleSnapshot
from rosterd.spec import InferenceSpec, MemorySpec


@dataclass(eq=False)
class Waiter:
    ticket: int
    since: float
    timeout_s: float
    take_slot: bool  # a request (counts in flight) or a load that only wants residency
    no_evict: bool  # warm-up: load only if nothing must be evicted
    newer_than: int | None = None  # only a lease of a later generation (see Acquire)


@dataclass(eq=False)
class RoleState:
    spec: InferenceSpec
    phase: Phase = Phase.STOPPED
    endpoint: Endpoint | None = None
    generation: int = 0
    running: int = 0  # leases taken with a slot: requests its backend runs now
    waiters: deque[Waiter] = field(default_factory=deque)
    loaded_at: float | None = None
    last_used: float = 0.0
    unload_tickets: list[int] = field(default_factory=list)
    unload_since: float | None = None
    waiting_reason: str | None = None
    logged_waits: set[str] = field(default_factory=set)  # wait reasons logged since the load
    # New leases go only to waiters older than this: a request for another role
    # that needs this role's room came first (None: no one waits for its room).
    hold_since: float | None = None
    gauges: tuple[int, int] = (0, 0)  # (running, queued) as last reported
    # Turns (issue 22): whether a role in this role's way served its own queue first
    # while this role waited, and since when the roles in its way drain for it.
    turn_given: bool = False
    drain_from: float | None = None
    # A re-plan (replan.py): retired since when; a new spec still to apply (since
    # when), and whether to load the role again afterwards.
    retiring_since: float | None = None
    moved_to: str | None = None  # the node a retirement moved it to (None: nowhere)
    next_spec: InferenceSpec | None = None
    respec_since: float = 0.0
    restart_after: bool = False
    # The roles stopped to make room for this load: min residency holds it against them only.
    displaced: frozenset[str] = frozenset()
    evicted_for: set[str] = field(default_factory=set)  # stopped for this role's next load
    last_error: str | None = None  # the last load failure, crash or failed probe, short
    last_error_at: float | None = None
    load_failures: int = 0  # failed loads in a row
    backoff_until: float | None = None  # no new load before this
    probing: bool = False  # a generation probe is under way
    suspected: bool = False  # ... because a request stalled: new leases wait for its answer
    last_probe: float = 0.0  # when the backend last proved alive (probe passed, or loaded)
    # Its node did not answer a probe (a remote node, silent): its requests wait for the
    # node's verdict, and the probe is asked again at this time (None: the node answers).
    silent_retry_at: float | None = None
    unavailable: str | None = None  # why it cannot be served (its requests fail at once)
    memory: dict[str, object] | None = None  # its figures as /status shows them
    grew: bool = False  # its count followed a measurement past it (said once)
    # The idle save of its KV cache (kv_saves.py): a request ran since the last one (or
    # the load), and one is under way (new leases wait for it).
    kv_changed: bool = False
    kv_saving: bool = False


class MachineState:
    """The state one node's rule families share, and the helpers over it (see the module).

    ``capacity_bytes``: the node's budget; ``specs``: the roles placed on it;
    ``limits``: the knobs; ``concurrency``: the node-wide limit on generations at
    once (``None``: none beyond the per-role limit); ``unavailable``: role -> why it
    cannot be served; ``memory``: role -> its figures as ``/status`` shows them;
    ``devices``: device id -> its :class:`DevicePool` (none: host RAM is the only pool, as
    on a node without devices). Roles are kept sorted by id (ties break by id).
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
        self.capacity_bytes = capacity_bytes
        self.devices = dict(devices or {})
        self.specs = dict(specs)
        self.limits = limits
        self.concurrency = concurrency
        self.roles = {role: RoleState(spec) for role, spec in sorted(self.specs.items())}
        for role, st in self.roles.items():
            st.unavailable = (unavailable or {}).get(role)
            figures = (memory or {}).get(role)
            st.memory = dict(figures) if figures is not None else None
        #: Why the node is lost (``NodeLost``), ``None`` while it is not.
        self.lost_reason: str | None = None
        # How the shutdown's drain ended, once it did (ShutdownRules): seconds it lasted, and
        # whether a second signal ended it at once rather than --drain running out.
        self.drain_ended: tuple[float, bool] | None = None
        self.load_seconds: deque[float] = deque(maxlen=20)
        #: The latest ``now`` handled: an event older than it counts as happening then.
        self.now = -math.inf
        #: The effects gathered while one event is handled, in order.
        self.out: list[Effect] = []

    def resident(self) -> tuple[str, ...]:
        """The roles holding memory (every phase but ``stopped``), by id."""
        return tuple(r for r, st in self.roles.items() if st.phase in HOLDS_MEMORY)

    def resident_bytes(self) -> int:
        """The spec bytes of :meth:`resident`."""
        return sum(self.roles[r].spec.memory.resident_bytes for r in self.resident())

    def node_running(self) -> int:
        """Leases taken with a slot across the node's roles."""
        return sum(st.running for st in self.roles.values())

    def node_limit(self) -> int | None:
        """Generations the node may run at once now (``None``: no node-wide limit)."""
        if self.concurrency is None:
            return None
        return self.concurrency.limit(self.resident())

    def placed(self) -> dict[str, InferenceSpec]:
        """The roles placed here (retiring ones are not), each with its spec in force or,
        while a restart is pending, the spec it restarts with: what the node serves."""
        return {
            role: st.next_spec or st.spec
            for role, st in self.roles.items()
            if st.retiring_since is None
        }

    def role_ids(self) -> tuple[str, ...]:
        """Every role the machine holds: placed, or retiring (not forgotten yet), by id."""
        return tuple(self.roles)

    def serves(self, role: str) -> bool:
        """Whether ``role`` takes requests here: placed, not retiring, not unavailable."""
        st = self.roles.get(role)
        return st is not None and st.retiring_since is None and st.unavailable is None

    def copy_load(self, role: str) -> tuple[Phase, bool, int]:
        """``role``'s phase, whether a stalled request made it suspect, and its requests in
        flight plus queued (a replica's load, for the choice among copies)."""
        st = self.roles[role]
        return st.phase, st.suspected, st.running + len(st.waiters)

    def waiting_reason(self, role: str) -> str | None:
        """Why ``role``'s waiters wait, as last decided (``None``: nothing said)."""
        return self.roles[role].waiting_reason

    def role_snapshot(self, role: str, now: float) -> RoleSnapshot:
        """``role``'s state at ``now`` (seconds), read-only, for display (``kv`` left
        ``None``: the machine does not know what its backends keep)."""
        st = self.roles[role]
        resident = st.phase in HOLDS_MEMORY
        idle = st.phase is Phase.READY and st.running == 0
        backoff = st.backoff_until - now if st.backoff_until is not None else 0.0
        return RoleSnapshot(
            phase="unavailable" if st.unavailable is not None else SHOWN_PHASE[st.phase],
            latency_class=LATENCY_CLASS_NAME[st.spec.latency_class],
            sticky=st.spec.sticky,
            resident_bytes=st.spec.memory.resident_bytes,
            running=st.running,
            queued=len(st.waiters),
            idle_s=round(now - st.last_used, 3) if idle else None,
            loaded_for_s=round(now - st.loaded_at, 3)
            if resident and st.loaded_at is not None
            else None,
            waiting_reason=st.waiting_reason if st.waiters else None,
            waiting_s=round(now - st.waiters[0].since, 3) if st.waiters else None,
            last_error=st.last_error,
            last_error_age_s=round(now - st.last_error_at, 3)
            if st.last_error_at is not None
            else None,
            load_backoff_s=round(backoff, 3) if backoff > 0 else None,
            base_url=st.endpoint.base_url if st.endpoint else None,
            pid=st.endpoint.pid if st.endpoint else None,
            # a re-plan changed what it launches: it restarts once idle (cut after drain_s)
            restart_pending=st.next_spec is not None,
            unavailable_reason=st.unavailable,
            retiring=st.retiring_since is not None,
            memory=dict(st.memory) if st.memory is not None else None,
        )

    def typical_load_s(self) -> float:
        """Seconds a load takes here (the slowest of the last 20, rounded up; 5 if none)."""
        if not self.load_seconds:
            return 5.0
        return float(math.ceil(max(self.load_seconds)))

    def exclusion_blockers(self, role: str) -> tuple[str, ...] | None:
        """The resident roles that exclude ``role``, if they are what keeps it out and
        may yield: ``None`` when none excludes it (the refusal is about memory) or
        when an interactive winner keeps out a batch role (interactive roles stay)."""
        spec = self.roles[role].spec
        blockers = tuple(
            other
            for other in self.resident()
            if other != role and excludes_each_other(spec, self.roles[other].spec)
        )
        if not blockers:
            return None
        if not spec.interactive and any(self.roles[b].spec.interactive for b in blockers):
            return None
        return blockers

    def can_yield(self, role: str, now: float, for_role: str) -> bool:
        st = self.roles[role]
        return (
            st.phase is Phase.READY
            and st.running == 0
            and not st.waiters
            and not self.recently_loaded(st, now, for_role)
        )

    def recently_loaded(self, st: RoleState, now: float, for_role: str | None) -> bool:
        """Whether min residency holds ``st``'s role against ``for_role``: it was loaded less
        than ``min_busy_residency_s`` ago, evicting ``for_role`` to make room (the ping-pong the
        rule prevents), and it has work (a request in flight or queued).

        Demand decides the hold: a role nobody is using yields at once, whatever it
        displaced, since holding it only makes the request that wants its room wait
        (alternating a, b, a one request at a time cost 10 s a swap, issue 22). The
        first swap of an idle role is not held, and nothing is held against no role
        (``None``: a re-plan fitting a smaller capacity)."""
        return (
            for_role is not None
            and (st.running > 0 or bool(st.waiters))
            and st.loaded_at is not None
            and now - st.loaded_at < self.limits.min_busy_residency_s
            and for_role in st.displaced
        )

    def turn_start(self, for_role: str, since: float) -> float:
        """When the wait of ``for_role``'s oldest request (waiting since ``since``) starts
        to count against the turn of the roles in its way: its arrival, or the latest
        load of another ready role if later. Counting from the turn's start, not the
        arrival, keeps every turn ``max_wait_s`` long under a backlog; counted from
        the arrival, every turn after the first would end as it began."""
        loads = [
            st.loaded_at
            for role, st in self.roles.items()
            if role != for_role and st.phase is Phase.READY and st.loaded_at is not None
        ]
        return max([since, *loads])

    def turn_left_s(self, for_role: str, since: float, now: float) -> float:
        """Seconds left of the turn of a role that ``for_role``'s oldest request (waiting
        since ``since``) cannot be resident with: while it lasts, that role serves its
        own queue (same-role batching) instead of draining for ``for_role``.

        A turn lasts ``max_wait_s`` from its start (``_turn_start``); 0 for an
        interactive request, which keeps its precedence (the roles in its way drain
        at once). The resident role's turn also ends when its queue is empty (the
        caller checks): demand ends it first (issue 22, llama-swap#612)."""
        if self.roles[for_role].spec.interactive:
            return 0.0
        return max(0.0, self.turn_start(for_role, since) + self.limits.max_wait_s - now)

    def hold_note(self, blocking: Iterable[str], for_role: str, since: float, now: float) -> str:
        """Words for ``for_role``'s waiting reason (``ps``, the page, a 503) on what holds
        the ``blocking`` roles and until when, in seconds from ``now``: their turn
        (``--max-wait``), their minimum residency (``--min-busy-residency``), or the
        drain before their requests are cut (``--drain``). Empty if none applies."""
        notes = []
        turn_left = self.turn_left_s(for_role, since, now)
        for b in blocking:
            st = self.roles[b]
            if st.phase is not Phase.READY:
                continue
            if self.recently_loaded(st, now, for_role) and st.loaded_at is not None:
                left = st.loaded_at + self.limits.min_busy_residency_s - now
                notes.append(f"{b} holds its room {left:.0f} s more (--min-busy-residency)")
            elif turn_left > 0 and st.waiters:
                notes.append(f"{b} serves its turn {turn_left:.0f} s more at most (--max-wait)")
            elif st.running:
                waiting = self.roles[for_role]
                start = waiting.drain_from if waiting.drain_from is not None else since
                left = max(0.0, start + self.limits.drain_s - now)
                notes.append(f"{b} drains; its requests are cut in {left:.0f} s (--drain)")
        return "".join(f"; {note}" for note in notes)

    def drained(self, for_role: str, since: float, now: float) -> bool:
        """Whether busy roles in the way of ``for_role``'s oldest request (waiting since
        ``since``) have had their ``drain_s`` and may be cut: counted from its arrival,
        or, once a role in its way took its turn, from when that turn ended."""
        st = self.roles[for_role]
        if st.drain_from is not None:
            return now - st.drain_from >= self.limits.drain_s
        if st.turn_given:
            return False  # a turn is under way: nothing drains for it yet
        return now - since >= self.limits.drain_s

    def node_state(self, now: float, *, ignore_in_flight: bool, for_role: str | None) -> NodeState:
        resident = self.resident()
        busy: dict[str, int] = {}
        for role in resident:
            st = self.roles[role]
            if st.phase is not Phase.READY:
                busy[role] = 1  # loading or stopping: never a candidate to evict
            elif st.running and not ignore_in_flight:
                busy[role] = st.running
        recency = tuple(sorted(resident, key=lambda r: (self.roles[r].last_used, r)))
        recent = frozenset(
            r for r in resident if self.recently_loaded(self.roles[r], now, for_role)
        )
        return NodeState(
            capacity_bytes=self.capacity_bytes,
            specs=self.specs,
            resident=frozenset(resident),
            in_flight=busy,
            recency=recency,
            recently_loaded=recent,
        )

    def device_states(self, host: NodeState) -> dict[str, NodeState]:
        """Device id -> the residency question for that device, beside ``host`` (this
        node's :meth:`node_state`): the roles placed on the device, each with ``memory``
        set to what it holds there, and those of them resident, busy or recent as on the
        host (``rosterd.residency.decide_by_pool``). Empty on a node without devices."""
        states: dict[str, NodeState] = {}
        for device, pool in sorted(self.devices.items()):
            specs = {
                role: replace(self.specs[role], memory=MemorySpec(weights_bytes=held))
                for role, held in pool.bytes_by_role.items()
                if role in self.specs
            }
            resident = host.resident & specs.keys()
            states[device] = NodeState(
                capacity_bytes=pool.capacity_bytes,
                specs=specs,
                resident=frozenset(resident),
                in_flight={r: n for r, n in host.in_flight.items() if r in resident},
                recency=tuple(r for r in host.recency if r in resident),
                recently_loaded=host.recently_loaded & resident,
            )
        return states

    def pools_view(self) -> dict[str, dict[str, object]]:
        """Each pool of the node as ``/status`` and ``rosterd ps`` show it: ``host`` (its
        ``capacity_bytes`` and ``resident_bytes``, as the node's own figures) and, per
        device, ``declared_bytes``, ``probed_total_bytes`` and ``source`` (where its figure
        comes from), ``capacity_bytes`` (what rosterd counts against there),
        ``resident_bytes`` (the resident roles' bytes there) and ``roles`` (role -> its
        bytes there), every figure in bytes. A node without devices has ``host`` alone."""
        resident = set(self.resident())
        view: dict[str, dict[str, object]] = {
            "host": {"capacity_bytes": self.capacity_bytes, "resident_bytes": self.resident_bytes()}
        }
        for device, pool in sorted(self.devices.items()):
            view[device] = {
                "declared_bytes": pool.declared_bytes,
                "probed_total_bytes": pool.probed_total_bytes,
                "source": pool.source,
                "capacity_bytes": pool.capacity_bytes,
                "resident_bytes": sum(b for r, b in pool.bytes_by_role.items() if r in resident),
                "roles": dict(sorted(pool.bytes_by_role.items())),
            }
        return view

    def cut_after(self, label: str) -> str:
        """When requests in flight are cut by a stop labelled ``label``, in words: after
        ``--drain``, or, for a shutdown a second signal hurried, after the seconds the
        drain really lasted (it said "after --drain 30 s" of a stream cut at 2 s)."""
        if label == "shutdown" and self.drain_ended is not None:
            drained_s, at_once = self.drain_ended
            if at_once:
                return f"after {drained_s:.1f} s of the drain: a second signal stopped it at once"
        return f"after --drain {self.limits.drain_s:g} s"

    def revocation(self, role: str, label: str, for_role: str | None) -> Revocation:
        """What a client whose request to ``role`` is cut by this stop is told."""
        after = self.cut_after(label)
        if label == "shutdown":
            return Revocation(
                "shutting_down", f"rosterd is shutting down; role {role} was stopped {after}"
            )
        if label == "unload":
            why = "was unloaded (rosterd unload)"
        elif label == "replan":
            why = "was stopped by a re-plan (a reload of the roster, overlay or fleet)"
        elif label == "exclusion" and for_role is not None:
            why = f"was unloaded for {for_role} (they exclude each other)"
        elif for_role is not None:
            why = f"was unloaded to make room for {for_role}"
        else:
            why = "was unloaded"
        return Revocation("evicted", f"role {role} {why} {after}")

    def mark_stopped(self, role: str) -> None:
        st = self.roles[role]
        st.phase = Phase.STOPPED
        st.endpoint = None
        st.running = 0
        st.loaded_at = None
        st.displaced = frozenset()
        st.probing = st.suspected = False

    def note_error(self, role: str, error: str, now: float) -> None:
        """Keep ``error`` (short, for ``ps``) as ``role``'s last error."""
        st = self.roles[role]
        st.last_error = client_reason(error)
        st.last_error_at = now

    def retry_after(self) -> float:
        return max(1.0, self.typical_load_s())

    def fail(
        self,
        ticket: int,
        error: type[SchedulerError],
        message: str,
        retry_after_s: float | None = None,
    ) -> None:
        self.out.append(FailWaiter(ticket, error, message, retry_after_s))

    def fail_waiters(self, role: str, error: type[SchedulerError], message: str) -> None:
        """Fail every waiter of ``role`` with ``error(message)``; the queue is empty after."""
        st = self.roles[role]
        for w in st.waiters:
            self.fail(w.ticket, error, message)
        st.waiters.clear()
        self.gauges(role)

    def record(
        self,
        kind: str,
        role: str,
        cause: str,
        *,
        duration_s: float | None = None,
        label: str | None = None,
    ) -> None:
        self.out.append(
            RecordEvent(
                kind=kind,
                role=role,
                cause=cause,
                resident=self.resident(),
                resident_bytes=self.resident_bytes(),
                duration_s=duration_s,
                label=label,
            )
        )

    def gauges(self, role: str) -> None:
        st = self.roles[role]
        now = (st.running, len(st.waiters))
        if now != st.gauges:
            st.gauges = now
            self.out.append(UpdateGauges(role, *now))
