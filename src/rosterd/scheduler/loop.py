"""The node loop (DESIGN.md layer 6): the one place a node's machine's effects are applied.

:class:`NodeLoop` is the asyncio half of :class:`~rosterd.scheduler.node.NodeScheduler`,
which holds one and puts the public API over it. One task per node (``_run``) takes one
event at a time from the node's inbox, hands it to the pure
:class:`~rosterd.scheduler.machine.NodeMachine` and applies the effects that
come back, in order: it resolves the callers' futures (``GrantLease``,
``FailWaiter``, ``FinishUnload``, ``FinishShutdown``), runs
``RoleBackends.start``/``stop``/``probe``/``restart`` and ``IdleKvSaver.save_kv`` as
tasks whose results come back as ``LoadDone``/``StopDone``/``ProbeDone``/``KvSaveDone``
events, sets revocation futures, updates the metrics (:mod:`rosterd.metrics`), logs
(logger ``rosterd.scheduler``) and keeps the bounded event log (:attr:`NodeLoop.events`).
When the inbox stays empty for ``tick_s`` it sends a ``Tick``, so the machine checks its
timers. What a backend did by itself (the supervisor's ``BackendEvent``, a node agent's, a restart
of its own that failed) enters as ``BackendChanged`` (:meth:`NodeLoop.backend_event`).

Plain asyncio: scheduling is rosterd's own job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from rosterd.backends.interface import BackendEventSource, IdleKvSaver, RoleBackends
from rosterd.errors import NodeLostError, NodeUnreachableError
from rosterd.metrics import RosterdMetrics
from rosterd.scheduler.events import (
    BackendChanged,
    Effect,
    Event,
    FailWaiter,
    FinishShutdown,
    FinishUnload,
    ForgetRole,
    GrantLease,
    KvSaveDone,
    LoadDone,
    LogNote,
    ProbeBackend,
    ProbeDone,
    Reconfigured,
    RecordEvent,
    Release,
    RestartBackend,
    RevokeLeases,
    SaveKv,
    StartBackend,
    StopBackend,
    StopDone,
    Tick,
    UpdateGauges,
)
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import Revocation, SchedulerEvent, SchedulerLimits
from rosterd.supervisor import BackendEvent, describe_exit

log = logging.getLogger("rosterd.scheduler")

_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING}


class NodeLoop:
    """The loop of one node, applying ``machine``'s effects (see the module).

    ``name``: the node; ``machine``: its pure machine, which alone holds the node's
    state; ``backends``: the backends boundary that starts its roles;
    ``limits``: the knobs (``tick_s``); ``metrics``, ``clock`` (monotonic
    seconds), ``wall_clock`` (seconds since the epoch, for the event log),
    ``event_log_size``, ``backend_events`` and ``pids_are_local`` as
    :class:`~rosterd.scheduler.node.NodeScheduler` takes them. ``backends`` may be
    replaced (a re-plan): every start from then on goes to the new one.
    """

    def __init__(
        self,
        name: str,
        machine: NodeMachine,
        backends: RoleBackends,
        *,
        limits: SchedulerLimits,
        metrics: RosterdMetrics | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        event_log_size: int,
        backend_events: BackendEventSource | None,
        pids_are_local: bool,
    ) -> None:
        self.name = name
        self.limits = limits
        self.backends = backends
        self._started_by: dict[str, RoleBackends] = {}  # a role's stop goes where its start went
        self._backend_events = backend_events
        self.pids_are_local = pids_are_local
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._machine = machine
        self._inbox: asyncio.Queue[Event] = asyncio.Queue()
        self._work: set[asyncio.Task[None]] = set()  # starts, stops, the event pump
        self._waiting: dict[int, asyncio.Future[Lease]] = {}
        self._unloading: dict[int, asyncio.Future[None]] = {}
        self._revocations: dict[str, tuple[int, asyncio.Future[Revocation]]] = {}
        self._shut_down: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.events: deque[SchedulerEvent] = deque(maxlen=event_log_size)
        self.listeners: list[Callable[[SchedulerEvent], None]] = []
        if metrics is not None:
            metrics.capacity_bytes.labels(node=name).set(machine.capacity_bytes)
            metrics.resident_bytes.labels(node=name).set(0)
        self._pool_gauges()

    def _pool_gauges(self) -> None:
        """Each pool's capacity and resident bytes, labelled by ``device`` (``host``: RAM)."""
        if self._metrics is None:
            return
        for device, pool in self._machine.state.pools_view().items():
            labels = {"node": self.name, "device": device}
            for gauge, key in (
                (self._metrics.pool_capacity_bytes, "capacity_bytes"),
                (self._metrics.pool_resident_bytes, "resident_bytes"),
            ):
                figure = pool[key]
                if isinstance(figure, int):
                    gauge.labels(**labels).set(figure)

    @property
    def capacity_bytes(self) -> int:
        """The node's budget in force, as its machine holds it."""
        return self._machine.capacity_bytes

    def backend_event(self, event: BackendEvent) -> None:
        """Tell the node what the supervisor saw happen to a role's backend (any task).

        ``exited``/``restarting`` of a ready role: it goes to ``restarting``;
        ``ready``: the restarted process (``event.pid``) serves it again;
        a final ``restart_failed``: it is no longer resident. Events for other
        names (a shared server) or phases (a load or stop under way) are ignored.
        """
        if event.name not in self._machine.role_ids():
            return  # another node's role, or a shared server (the machine ignores it too)
        code = event.exit_code
        self.post(
            BackendChanged(
                self._clock(),
                event.name,
                event.kind,
                pid=event.pid,
                exit_reason=describe_exit(code) if code is not None else None,
                detail=event.detail,
                final=event.final,
                pid_is_local=self.pids_are_local,
            )
        )

    def start(self) -> None:
        """Start the node's task on the running loop (idempotent)."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"rosterd-node-{self.name}")
            if self._backend_events is not None:
                self._spawn(self._pump_backend_events())

    @property
    def shutting_down(self) -> bool:
        """Whether :meth:`shutdown` was called: the loop ends with it."""
        return self._shut_down is not None

    @property
    def shut_down(self) -> bool:
        """Whether the shutdown finished: every backend this node started has exited."""
        return self._shut_down is not None and self._shut_down.done()

    def expect_lease(self, ticket: int) -> asyncio.Future[Lease]:
        """The future the ``GrantLease`` or ``FailWaiter`` of ``ticket`` resolves."""
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = future
        return future

    def expect_unload(self, ticket: int) -> asyncio.Future[None]:
        """The future the ``FinishUnload`` of ``ticket`` resolves (or the shutdown)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unloading[ticket] = future
        return future

    async def shutdown(self, shutdown: Event) -> None:
        """Post ``shutdown`` (the machine's ``Shutdown``) once, starting the loop if it
        never was, and return when the machine says it finished; then end the loop's task
        and work and resolve the unloads still waiting."""
        if self._shut_down is None:
            self._shut_down = asyncio.get_running_loop().create_future()
            self.start()  # a node never started still answers its shutdown
            self.post(shutdown)
        await asyncio.shield(self._shut_down)
        for task in [self._task, *self._work]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for future in self._unloading.values():
            if not future.done():
                future.set_result(None)
        self._unloading.clear()

    def post(self, event: Event) -> None:
        """Put ``event`` in the node's inbox (any task); the loop takes it in order."""
        self._inbox.put_nowait(event)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _run(self) -> None:
        while True:
            event: Event
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
                # that lands together with its timeout, and shutdown cancels this task.
                async with asyncio.timeout(self.limits.tick_s):
                    event = await self._inbox.get()
            except TimeoutError:
                event = Tick(self._clock())
            self._handle(event)
            while not self._inbox.empty():
                self._handle(self._inbox.get_nowait())

    def take_now(self, event: Event) -> list[Effect]:
        """Hand ``event`` to the machine now, after every event the inbox holds (in order,
        so nothing overtakes what was posted before it), and apply the effects; they are
        returned too. Synchronous, on the loop's thread: ``_run`` finds those events gone,
        and nothing else runs in between, so the machine still has one owner."""
        while not self._inbox.empty():
            self._handle(self._inbox.get_nowait())
        return self._handle(event)

    def _handle(self, event: Event) -> list[Effect]:
        try:
            effects = self._machine.handle(event)
        except Exception:  # a bug here must not kill the node's task silently
            log.exception("node %s: scheduling step failed on %s", self.name, event)
            return []
        for effect in effects:
            try:
                self._apply(effect)
            except Exception:
                log.exception("node %s: applying %s failed", self.name, effect)
        return effects

    def _apply(self, effect: Effect) -> None:
        if isinstance(effect, GrantLease):
            self._grant(effect)
        elif isinstance(effect, FailWaiter):
            future = self._waiting.pop(effect.ticket, None)
            if future is not None and not future.done():
                future.set_exception(effect.error(effect.message, effect.retry_after_s))
        elif isinstance(effect, RecordEvent):
            self.record(effect)
        elif isinstance(effect, UpdateGauges):
            if self._metrics is not None:
                labels = {"node": self.name, "role": effect.role}
                self._metrics.in_flight.labels(**labels).set(effect.running)
                self._metrics.queued.labels(**labels).set(effect.queued)
        elif isinstance(effect, StartBackend):
            self._started_by[effect.role] = self.backends
            self._spawn(self._start_backend(effect.role, self.backends))
        elif isinstance(effect, StopBackend):
            backends = self._started_by.get(effect.role, self.backends)
            self._spawn(self._stop_backend(effect.role, backends))
        elif isinstance(effect, ProbeBackend):
            self._spawn(self._probe_backend(effect))
        elif isinstance(effect, SaveKv):
            self._spawn(self._save_kv(effect))
        elif isinstance(effect, RestartBackend):
            self._spawn(self._restart_backend(effect.role))
        elif isinstance(effect, RevokeLeases):
            held = self._revocations.get(effect.role)
            if held is not None and held[0] == effect.generation and not held[1].done():
                held[1].set_result(effect.revocation)
        elif isinstance(effect, LogNote):
            log.log(_LOG_LEVELS[effect.level], "node %s: %s", self.name, effect.message)
        elif isinstance(effect, FinishUnload):
            done = self._unloading.pop(effect.ticket, None)
            if done is not None and not done.done():
                done.set_result(None)
        elif isinstance(effect, ForgetRole):
            self._started_by.pop(effect.role, None)
            self._revocations.pop(effect.role, None)
        elif isinstance(effect, Reconfigured):
            budget = effect.change.capacity_bytes
            if self._metrics is not None and budget is not None:
                self._metrics.capacity_bytes.labels(node=self.name).set(budget[1])
            self._pool_gauges()
        else:
            assert isinstance(effect, FinishShutdown)
            if self._shut_down is not None and not self._shut_down.done():
                self._shut_down.set_result(None)

    def _grant(self, effect: GrantLease) -> None:
        future = self._waiting.pop(effect.ticket, None)
        if future is None or future.done():
            # The waiter left in the same instant: the slot the machine counted goes back.
            if effect.take_slot:
                self.post(Release(self._clock(), effect.role, effect.generation))
            return
        held = self._revocations.get(effect.role)
        if held is None or held[0] != effect.generation or held[1].done():
            held = (effect.generation, asyncio.get_running_loop().create_future())
            self._revocations[effect.role] = held
        lease = Lease(
            effect.role, self.name, effect.endpoint, effect.generation, effect.waited_s, held[1]
        )
        future.set_result(lease)
        backends = self._started_by.get(effect.role, self.backends)
        if effect.take_slot and isinstance(backends, IdleKvSaver):
            backends.kv_changing(effect.role)
        if self._metrics is not None and effect.take_slot:
            self._metrics.queue_wait.labels(role=effect.role).observe(effect.waited_s)

    async def _start_backend(self, role: str, backends: RoleBackends) -> None:
        try:
            endpoint = await backends.start(role)
        except Exception as exc:
            short = getattr(exc, "client_message", None)
            self.post(
                LoadDone(
                    self._clock(),
                    role,
                    error=str(exc),
                    client_message=short if isinstance(short, str) and short else None,
                )
            )
            return
        self.post(LoadDone(self._clock(), role, endpoint=endpoint))

    async def _stop_backend(self, role: str, backends: RoleBackends) -> None:
        error: str | None = None
        try:
            await backends.stop(role)
        except Exception as exc:
            error = str(exc) or type(exc).__name__
        self.post(StopDone(self._clock(), role, error))

    async def _save_kv(self, effect: SaveKv) -> None:
        backends = self._started_by.get(effect.role, self.backends)
        try:
            if isinstance(backends, IdleKvSaver):
                await backends.save_kv(effect.role)
        except Exception:  # the contract says never; the role must not wait forever
            log.exception("node %s: the idle KV save of %s failed", self.name, effect.role)
        finally:
            self.post(KvSaveDone(self._clock(), effect.role, effect.generation))

    async def _probe_backend(self, effect: ProbeBackend) -> None:
        role, timeout = effect.role, effect.timeout_s
        unreachable = False
        try:
            # The probe bounds itself (with the look at a busy backend's progress after
            # it); this bounds a backends boundary that does not.
            async with asyncio.timeout(timeout + self.limits.probe_busy_window_s + 15.0):
                result = await self.backends.probe(role, timeout_s=timeout)
            ok, detail = result.ok, result.detail
        except TimeoutError:
            ok, detail = False, f"no answer within {timeout:g} s"
        except (NodeUnreachableError, NodeLostError) as exc:
            # The node itself did not answer (a power cut looks so until Ray declares it
            # dead): no verdict on the backend, and no restart through a gone agent.
            ok, detail, unreachable = False, str(exc), True
        except Exception as exc:
            ok, detail = False, str(exc) or type(exc).__name__
        if unreachable:
            log.warning(
                "node %s: cannot probe %s, the node does not answer: %s", self.name, role, detail
            )
        elif not ok:
            log.warning("node %s: generation probe of %s failed: %s", self.name, role, detail)
        self.post(ProbeDone(self._clock(), role, effect.generation, ok, detail, unreachable))

    async def _restart_backend(self, role: str) -> None:
        try:
            await self.backends.restart(role)
        except NodeLostError:
            # The node is gone with the backend: the fleet's NodeLost marks the role lost
            # and its requests follow it to another node; no "could not be restarted".
            log.info("node %s: not restarting %s: the node is lost", self.name, role)
        except Exception as exc:
            log.exception("node %s: restarting %s failed", self.name, role)
            with contextlib.suppress(Exception):
                await self.backends.stop(role)  # no wedged process may keep its memory
            self.backend_event(
                BackendEvent(role, "restart_failed", detail=f"restart failed: {exc}", final=True)
            )

    async def _pump_backend_events(self) -> None:
        assert self._backend_events is not None
        while True:
            for event in await self._backend_events.changes():
                self.backend_event(event)

    def record(self, effect: RecordEvent) -> None:
        """Keep ``effect`` in the event log, log it, count it, and tell the listeners."""
        duration = effect.duration_s
        event = SchedulerEvent(
            at=self._wall_clock(),
            node=self.name,
            kind=effect.kind,
            role=effect.role,
            cause=effect.cause,
            resident=effect.resident,
            resident_bytes=effect.resident_bytes,
            duration_s=None if duration is None else round(duration, 3),
        )
        self.events.append(event)
        took = f" in {duration:.2f} s" if duration is not None else ""
        # A load the shutdown cut short (a warm-up still starting at Ctrl-C) failed
        # nothing the operator must act on: one info line, not a warning with the log tail.
        cut = effect.kind == "load_failed" and self._shut_down is not None
        if cut:
            after = f" after {duration:.2f} s" if duration is not None else ""
            log.info(
                "node %s: load of %s cut short by the shutdown%s", self.name, effect.role, after
            )
        else:
            level = logging.WARNING if effect.kind in ("load_failed", "refused") else logging.INFO
            log.log(
                level,
                "node %s: %s %s%s (%s); resident: %s (%.2f GiB of %.2f GiB)",
                self.name,
                effect.kind,
                effect.role,
                took,
                effect.cause,
                ", ".join(event.resident) or "none",
                event.resident_bytes / 2**30,
                self.capacity_bytes / 2**30,
            )
        metrics = self._metrics
        if metrics is not None:
            node, role = self.name, effect.role
            if effect.kind == "loaded":
                metrics.loads.labels(node=node, role=role, cause=effect.label or "load").inc()
                metrics.load_duration.labels(node=node, role=role).observe(duration or 0.0)
            elif effect.kind == "load_failed" and not cut:
                metrics.load_failures.labels(node=node, role=role).inc()
            elif effect.kind == "stopped":
                cause = effect.label or "unload"
                metrics.evictions.labels(node=node, role=role, cause=cause).inc()
            metrics.resident_bytes.labels(node=node).set(event.resident_bytes)
            self._pool_gauges()
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("scheduler event listener failed")
