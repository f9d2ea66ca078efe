"""A node's scheduler (DESIGN.md layer 6): the public API of one node's loop.

Callers never read the resident set and then act on it. They ask the node
(:meth:`NodeScheduler.acquire`, ``release``, ``suspect``, ``unload``,
``backend_event``, ``node_lost``, ``measured_peak``, ``apply``, ``shutdown``); each
call becomes an event (:mod:`rosterd.scheduler.events`) stamped with the node's clock
and put in the node's inbox, and where it waits, it waits on a future the loop
resolves. The loop, which hands events to the pure
:class:`~rosterd.scheduler.machine.NodeMachine` and is the only place its effects are
applied, is :class:`~rosterd.scheduler.loop.NodeLoop`, which ``NodeScheduler``
holds (composed, not inherited: the loop's futures and tasks are its own). The machine
alone holds the node's state: what is placed here, what cannot be served, the budget,
the limits, the memory figures. ``NodeScheduler`` keeps no
copy; what it shows (:attr:`NodeScheduler.specs`, :meth:`NodeScheduler.snapshot`)
it reads from the machine, for display and routing only.

Plain asyncio: scheduling is rosterd's own job.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace

from rosterd.backends.interface import (
    BackendEvent,
    BackendEventSource,
    KeptKvSource,
    LoadHistory,
    MeasuredBackends,
    RoleBackends,
)
from rosterd.errors import RosterdError, ShuttingDownError, UnknownRoleError
from rosterd.metrics import RosterdMetrics
from rosterd.replica_choice import CopyState
from rosterd.scheduler.events import (
    Acquire,
    Cancel,
    MeasuredPeak,
    NodeLost,
    Reconfigure,
    Reconfigured,
    RecordEvent,
    Release,
    Shutdown,
    Suspect,
    Unload,
)
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.loop import NodeLoop
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import (
    DevicePool,
    NodeChange,
    NodeConcurrency,
    Phase,
    SchedulerLimits,
)
from rosterd.scheduler.views import NodeSnapshot, RoleSnapshot
from rosterd.spec import InferenceSpec

#: A copy's state by its role's phase (``ready`` is decided with its probe, above).
_COPY_STATES: dict[Phase, CopyState] = {
    Phase.STOPPED: CopyState.COLD,
    Phase.STOPPING: CopyState.COLD,
    Phase.LOADING: CopyState.LOADING,
    Phase.RESTARTING: CopyState.LOADING,
    Phase.UNHEALTHY: CopyState.UNHEALTHY,
    Phase.LOST: CopyState.LOST,
    Phase.READY: CopyState.READY,
}


class NodeScheduler:
    """The owner of one node's resident set (one asyncio task, started by :meth:`start`).

    ``specs``: the roles placed on the node (role -> spec); ``capacity_bytes``:
    the node's budget (``Node.capacity_bytes``); ``backends`` starts and stops
    them (the backends boundary). ``unavailable``: role -> why it cannot be
    served (checked at start, e.g. missing weights); requests for it fail at
    once with :class:`RoleUnavailableError` and no load is tried. ``clock``
    (monotonic seconds) and ``wall_clock`` (seconds since the epoch, for the
    event log) are injectable for tests. ``backend_events``: where backend
    events come from when no supervisor callback reaches :meth:`backend_event`
    (a remote node agent); the loop asks it for them. ``pids_are_local``:
    whether the backends' pids are processes of this machine (``False`` for a
    node agent's: an endpoint then never carries one, even after a restart). ``concurrency``: the
    node-wide limit on generations at once (``None``: only the per-role limit).
    ``memory``: role -> its memory figures (``RoleMemory.as_json``), shown in
    :meth:`snapshot`. ``devices``: device id -> its pool (none: host RAM alone; a load
    needs room in every pool its role uses). All of the node's state but its backends is
    handed to its machine, which alone holds it from then on.
    """

    #: How long :meth:`measured_bytes` waits for the backends to answer, seconds.
    MEASURE_TIMEOUT_S = 5.0

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        specs: Mapping[str, InferenceSpec],
        backends: RoleBackends,
        *,
        limits: SchedulerLimits | None = None,
        metrics: RosterdMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        event_log_size: int = 2000,
        unavailable: Mapping[str, str] | None = None,
        backend_events: BackendEventSource | None = None,
        pids_are_local: bool = True,
        concurrency: NodeConcurrency | None = None,
        memory: Mapping[str, Mapping[str, object]] | None = None,
        devices: Mapping[str, DevicePool] | None = None,
    ) -> None:
        limits = limits or SchedulerLimits()
        machine = NodeMachine(
            capacity_bytes,
            specs,
            limits,
            concurrency,
            unavailable=unavailable,
            memory=memory,
            devices=devices,
        )
        self.name = name
        self.limits = limits
        self.pids_are_local = pids_are_local
        self._clock = clock
        self._machine = machine
        self._loop = NodeLoop(
            name,
            machine,
            backends,
            limits=limits,
            metrics=metrics,
            clock=clock,
            wall_clock=wall_clock,
            event_log_size=event_log_size,
            backend_events=backend_events,
            pids_are_local=pids_are_local,
        )
        self._tickets = itertools.count(1)
        #: The node's event log, oldest first, and who hears each event (the loop's own).
        self.events = self._loop.events
        self.listeners = self._loop.listeners

    # ---- public API (any task) ------------------------------------------------

    def start(self) -> None:
        """Start the node's task on the running loop (idempotent)."""
        self._loop.start()

    @property
    def capacity_bytes(self) -> int:
        """The node's budget in force, as its machine holds it."""
        return self._machine.capacity_bytes

    def backend_event(self, event: BackendEvent) -> None:
        """Tell the node what the supervisor saw happen to a role's backend (any task);
        see :meth:`NodeLoop.backend_event`."""
        self._loop.backend_event(event)

    async def acquire(
        self,
        role: str,
        *,
        timeout_s: float | None = None,
        take_slot: bool = True,
        no_evict: bool = False,
        newer_than: int | None = None,
    ) -> Lease:
        """Wait until ``role`` is ready and (``take_slot``) a slot is free; return a lease.

        Every lease taken with ``take_slot`` must be given back with
        :meth:`release`. ``timeout_s`` defaults to ``limits.queue_timeout_s``.
        ``no_evict`` loads the role only if nothing must be evicted (warm-up).
        ``newer_than``: a lease generation whose backend failed this request
        before it answered; the lease returned is of a later one (the restarted
        backend), unless a generation probe finds that backend alive after all.
        Cancelling the caller only removes its place in the queue. Whether the role is
        placed here and can be served is the machine's to decide, as the rest is.

        Raises:
            UnknownRoleError, RoleMovedError, RoleUnavailableError, QueueFullError,
            QueueTimeoutError, RoleRefusedError, LoadFailedError, ShuttingDownError.
        """
        if self._loop.shutting_down:  # the loop ends with the shutdown: it would not answer
            raise ShuttingDownError("rosterd is shutting down")
        ticket = next(self._tickets)
        future = self._loop.expect_lease(ticket)
        timeout = self.limits.queue_timeout_s if timeout_s is None else timeout_s
        self._loop.post(
            Acquire(self._clock(), ticket, role, take_slot, no_evict, timeout, newer_than)
        )
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                if take_slot:  # granted in the same instant: give the slot back
                    self.release(future.result())
            else:
                future.cancel()  # a grant still on its way is handed back (see _grant)
                self._loop.post(Cancel(self._clock(), ticket, role))
            raise

    def release(self, lease: Lease) -> None:
        """Give back a lease taken with ``take_slot`` (safe to call from any task, once)."""
        self._loop.post(Release(self._clock(), lease.role, lease.generation))

    def suspect(self, lease: Lease, reason: str, *, wedged: bool = False) -> None:
        """A request on ``lease`` got no byte within its deadline (``reason``, in words): run
        the role's generation probe unless one runs; a failed probe makes it ``unhealthy``.
        ``wedged``: the request's progress check saw the backend stuck: ``unhealthy`` now."""
        self._loop.post(Suspect(self._clock(), lease.role, lease.generation, reason, wedged))

    @property
    def specs(self) -> dict[str, InferenceSpec]:
        """The roles placed on the node now (role -> spec; retiring ones are not), read from
        its machine: for routing and display, never to decide a request."""
        return self._machine.placed()

    @property
    def backends(self) -> RoleBackends:
        """The backends boundary that starts this node's roles from now on."""
        return self._loop.backends

    def record(self, kind: str, role: str, cause: str) -> None:
        """Log a change to ``role`` decided above this node (a fleet re-plan: ``moved``,
        ``unplaced``) with its ``cause``, as the machine's own events are (the event log,
        ``/rosterd/events``, and a log line); the metrics count only the machine's."""
        self._loop.record(
            RecordEvent(kind, role, cause, self._machine.resident(), self._machine.resident_bytes())
        )

    def node_lost(self, reason: str) -> None:
        """Tell the node it is lost (``reason``: why; idempotent, any task).

        Every role goes ``lost`` and holds nothing; requests waiting for them (and
        new ones) keep waiting up to their queue timeout, for the run-time re-plan
        to serve them elsewhere; no start or stop is asked of the node again.
        """
        self._loop.post(NodeLost(self._clock(), reason))

    @property
    def devices(self) -> dict[str, DevicePool]:
        """Device id -> its pool as the node holds its roles to it now (none: host RAM
        alone)."""
        return dict(self._machine.state.devices)

    def copy_state(self, role: str) -> CopyState | None:
        """What this node's copy of ``role`` can do now, for the choice among a role's
        copies (``rosterd.replica_choice``); ``None``: it cannot serve it here (not
        placed, unavailable, retiring). A ready role a stalled request made suspect
        counts as unhealthy until its probe answers."""
        if not self._machine.serves(role):
            return None
        if self._machine.lost_reason is not None:
            return CopyState.LOST
        phase, suspected, _load = self._machine.copy_load(role)
        if phase is Phase.READY:
            return CopyState.UNHEALTHY if suspected else CopyState.READY
        return _COPY_STATES[phase]

    def copy_slots(self, role: str) -> int:
        """How many requests this node's copy of ``role`` runs at once before the next
        waits for a slot (``NodeMachine.copy_slots``: its backend's parallel slots, the
        per-role and the node-wide limits), for the choice among a role's copies."""
        return self._machine.copy_slots(role)

    @property
    def lost_reason(self) -> str | None:
        """Why the node is lost, as last handled by the loop (``None`` while it is not)."""
        return self._machine.lost_reason

    async def measured_bytes(self) -> dict[str, int]:
        """Role -> measured RSS in bytes of its backend, from the backends boundary
        (``MeasuredBackends``); ``{}`` when the boundary cannot measure, fails, or does
        not answer within ``MEASURE_TIMEOUT_S``. For display only."""
        backends = self._loop.backends
        if not isinstance(backends, MeasuredBackends):
            return {}
        try:
            async with asyncio.timeout(self.MEASURE_TIMEOUT_S):
                measured = await backends.measured_bytes()
        except (RosterdError, TimeoutError):
            return {}
        placed = self.specs
        return {role: rss for role, rss in measured.items() if role in placed}

    def measured_peak(
        self,
        role: str,
        peak_bytes: int,
        run_peak_bytes: int,
        device_bytes: Mapping[str, int] | None = None,
    ) -> None:
        """Tell the node what ``role``'s backend was measured holding (any task):
        ``peak_bytes`` its run's peak RSS, ``run_peak_bytes`` the largest of this ``up``
        under the same settings (shown in :meth:`snapshot`), ``device_bytes`` device id ->
        what it holds there (NVML, per process). The machine decides whether the role's
        count follows it (``MeasuredPeak``)."""
        measured = MeasuredPeak(
            self._clock(), role, peak_bytes, run_peak_bytes, dict(device_bytes or {})
        )
        self._loop.post(measured)

    async def unload(self, role: str) -> None:
        """Stop ``role``'s backend once its in-flight requests finished (or ``drain_s`` passed).

        From the call on, the role grants no new lease: newer requests wait in its
        queue and load it again once it stopped. Returns after the process
        exited (at once if it was not resident).
        Raises ``UnknownRoleError``.
        """
        if role not in self.specs:  # read from the machine: an unload asks nothing of it
            raise UnknownRoleError(f"role {role!r} is not placed on node {self.name!r}")
        if self._loop.shut_down:
            return  # nothing is resident any more
        ticket = next(self._tickets)
        future = self._loop.expect_unload(ticket)
        self._loop.post(Unload(self._clock(), ticket, role))
        await asyncio.shield(future)

    def apply(
        self,
        specs: Mapping[str, InferenceSpec],
        *,
        capacity_bytes: int,
        backends: RoleBackends,
        unavailable: Mapping[str, str] | None = None,
        restart: Collection[str] = (),
        moved: Mapping[str, str] | None = None,
        memory: Mapping[str, Mapping[str, object]] | None = None,
        concurrency: NodeConcurrency | None = None,
        devices: Mapping[str, DevicePool] | None = None,
    ) -> NodeChange:
        """Serve ``specs`` within ``capacity_bytes`` from now on (a re-plan); what changes.

        One ``Reconfigure`` event carries the desired state whole; the machine compares
        it with its own state and acts on the difference (see ``docs/scheduler.md``,
        re-plan). Roles no longer in ``specs`` retire (their requests are served, then
        they stop; new requests for them raise ``UnknownRoleError``); a role whose spec
        changed what it launches, or named in ``restart`` (its weights or launch options
        changed outside the spec), restarts once idle; a smaller budget evicts to fit.
        ``backends`` starts every role from now on; a role is stopped by the backends
        that started it. ``moved``: role -> the node a retired role moved to; its
        waiters this node does not serve fail with ``RoleMovedError`` (to be queued
        there). ``unavailable``: role -> why it cannot be served (its requests fail at
        once). ``memory``: role -> its memory figures for :meth:`snapshot` (replacing
        those given before for the same roles). ``concurrency``: the node-wide limit
        from now on (``None``: the one in force stays). ``devices``: device id -> its
        pool, whole (none: host RAM is the only pool).

        Synchronous, and the loop takes the event at once, after what its inbox holds
        (``NodeLoop.take_now``): every request after this call, and every read of
        :attr:`specs`, sees the new set in the machine itself, so nothing outside it
        keeps a copy to stay in step with. The ``NodeChange`` returned is the machine's
        own answer (its ``Reconfigured`` effect), the difference between its state and
        the desired one: it stays right when two re-plans come one after the other, as
        a diff against anything kept here would not. Needs a running event loop.
        """
        self._loop.backends = backends
        event = Reconfigure(
            self._clock(),
            dict(specs),
            capacity_bytes,
            concurrency,
            dict(unavailable or {}),
            {role: dict(figures) for role, figures in (memory or {}).items()},
            frozenset(restart),
            dict(moved or {}),
            dict(devices or {}),
        )
        answers = [e.change for e in self._loop.take_now(event) if isinstance(e, Reconfigured)]
        return answers[0] if answers else NodeChange()  # none: the step failed, and said so

    async def shutdown(self) -> None:
        """Stop taking requests, let in-flight ones finish (up to ``drain_s``), stop every backend.

        Waiting requests fail with ``ShuttingDownError``; a load under way is
        aborted at once. Returns after every backend this node started has exited.
        """
        await self._loop.shutdown(Shutdown(self._clock()))

    def stop_now(self) -> None:
        """Cut the drain of a :meth:`shutdown` under way (a second Ctrl-C): requests in
        flight end now and every backend stops (SIGTERM, its grace, then SIGKILL)."""
        if self._loop.shutting_down and not self._loop.shut_down:
            self._loop.post(Shutdown(self._clock(), at_once=True))

    def past_loads_s(self, role: str) -> tuple[float, ...]:
        """``role``'s past loads on this node across runs, seconds, oldest first
        (``LoadHistory``); ``()`` where its backends keep none (a Ray node's agent)."""
        backends = self._loop.backends
        return backends.past_loads_s(role) if isinstance(backends, LoadHistory) else ()

    def snapshot(self) -> NodeSnapshot:
        """The node's state now, read-only, for display (``/status``, ``rosterd ps``): the
        machine's view of each role with what the backends keep of its KV cache
        (``KeptKvSource.kept_kv``, from memory), see :class:`NodeSnapshot`."""
        now = self._clock()
        backends = self._loop.backends
        roles: dict[str, RoleSnapshot] = {}
        for role in self._machine.role_ids():
            view = self._machine.role_snapshot(role, now)
            if isinstance(backends, KeptKvSource):
                view = replace(view, kv=backends.kept_kv(role))
            roles[role] = view
        return NodeSnapshot(
            capacity_bytes=self._machine.capacity_bytes,
            resident_bytes=self._machine.resident_bytes(),
            resident=tuple(self._machine.resident()),
            transition=self._machine.transition_under_way,
            lost_reason=self._machine.lost_reason,
            roles=roles,
            running=self._machine.node_running(),
            max_concurrency=self._machine.node_limit(),
            pools=self._machine.state.pools_view(),
        )
