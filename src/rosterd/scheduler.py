"""The scheduler (DESIGN.md layer 6): one asyncio task per node owns its resident set.

Callers never read the resident set and then act on it. They ask the node's
task (through its inbox) for a *lease* on a role; the task answers when the
role is ready and a slot is free, applying the residency policy
(:func:`rosterd.residency.decide`) through a :class:`RoleBackends` (the
supervisor, in ``rosterd up``). The rules it keeps, as issue 5 and USERS.md ask:

- **One load per role at a time, shared.** Every request waiting for a role
  waits on the same load. The load runs in its own task, so a waiter that gives
  up (timeout, client gone) only leaves the queue; the load goes on for the others.
- **One transition per node at a time.** A transition is "stop these roles,
  then start that one". Swaps are therefore serialized, and memory counts as
  free only after ``RoleBackends.stop`` returned (the process exited), so the
  node never holds more than its capacity nor two roles that exclude each
  other, in any order of requests.
- **No eviction under a request.** A role with leases out is not evicted: the
  policy answers ``Wait`` naming it. The busy role then *drains*: it gives no
  new lease to a request that arrived after the one waiting for its room, so
  requests are served in arrival order across a swap instead of one busy role
  starving the other. Once the oldest waiter has waited ``drain_s`` the
  in-flight counts are ignored and the busy role may be evicted: its leases
  are revoked first (:attr:`Lease.revoked`), so the router ends those requests
  with an ``evicted`` error and the backend stops at once.
- **An unload takes no new requests.** Once ``unload`` is asked, the role
  grants no new lease; waiting requests load it again after it stopped.
- **No swap ping-pong.** A role loaded less than ``min_residency_s`` ago is
  passed to the policy as ``recently_loaded``: a batch role cannot evict it,
  an interactive one can.
- **Exclusions yield when idle.** The policy settles two roles that exclude
  each other by precedence and refuses the loser while the winner is
  resident. A request for the loser then waits, and once the winner is idle
  (nothing in flight or queued, past ``min_residency_s``) it is unloaded so
  the loser can load; an interactive winner never yields to a batch role
  (that refusal fails the request at once, with the policy's reason). A
  winner kept busy past ``drain_s`` yields as well, so the loser cannot starve.
- **Idle TTL.** A ready, non-sticky batch role with nothing in flight or
  queued for ``idle_ttl_s`` is unloaded.
- **Crash restarts are loads too.** When the supervisor reports that a ready
  backend exited (:meth:`NodeScheduler.backend_event`), the role goes to
  ``restarting``: it keeps its memory, leases of the dead process are void,
  and new requests wait for the restart as for a load (up to
  ``queue_timeout_s``). Once the restart is ready the role is ``ready`` with
  the new pid; if the supervisor gives up, the role is ``stopped`` (its
  process has exited) and the waiting requests fail with the reason.
- **Per-role concurrency and a bounded queue.** At most ``max_concurrency``
  leases per role; at most ``max_queue`` waiters per role, beyond which
  :class:`QueueFullError` is raised at once; a waiter gives up after
  ``queue_timeout_s`` with :class:`QueueTimeoutError`.

Every load and eviction is logged (logger ``rosterd.scheduler``) with its
cause, counted in :mod:`rosterd.metrics` and kept in a bounded event log
(:attr:`NodeScheduler.events`) that records the resident set after each step.

The scheduler itself is plain asyncio (it is rosterd's own job); httpx, the
project's HTTP client, only talks to a shared ollama server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import math
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from rosterd.adapters import Adapter, AdapterError, OllamaAdapter, WeightsSource, adapter_for
from rosterd.adapters.ollama import DEFAULT_OLLAMA_PORT
from rosterd.errors import RosterdError
from rosterd.metrics import RosterdMetrics
from rosterd.residency import (
    AlreadyResident,
    Load,
    NodeState,
    Refuse,
    Wait,
    decide,
    excludes_each_other,
)
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import (
    Backend,
    BackendEvent,
    Supervisor,
    describe_exit,
    ready_timeout_for,
)

log = logging.getLogger("rosterd.scheduler")

#: How long a stop waits for the router to end revoked requests, seconds.
_REVOKE_WAIT_S = 1.0

#: Where a client whose request failed on a backend is pointed for the details.
_SEE_LOG = "see `rosterd ps` / the backend log"

# An absolute path (not the path part of a URL): "/a/b/c" -> its last part "c".
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s'\"`,;()/]+/)*([^\s'\"`,;()/]*)")


def client_reason(text: str, *, limit: int = 300) -> str:
    """``text`` (an error message) fit for an HTTP client: its first line only, with
    absolute paths cut to their last part, at most ``limit`` characters.

    Full messages (log tails, command lines, paths) stay in rosterd's log and the
    backend's log file; clients get the short reason.
    """
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    short = _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "/", first)
    return short if len(short) <= limit else short[: limit - 1] + "…"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ready backend: ``base_url`` (``http://host:port``, no trailing slash), the model
    name it answers to (``served_model``) and its process id (``None`` if not a local process).
    """

    base_url: str
    served_model: str
    pid: int | None = None


class RoleBackends(Protocol):
    """How a node scheduler starts and stops a role's backend (the supervisor, in ``rosterd up``).

    ``start`` returns once the backend is ready and raises on failure (any
    exception; its message reaches the waiting requests). ``stop`` returns only
    after the process exited, so its memory is free.
    """

    async def start(self, role: str) -> Endpoint:
        """Start ``role``'s backend and wait until it is ready."""
        ...

    async def stop(self, role: str) -> None:
        """Stop ``role``'s backend; return after it exited.

        Called while ``start(role)`` is still running (shutdown), it must make
        that start fail promptly and leave no process.
        """
        ...


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The scheduler's knobs; durations in seconds.

    ``max_concurrency``: leases per role at once; ``max_queue``: waiters per
    role; ``queue_timeout_s``: how long a request waits for its role;
    ``drain_s``: how long a waiter lets busy roles finish before they may be
    evicted (and how long shutdown lets requests finish); ``idle_ttl_s``: idle
    time after which a non-sticky batch role is unloaded (``math.inf``: never);
    ``min_residency_s``: how long a just-loaded role is protected from batch
    evictions; ``tick_s``: how often timers (TTL, min residency, drain) are checked.
    """

    max_concurrency: int = 4
    max_queue: int = 64
    queue_timeout_s: float = 300.0
    drain_s: float = 30.0
    idle_ttl_s: float = 600.0
    min_residency_s: float = 10.0
    tick_s: float = 0.25


@dataclass(frozen=True, slots=True)
class Revocation:
    """Why the leases of a role were revoked: the scheduler stops the role's backend while
    requests are still in flight (after ``drain_s``), so the router ends them itself.

    ``code``: the OpenAI error code for the client (``evicted``, ``shutting_down``);
    ``message``: what the client is told (no paths, no pids).
    """

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Lease:
    """Permission to send requests to ``role``'s backend at ``endpoint`` until released.

    ``generation`` tells leases of an earlier load of the same role apart (a
    release from a stopped generation is ignored); ``waited_s`` is the time
    spent queued, seconds. ``revoked`` gets a :class:`Revocation` when the
    scheduler stops the backend before the lease was released: the holder must
    end its upstream request at once and release the lease.
    """

    role: str
    node: str
    endpoint: Endpoint
    generation: int
    waited_s: float
    revoked: asyncio.Future[Revocation] | None = field(default=None, compare=False)


class Phase(enum.Enum):
    """Where a role's backend is: every phase but ``stopped`` holds memory.

    ``restarting``: the backend crashed and the supervisor is starting it again.
    """

    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPING = "stopping"


HOLDS_MEMORY = frozenset({Phase.LOADING, Phase.READY, Phase.RESTARTING, Phase.STOPPING})


@dataclass(frozen=True, slots=True)
class SchedulerEvent:
    """One step of a node's resident set, as logged.

    ``kind``: ``loading``, ``loaded``, ``load_failed``, ``stopping``,
    ``stopped``, ``refused``; ``cause``: why (the policy's reason, ``idle``,
    ``unload``, ``shutdown``, …); ``resident``: roles holding memory after the
    step (sorted); ``resident_bytes``: their spec bytes; ``at``: wall-clock
    time (seconds since the epoch); ``duration_s``: for ``loaded``/``stopped``,
    how long the step took.
    """

    at: float
    node: str
    kind: str
    role: str
    cause: str
    resident: tuple[str, ...]
    resident_bytes: int
    duration_s: float | None = None

    def as_json(self) -> dict[str, object]:
        """The event as a JSON-ready dict (``/rosterd/events``)."""
        return {
            "at": self.at,
            "node": self.node,
            "kind": self.kind,
            "role": self.role,
            "cause": self.cause,
            "resident": list(self.resident),
            "resident_bytes": self.resident_bytes,
            "duration_s": self.duration_s,
        }


# --------------------------------------------------------------------------- errors


class SchedulerError(RosterdError):
    """A request could not get its role; ``retry_after_s`` (seconds) when retrying may help."""

    retry_after_s: float | None = None


class UnknownRoleError(SchedulerError):
    """The role is not placed on any node this process runs."""


class QueueFullError(SchedulerError):
    """The role's queue holds ``max_queue`` waiters already (the router answers 429)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueTimeoutError(SchedulerError):
    """The request waited ``queue_timeout_s`` for its role (the router answers 503)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RoleRefusedError(SchedulerError):
    """The residency policy refused to load the role; the message is its reason."""


class LoadFailedError(SchedulerError):
    """The role's backend failed to start or become ready; the message says why."""


class RoleUnavailableError(SchedulerError):
    """The role cannot be served at all (found at start, e.g. its weights are missing);
    no load is tried. The router answers 503 ``model_unavailable``."""


class ShuttingDownError(SchedulerError):
    """rosterd is stopping and takes no new requests."""


# --------------------------------------------------------------------------- node task


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[Lease]
    since: float
    take_slot: bool  # a request (counts in flight) or a load that only wants residency
    no_evict: bool  # warm-up: load only if nothing must be evicted


@dataclass(eq=False)
class _RoleState:
    spec: InferenceSpec
    phase: Phase = Phase.STOPPED
    endpoint: Endpoint | None = None
    generation: int = 0
    in_flight: int = 0
    waiters: deque[_Waiter] = field(default_factory=deque)
    loaded_at: float | None = None
    last_used: float = 0.0
    unload_requested: list[asyncio.Future[None]] = field(default_factory=list)
    unload_since: float | None = None
    waiting_reason: str | None = None
    # The wait reasons already logged since the role last loaded (each is logged once).
    logged_waits: set[str] = field(default_factory=set)
    # Set when the backend is stopped under leases of this generation (see Lease.revoked).
    revoke: asyncio.Future[Revocation] | None = None
    released: asyncio.Event | None = None  # set once in_flight is 0 (a stop waits for it)
    # New leases go only to waiters older than this: a request for another role
    # that needs this role's room came first, so this role drains instead of
    # serving newer requests forever (None: no one waits for its room).
    hold_since: float | None = None

    def live_waiters(self) -> list[_Waiter]:
        return [w for w in self.waiters if not w.future.done()]

    def fail_waiters(self, error: type[SchedulerError], message: str) -> None:
        """Fail every waiting request with its own ``error(message)``; the queue is empty after."""
        for w in self.live_waiters():
            w.future.set_exception(error(message))
        self.waiters.clear()


@dataclass(frozen=True, slots=True)
class _Acquire:
    role: str
    waiter: _Waiter


@dataclass(frozen=True, slots=True)
class _Release:
    role: str
    generation: int


@dataclass(frozen=True, slots=True)
class _Unload:
    role: str
    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class _BackendChange:
    event: BackendEvent


@dataclass(frozen=True, slots=True)
class _Kick:
    """Something changed outside the inbox (a transition finished): decide again."""


_Message = _Acquire | _Release | _Unload | _BackendChange | _Kick


class NodeScheduler:
    """The owner of one node's resident set (one asyncio task, started by :meth:`start`).

    ``specs``: the roles placed on the node (role -> spec); ``capacity_bytes``:
    the node's budget (``Node.capacity_bytes``); ``backends`` starts and stops
    them. ``unavailable``: role -> why it cannot be served (checked at start,
    e.g. missing weights); requests for it fail at once with
    :class:`RoleUnavailableError` and no load is tried. ``clock`` (monotonic
    seconds) is injectable for tests.
    """

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
        event_log_size: int = 2000,
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.unavailable = {r: why for r, why in (unavailable or {}).items() if r in specs}
        self.capacity_bytes = capacity_bytes
        self.specs = dict(specs)
        self.limits = limits or SchedulerLimits()
        self._backends = backends
        self._metrics = metrics
        self._clock = clock
        self._roles = {role: _RoleState(spec) for role, spec in sorted(self.specs.items())}
        self._inbox: asyncio.Queue[_Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._transition: asyncio.Task[None] | None = None
        self._shutting_down = False
        self._load_seconds: deque[float] = deque(maxlen=20)
        self._idle = asyncio.Event()  # set while no lease is out on this node (for shutdown)
        self._idle.set()
        self.events: deque[SchedulerEvent] = deque(maxlen=event_log_size)
        self.listeners: list[Callable[[SchedulerEvent], None]] = []
        if metrics is not None:
            metrics.capacity_bytes.labels(node=name).set(capacity_bytes)
            metrics.resident_bytes.labels(node=name).set(0)

    # ---- public API (any task) ------------------------------------------------

    def start(self) -> None:
        """Start the node's task on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"rosterd-node-{self.name}"
            )

    async def acquire(
        self,
        role: str,
        *,
        timeout_s: float | None = None,
        take_slot: bool = True,
        no_evict: bool = False,
    ) -> Lease:
        """Wait until ``role`` is ready and (``take_slot``) a slot is free; return a lease.

        Every lease taken with ``take_slot`` must be given back with
        :meth:`release`. ``timeout_s`` defaults to ``limits.queue_timeout_s``.
        ``no_evict`` loads the role only if nothing must be evicted (warm-up).
        Cancelling the caller only removes its place in the queue.

        Raises:
            UnknownRoleError, RoleUnavailableError, QueueFullError,
            QueueTimeoutError, RoleRefusedError, LoadFailedError, ShuttingDownError.
        """
        if role not in self._roles:
            raise UnknownRoleError(f"role {role!r} is not placed on node {self.name!r}")
        if role in self.unavailable:
            raise RoleUnavailableError(
                f"role {role!r} is unavailable: {client_reason(self.unavailable[role])}"
            )
        if self._shutting_down:
            raise ShuttingDownError("rosterd is shutting down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Lease] = loop.create_future()
        self._inbox.put_nowait(_Acquire(role, _Waiter(future, self._clock(), take_slot, no_evict)))
        timeout = self.limits.queue_timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()  # granted in the same instant
            future.cancel()
            retry = max(1.0, self._typical_load_s())
            raise QueueTimeoutError(
                f"role {role!r} was not ready within {timeout:g} s "
                f"({self._roles[role].waiting_reason or 'still loading or busy'})",
                retry_after_s=retry,
            ) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                if take_slot:
                    self.release(future.result())
            else:
                future.cancel()
            raise

    def release(self, lease: Lease) -> None:
        """Give back a lease taken with ``take_slot`` (safe to call from any task, once)."""
        self._inbox.put_nowait(_Release(lease.role, lease.generation))

    def backend_event(self, event: BackendEvent) -> None:
        """Tell the node what the supervisor saw happen to a role's backend (any task).

        ``exited``/``restarting`` of a ready role: it goes to ``restarting``;
        ``ready``: the restarted process (``event.pid``) serves it again;
        a final ``restart_failed``: it is no longer resident. Events for other
        names (a shared server) or phases (a load or stop under way) are ignored.
        """
        if event.name in self._roles:
            self._inbox.put_nowait(_BackendChange(event))

    async def unload(self, role: str) -> None:
        """Stop ``role``'s backend once its in-flight requests finished (or ``drain_s`` passed).

        From the call on, the role grants no new lease: newer requests wait in its
        queue and load it again once it stopped. Returns after the process
        exited (at once if it was not resident).
        Raises ``UnknownRoleError``.
        """
        if role not in self._roles:
            raise UnknownRoleError(f"role {role!r} is not placed on node {self.name!r}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Unload(role, future))
        await asyncio.shield(future)

    async def shutdown(self) -> None:
        """Stop taking requests, let in-flight ones finish (up to ``drain_s``), stop every backend.

        Waiting requests fail with ``ShuttingDownError``. Returns after every
        backend this node started has exited.
        """
        self._shutting_down = True
        self._inbox.put_nowait(_Kick())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.limits.drain_s):
                await self._idle.wait()
        if self._transition is not None and not self._transition.done():
            # A load under way is aborted rather than awaited (it may take minutes):
            # RoleBackends.stop stops a backend that is still starting, too.
            for role, st in self._roles.items():
                if st.phase is Phase.LOADING:
                    with contextlib.suppress(Exception):
                        await self._backends.stop(role)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._transition)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._transition is not None and not self._transition.done():
            with contextlib.suppress(Exception):
                await self._transition
        for role, st in self._roles.items():
            if st.phase in (Phase.READY, Phase.LOADING, Phase.RESTARTING):
                await self._stop_role(role, "shutdown", "shutdown")
            for future in st.unload_requested:  # stopped now, as asked
                if not future.done():
                    future.set_result(None)
            st.unload_requested.clear()

    def snapshot(self) -> dict[str, object]:
        """The node's state as JSON-ready data (``/status``, ``rosterd ps``).

        ``{"capacity_bytes", "resident_bytes", "resident": [...], "roles": {role:
        {"phase", "latency_class", "sticky", "resident_bytes", "in_flight",
        "queued", "idle_s", "loaded_for_s", "waiting_reason", "base_url", "pid",
        "unavailable_reason"}}}`` (durations in seconds, ``None`` when not
        resident; ``phase`` is ``unavailable`` for a role that cannot be served,
        ``unavailable_reason`` then says why).
        """
        now = self._clock()
        roles: dict[str, object] = {}
        for role, st in self._roles.items():
            resident = st.phase in HOLDS_MEMORY
            roles[role] = {
                "phase": "unavailable" if role in self.unavailable else st.phase.value,
                "latency_class": st.spec.latency_class.value,
                "sticky": st.spec.sticky,
                "resident_bytes": st.spec.memory.resident_bytes,
                "in_flight": st.in_flight,
                "queued": len(st.live_waiters()),
                "idle_s": round(now - st.last_used, 3)
                if st.phase is Phase.READY and st.in_flight == 0
                else None,
                "loaded_for_s": round(now - st.loaded_at, 3)
                if resident and st.loaded_at is not None
                else None,
                "waiting_reason": st.waiting_reason if st.live_waiters() else None,
                "base_url": st.endpoint.base_url if st.endpoint else None,
                "pid": st.endpoint.pid if st.endpoint else None,
                "unavailable_reason": self.unavailable.get(role),
            }
        return {
            "capacity_bytes": self.capacity_bytes,
            "resident_bytes": self._resident_bytes(),
            "resident": list(self._resident()),
            "transition": self._transition is not None and not self._transition.done(),
            "roles": roles,
        }

    # ---- the node task ---------------------------------------------------------

    async def _run(self) -> None:
        while True:
            message: _Message | None = None
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel
            # that lands together with its timeout, and shutdown cancels this task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.limits.tick_s):
                    message = await self._inbox.get()
            while message is not None:
                self._handle(message)
                message = self._inbox.get_nowait() if not self._inbox.empty() else None
            try:
                self._schedule()
            except Exception:  # a bug here must not kill the node's task silently
                log.exception("node %s: scheduling step failed", self.name)

    def _handle(self, message: _Message) -> None:
        if isinstance(message, _Acquire):
            self._on_acquire(message.role, message.waiter)
        elif isinstance(message, _Release):
            st = self._roles[message.role]
            if message.generation == st.generation and st.in_flight > 0:
                st.in_flight -= 1
                st.last_used = self._clock()
                self._update_gauges(message.role)
                if st.in_flight == 0 and st.released is not None:
                    st.released.set()
        elif isinstance(message, _Unload):
            st = self._roles[message.role]
            st.unload_requested.append(message.future)
            if st.unload_since is None:
                st.unload_since = self._clock()
        elif isinstance(message, _BackendChange):
            self._on_backend_event(message.event)

    def _on_backend_event(self, event: BackendEvent) -> None:
        role = event.name
        st = self._roles[role]
        if event.kind in ("exited", "restarting") and st.phase is Phase.READY:
            st.phase = Phase.RESTARTING
            st.generation += 1  # leases of the dead process are void
            st.in_flight = 0
            if st.endpoint is not None:  # same address and name; no live pid until it is back
                st.endpoint = dataclasses.replace(st.endpoint, pid=None)
            st.waiting_reason = "its backend crashed and is being restarted"
            why = describe_exit(event.exit_code) if event.exit_code is not None else "exited"
            self._emit("crashed", role, f"backend pid {event.pid} {why}; restarting")
            self._update_gauges(role)
        elif event.kind == "ready" and st.phase is Phase.RESTARTING and st.endpoint is not None:
            st.phase = Phase.READY
            st.endpoint = dataclasses.replace(st.endpoint, pid=event.pid)
            st.last_used = self._clock()
            st.waiting_reason = None
            self._emit("restarted", role, f"backend restarted as pid {event.pid}")
            self._grant(role, st)
        elif event.kind == "restart_failed" and st.phase is Phase.RESTARTING:
            if not event.final:
                st.waiting_reason = "its backend crashed; restarting it failed, trying again"
                return
            st.phase = Phase.STOPPED  # the supervisor gave up: no process is left
            st.endpoint = None
            st.loaded_at = None
            message = f"backend for role {role!r} crashed and could not be restarted"
            log.warning("node %s: %s: %s", self.name, message, event.detail)
            st.fail_waiters(LoadFailedError, f"{message}; {_SEE_LOG}")
            self._emit("restart_failed", role, "the supervisor gave up restarting it")
            self._update_gauges(role)

    def _on_acquire(self, role: str, waiter: _Waiter) -> None:
        st = self._roles[role]
        if self._shutting_down:
            waiter.future.set_exception(ShuttingDownError("rosterd is shutting down"))
            return
        live = st.live_waiters()
        if len(live) >= self.limits.max_queue:
            waiter.future.set_exception(
                QueueFullError(
                    f"role {role!r} has {len(live)} requests queued "
                    f"(limit {self.limits.max_queue}); retry later",
                    retry_after_s=max(1.0, self._typical_load_s()),
                )
            )
            return
        st.waiters.append(waiter)
        self._update_gauges(role)

    def _schedule(self) -> None:
        now = self._clock()
        for role, st in self._roles.items():
            if not st.waiters:
                st.logged_waits.clear()
                continue
            queued = len(st.waiters)
            if any(w.future.done() for w in st.waiters):  # gave up: leave the queue
                st.waiters = deque(st.live_waiters())
            if self._shutting_down:
                st.fail_waiters(ShuttingDownError, "rosterd is shutting down")
            self._grant(role, st)
            if len(st.waiters) != queued:
                self._update_gauges(role)
        if self._shutting_down or (self._transition is not None and not self._transition.done()):
            return
        if self._schedule_unloads(now):
            return
        if self._schedule_loads(now):
            return
        self._schedule_idle(now)

    def _grant(self, role: str, st: _RoleState) -> None:
        """Hand leases to waiters, oldest first, while the role is ready and has free slots."""
        if st.phase is not Phase.READY or st.endpoint is None:
            return
        if st.unload_requested:
            return  # an unload was asked: new requests wait and load the role again after it
        if st.revoke is None or st.revoke.done():
            st.revoke = asyncio.get_running_loop().create_future()
        now = self._clock()
        try:
            while st.waiters:
                waiter = st.waiters[0]
                if waiter.future.done():
                    # It gave up (or shutdown ended it) in the same instant the role
                    # became ready: nothing to hand over, and no slot to take.
                    st.waiters.popleft()
                    continue
                if waiter.take_slot and st.in_flight >= self.limits.max_concurrency:
                    return
                if waiter.take_slot and st.hold_since is not None and waiter.since >= st.hold_since:
                    return  # an older request waits for this role's room: let it drain
                st.waiters.popleft()
                waited = now - waiter.since
                if waiter.take_slot:
                    st.in_flight += 1
                    st.last_used = now
                waiter.future.set_result(
                    Lease(role, self.name, st.endpoint, st.generation, waited, st.revoke)
                )
                if self._metrics is not None and waiter.take_slot:
                    self._metrics.queue_wait.labels(role=role).observe(waited)
        finally:
            # Every waiter handed a lease leaves the queue, slot or not (a warm-up
            # load takes none), so the queued and in-flight gauges change here.
            self._update_gauges(role)

    def _schedule_unloads(self, now: float) -> bool:
        for role, st in self._roles.items():
            if not st.unload_requested:
                continue
            if st.phase is Phase.STOPPED:
                for f in st.unload_requested:
                    if not f.done():
                        f.set_result(None)
                st.unload_requested.clear()
                st.unload_since = None
                continue
            since = st.unload_since if st.unload_since is not None else now
            if st.phase is Phase.READY and (
                st.in_flight == 0 or now - since >= self.limits.drain_s
            ):
                self._begin_transition(evict=(role,), load=None, cause="unload", label="unload")
                return True
        return False

    def _schedule_loads(self, now: float) -> bool:
        holds: dict[str, float] = {}
        try:
            return self._decide_loads(now, holds)
        finally:
            for role, st in self._roles.items():
                st.hold_since = holds.get(role)

    def _hold(self, blocking: Iterable[str], since: float, holds: dict[str, float]) -> None:
        """Make busy ``blocking`` roles drain for a request that arrived at ``since``.

        Roles still inside their minimum residency are left alone: they cannot
        be evicted yet anyway, so serving their requests meanwhile costs nothing.
        """
        for b in blocking:
            st = self._roles[b]
            recent = self._recently_loaded(st, self._clock())
            if st.phase is Phase.READY and st.in_flight > 0 and not recent:
                holds[b] = min(holds.get(b, since), since)

    def _decide_loads(self, now: float, holds: dict[str, float]) -> bool:
        pending = [
            (role, st)
            for role, st in self._roles.items()
            if st.phase is Phase.STOPPED and st.waiters
        ]
        pending.sort(key=lambda p: (not p[1].spec.interactive, p[1].waiters[0].since, p[0]))
        for role, st in pending:
            oldest = st.waiters[0].since
            drained = now - oldest >= self.limits.drain_s
            decision = decide(self._node_state(now, ignore_in_flight=drained), role)
            if isinstance(decision, AlreadyResident):
                continue
            if isinstance(decision, Refuse):
                yielding = self._exclusion_blockers(role)
                if yielding is not None:
                    # Exclusion precedence keeps the resident winner, but only while it
                    # is in use: an idle batch winner yields to a waiting request rather
                    # than failing it (see _exclusion_blockers).
                    idle = [
                        b
                        for b in yielding
                        if self._can_yield(b, now)
                        or (drained and self._roles[b].phase is Phase.READY)
                    ]
                    if len(idle) == len(yielding):
                        st.waiting_reason = decision.reason
                        busy = [b for b in yielding if self._roles[b].in_flight]
                        state = f"busy past --drain {self.limits.drain_s:g} s" if busy else "idle"
                        self._begin_transition(
                            evict=yielding,
                            load=None,
                            cause=f"{state}, yields to waiting {role} (they exclude each other)",
                            label="exclusion",
                            for_role=role,
                        )
                        return True
                    st.waiting_reason = f"{decision.reason}; waiting until it is idle"
                    if not all(w.no_evict for w in st.waiters):
                        self._hold(yielding, oldest, holds)
                    continue
                st.waiting_reason = decision.reason
                st.fail_waiters(RoleRefusedError, decision.reason)
                self._emit("refused", role, decision.reason)
                continue
            if isinstance(decision, Wait):
                if decision.reason not in st.logged_waits:
                    st.logged_waits.add(decision.reason)
                    log.info("node %s: %s waits: %s", self.name, role, decision.reason)
                st.waiting_reason = decision.reason
                if not all(w.no_evict for w in st.waiters):
                    self._hold(decision.blocking, oldest, holds)
                continue
            assert isinstance(decision, Load)
            if decision.evict and all(w.no_evict for w in st.waiters):
                reason = f"not warmed up: it would evict {', '.join(decision.evict)}"
                st.fail_waiters(RoleRefusedError, reason)
                continue
            st.waiting_reason = decision.reason
            self._begin_transition(
                evict=decision.evict, load=role, cause=decision.reason, label="make_room"
            )
            return True
        return False

    def _schedule_idle(self, now: float) -> None:
        if math.isinf(self.limits.idle_ttl_s):
            return
        for role, st in self._roles.items():
            if (
                st.phase is Phase.READY
                and not st.spec.sticky
                and not st.spec.interactive
                and st.in_flight == 0
                and not st.waiters
                and now - st.last_used >= self.limits.idle_ttl_s
            ):
                idle = now - st.last_used
                self._begin_transition(
                    evict=(role,), load=None, cause=f"idle for {idle:.0f} s", label="idle_ttl"
                )
                return

    def _exclusion_blockers(self, role: str) -> tuple[str, ...] | None:
        """The resident roles that exclude ``role``, if they are what keeps it out.

        The residency policy settles an exclusion by precedence (interactive,
        then sticky, then role id) and refuses the losing role while the winner
        is resident. For a *request* that refusal is temporary: once the winner
        is idle (nothing in flight or queued, past ``min_residency_s``) the
        scheduler unloads it and the waiting role loads. An interactive winner
        never yields to a batch role (interactive roles stay resident), so then
        the answer is ``None`` and the refusal stands; ``None`` too when no
        resident role excludes ``role`` (the refusal is about memory).
        """
        spec = self._roles[role].spec
        blockers = tuple(
            other
            for other in self._resident()
            if other != role and excludes_each_other(spec, self._roles[other].spec)
        )
        if not blockers:
            return None
        if not spec.interactive and any(self._roles[b].spec.interactive for b in blockers):
            return None
        return blockers

    def _can_yield(self, role: str, now: float) -> bool:
        st = self._roles[role]
        return (
            st.phase is Phase.READY
            and st.in_flight == 0
            and not st.waiters
            and not self._recently_loaded(st, now)
        )

    def _recently_loaded(self, st: _RoleState, now: float) -> bool:
        """Whether the role was loaded less than ``min_residency_s`` before ``now``."""
        return st.loaded_at is not None and now - st.loaded_at < self.limits.min_residency_s

    def _node_state(self, now: float, *, ignore_in_flight: bool) -> NodeState:
        resident = self._resident()
        busy: dict[str, int] = {}
        for role in resident:
            st = self._roles[role]
            if st.phase is not Phase.READY:
                busy[role] = 1  # loading or stopping: never a candidate to evict
            elif st.in_flight and not ignore_in_flight:
                busy[role] = st.in_flight
        recency = tuple(sorted(resident, key=lambda r: (self._roles[r].last_used, r)))
        recent = frozenset(r for r in resident if self._recently_loaded(self._roles[r], now))
        return NodeState(
            capacity_bytes=self.capacity_bytes,
            specs=self.specs,
            resident=frozenset(resident),
            in_flight=busy,
            recency=recency,
            recently_loaded=recent,
        )

    # ---- transitions (one per node at a time) -------------------------------------

    def _begin_transition(
        self,
        *,
        evict: Iterable[str],
        load: str | None,
        cause: str,
        label: str,
        for_role: str | None = None,
    ) -> None:
        """Start "stop ``evict``, then load ``load``" as the node's one transition.

        ``cause``: the words for the log and event log; ``label``: the short cause
        of the evictions (see :func:`_stop_role`); ``for_role``: the role the
        evictions make way for (defaults to ``load``).
        """
        evict = tuple(evict)
        self._transition = asyncio.get_running_loop().create_task(
            self._run_transition(evict, load, cause, label, for_role or load),
            name=f"rosterd-transition-{self.name}",
        )

    async def _run_transition(
        self, evict: tuple[str, ...], load: str | None, cause: str, label: str, for_role: str | None
    ) -> None:
        try:
            for role in evict:
                stop_cause = cause if load is None else f"evicted for {load}: {cause}"
                why = label
                if load is not None and excludes_each_other(self.specs[role], self.specs[load]):
                    why = "exclusion"
                await self._stop_role(role, stop_cause, why, for_role)
            if load is not None:
                await self._load_role(load, cause)
        except Exception:
            log.exception("node %s: transition failed", self.name)
        finally:
            self._inbox.put_nowait(_Kick())

    def _revocation(self, role: str, label: str, for_role: str | None) -> Revocation:
        """What a client whose request to ``role`` is cut by this stop is told."""
        after = f"after --drain {self.limits.drain_s:g} s"
        if label == "shutdown":
            return Revocation(
                "shutting_down", f"rosterd is shutting down; role {role} was stopped {after}"
            )
        if label == "unload":
            why = "was unloaded (rosterd unload)"
        elif label == "exclusion" and for_role is not None:
            why = f"was unloaded for {for_role} (they exclude each other)"
        elif for_role is not None:
            why = f"was unloaded to make room for {for_role}"
        else:
            why = "was unloaded"
        return Revocation("evicted", f"role {role} {why} {after}")

    async def _stop_role(
        self, role: str, cause: str, label: str, for_role: str | None = None
    ) -> None:
        """Stop ``role``'s backend; returns once its process exited.

        ``label`` is the short cause counted in ``rosterd_evictions_total``:
        ``make_room``, ``exclusion``, ``idle_ttl``, ``unload`` or ``shutdown``,
        and ``drain`` for a ``make_room``/``exclusion`` eviction that cut requests
        still in flight after ``drain_s``. Requests still in flight are revoked
        first (:attr:`Lease.revoked`): the router ends them with an error event
        saying why, so the backend is not stopped under an open stream.
        """
        st = self._roles[role]
        st.phase = Phase.STOPPING
        cut = st.in_flight
        if cut:
            cause += f"; {cut} request(s) in flight cut after --drain {self.limits.drain_s:g} s"
            if st.revoke is not None and not st.revoke.done():
                st.revoke.set_result(self._revocation(role, label, for_role))
            if label in ("make_room", "exclusion"):
                label = "drain"
            # The router ends the revoked requests at once; their releases come in
            # through the inbox (this generation still counts them).
            st.released = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REVOKE_WAIT_S):
                    await st.released.wait()
            st.released = None
        st.revoke = None
        st.generation += 1  # leases of the stopped process are void from here on
        self._emit("stopping", role, cause)
        started = self._clock()
        try:
            await self._backends.stop(role)
        except Exception as exc:  # stop must not wedge the node; the supervisor reaps
            log.warning("node %s: stopping %s failed: %s", self.name, role, exc)
        st.phase = Phase.STOPPED
        st.endpoint = None
        st.in_flight = 0
        st.loaded_at = None
        if self._metrics is not None:
            self._metrics.evictions.labels(node=self.name, role=role, cause=label).inc()
        self._emit("stopped", role, cause, duration_s=self._clock() - started)
        self._update_gauges(role)

    async def _load_role(self, role: str, cause: str) -> None:
        st = self._roles[role]
        st.phase = Phase.LOADING
        self._emit("loading", role, cause)
        started = self._clock()
        try:
            endpoint = await self._backends.start(role)
        except Exception as exc:
            st.phase = Phase.STOPPED
            # The full error (log tail, paths) goes to the log below; clients get the gist.
            short = getattr(exc, "client_message", None) or client_reason(str(exc))
            message = f"backend for role {role!r} failed to load: {short}; "
            message += _SEE_LOG
            st.fail_waiters(LoadFailedError, message)
            if self._metrics is not None:
                self._metrics.load_failures.labels(node=self.name, role=role).inc()
            self._emit("load_failed", role, str(exc), duration_s=self._clock() - started)
            # a half-started process must not keep holding memory
            with contextlib.suppress(Exception):
                await self._backends.stop(role)
            return
        took = self._clock() - started
        self._load_seconds.append(took)
        now = self._clock()
        st.phase = Phase.READY
        st.endpoint = endpoint
        st.generation += 1
        st.loaded_at = now
        st.last_used = now
        st.waiting_reason = None
        st.logged_waits.clear()
        if self._metrics is not None:
            waiting = st.live_waiters()
            if any(w.take_slot for w in waiting):
                label = "request"
            elif any(w.no_evict for w in waiting):
                label = "warm-up"
            else:
                label = "load"
            self._metrics.loads.labels(node=self.name, role=role, cause=label).inc()
            self._metrics.load_duration.labels(node=self.name, role=role).observe(took)
        self._emit("loaded", role, cause, duration_s=took)
        self._grant(role, st)

    # ---- bookkeeping ----------------------------------------------------------------

    def _resident(self) -> tuple[str, ...]:
        return tuple(r for r, st in self._roles.items() if st.phase in HOLDS_MEMORY)

    def _resident_bytes(self) -> int:
        return sum(self._roles[r].spec.memory.resident_bytes for r in self._resident())

    def _typical_load_s(self) -> float:
        if not self._load_seconds:
            return 5.0
        return float(math.ceil(max(self._load_seconds)))

    def _emit(self, kind: str, role: str, cause: str, *, duration_s: float | None = None) -> None:
        event = SchedulerEvent(
            at=time.time(),
            node=self.name,
            kind=kind,
            role=role,
            cause=cause,
            resident=tuple(sorted(self._resident())),
            resident_bytes=self._resident_bytes(),
            duration_s=None if duration_s is None else round(duration_s, 3),
        )
        self.events.append(event)
        took = f" in {duration_s:.2f} s" if duration_s is not None else ""
        level = logging.WARNING if kind in ("load_failed", "refused") else logging.INFO
        log.log(
            level,
            "node %s: %s %s%s (%s); resident: %s (%.2f GiB of %.2f GiB)",
            self.name,
            kind,
            role,
            took,
            cause,
            ", ".join(event.resident) or "none",
            event.resident_bytes / 2**30,
            self.capacity_bytes / 2**30,
        )
        if self._metrics is not None:
            self._metrics.resident_bytes.labels(node=self.name).set(event.resident_bytes)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("scheduler event listener failed")

    def _update_gauges(self, role: str) -> None:
        if any(st.in_flight for st in self._roles.values()):
            self._idle.clear()
        else:
            self._idle.set()
        if self._metrics is None:
            return
        st = self._roles[role]
        self._metrics.in_flight.labels(role=role).set(st.in_flight)
        self._metrics.queued.labels(role=role).set(len(st.live_waiters()))


# --------------------------------------------------------------------------- backends


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class SupervisorBackends:
    """:class:`RoleBackends` over the supervisor and the flavor adapters (what ``rosterd up`` uses).

    ``specs``: role -> spec for the roles of one node run by ``supervisor``;
    ``host``: where backends listen (the node's address);
    ``resolve_weights(spec)`` gives the role's weights (raises a
    ``RosterdError`` naming what it looked for); ``auto_ports``: ignore the
    roster's ports and let the OS pick free ones (roles without a port always
    get one); ``ready_timeout_s``: readiness deadline, seconds (``None``: the
    supervisor's, which grows with the weights' size); ``adapters``: flavor ->
    adapter (default ``adapter_for``).

    Roles of a flavor with one shared server per node (ollama) are not
    processes: the first start runs the node's server under the supervisor as
    ``<flavor>.<node>`` (``node`` names it), ``start`` then loads the role's
    model into it (``keep_alive`` -1) and ``stop`` unloads it and returns once
    the server no longer lists it (its memory is free then). The server itself
    stops with the supervisor.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        specs: Mapping[str, InferenceSpec],
        *,
        host: str,
        resolve_weights: Callable[[InferenceSpec], WeightsSource],
        auto_ports: bool = False,
        ready_timeout_s: float | None = None,
        adapters: Callable[[InferFlavor], Adapter] = adapter_for,
        node: str = "node",
    ) -> None:
        self.supervisor = supervisor
        self.specs = dict(specs)
        self.host = host
        self.resolve_weights = resolve_weights
        self.auto_ports = auto_ports
        self.ready_timeout_s = ready_timeout_s
        self.adapters = adapters
        self.node = node
        self._shared_lock = asyncio.Lock()

    async def start(self, role: str) -> Endpoint:
        """Resolve the weights, build the adapter's launch, start it and wait until ready.

        Raises:
            AdapterError: the flavor cannot serve this role (``OllamaError``
                when ollama refuses the model).
            RosterdError: weights not found; ``SupervisorError`` subclasses
                (``PortInUseError``, ``BackendStartError`` with the output tail).
        """
        spec = self.specs[role]
        adapter = self.adapters(spec.flavor)
        if adapter.shared_server:
            return await self._load_shared(spec, adapter)
        source = self.resolve_weights(spec)
        port = spec.serve.port
        if self.auto_ports or port is None:
            port = free_port(self.host)
        launch = adapter.launch(spec, source, host=self.host, port=port)
        backend = await self.supervisor.start(role, launch, ready_timeout_s=self.ready_timeout_s)
        return Endpoint(backend.base_url, launch.served_model, backend.pid)

    async def stop(self, role: str) -> None:
        """Stop the role's backend; returns after the process exited (or, for a
        shared server, after it no longer holds the role's model)."""
        spec = self.specs[role]
        adapter = self.adapters(spec.flavor)
        if adapter.shared_server:
            await self._unload_shared(spec, adapter)
            return
        await self.supervisor.stop(role)

    # ---- shared servers (ollama) ----------------------------------------------

    def _shared_name(self, flavor: InferFlavor) -> str:
        return f"{flavor.id}.{self.node}"

    async def _shared_server(self, spec: InferenceSpec, adapter: Adapter) -> Backend:
        if not isinstance(adapter, OllamaAdapter):
            raise AdapterError(f"role {spec.role}: no shared-server support for {spec.flavor.id}")
        name = self._shared_name(spec.flavor)
        async with self._shared_lock:  # one server per node, however many roles ask at once
            running = self.supervisor.backend(name)
            if running is not None:
                return running
            port = spec.serve.port or DEFAULT_OLLAMA_PORT
            if self.auto_ports:
                port = free_port(self.host)
            launch = adapter.server_launch(host=self.host, port=port)
            return await self.supervisor.start(name, launch, ready_timeout_s=self.ready_timeout_s)

    async def _load_shared(self, spec: InferenceSpec, adapter: Adapter) -> Endpoint:
        server = await self._shared_server(spec, adapter)
        assert isinstance(adapter, OllamaAdapter)
        model = spec.model or spec.role
        timeout = self.ready_timeout_s or ready_timeout_for(spec.memory.weights_bytes)
        async with httpx.AsyncClient(base_url=server.base_url, trust_env=False) as client:
            await adapter.load(client, model, timeout_s=timeout)
        return Endpoint(server.base_url, model, None)

    async def _unload_shared(self, spec: InferenceSpec, adapter: Adapter) -> None:
        server = self.supervisor.backend(self._shared_name(spec.flavor))
        if server is None or not isinstance(adapter, OllamaAdapter):
            return  # no server: nothing is loaded
        model = spec.model or spec.role
        async with httpx.AsyncClient(base_url=server.base_url, trust_env=False) as client:
            await adapter.unload(client, model, timeout_s=30.0)
            # ollama frees memory asynchronously: free means "no longer listed".
            async with asyncio.timeout(60.0):
                # polling another process's state: there is no event to wait on
                while model in await adapter.resident(client, timeout_s=5.0):  # noqa: ASYNC110
                    await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- fleet level


class Scheduler:
    """The node schedulers of one ``rosterd up`` process, addressed by role.

    ``nodes``: node name -> :class:`NodeScheduler`; each role is placed on
    exactly one of them (the plan's placements restricted to the nodes this
    process runs).
    """

    def __init__(self, nodes: Mapping[str, NodeScheduler]) -> None:
        self.nodes = dict(nodes)
        self._node_of: dict[str, NodeScheduler] = {}
        for node in self.nodes.values():
            for role in node.specs:
                self._node_of[role] = node

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role this process can serve, sorted."""
        return tuple(sorted(self._node_of))

    def node_of(self, role: str) -> NodeScheduler:
        """The node scheduler owning ``role``; raises ``UnknownRoleError``."""
        try:
            return self._node_of[role]
        except KeyError:
            raise UnknownRoleError(f"role {role!r} is not served here") from None

    def start(self) -> None:
        """Start every node's task."""
        for node in self.nodes.values():
            node.start()

    async def acquire(self, role: str, *, timeout_s: float | None = None) -> Lease:
        """A lease on ``role`` (as ``NodeScheduler.acquire``); give it back with :meth:`release`.

        Raises the ``SchedulerError`` subclasses listed there.
        """
        return await self.node_of(role).acquire(role, timeout_s=timeout_s)

    def release(self, lease: Lease) -> None:
        """Give back a lease from :meth:`acquire`."""
        self.nodes[lease.node].release(lease)

    def backend_event(self, event: BackendEvent) -> None:
        """Pass a supervisor event to the node owning ``event.name`` (other names are ignored).

        Wire it to ``Supervisor(on_event=...)`` so crashes and restarts reach
        the scheduler; see :meth:`NodeScheduler.backend_event`.
        """
        node = self._node_of.get(event.name)
        if node is not None:
            node.backend_event(event)

    async def load(
        self, role: str, *, no_evict: bool = False, timeout_s: float | None = None
    ) -> Lease:
        """Make ``role`` resident without taking a slot (``rosterd load``, warm-up).

        ``no_evict``: give up (``RoleRefusedError``) rather than evict anything.
        The returned lease needs no release.
        """
        return await self.node_of(role).acquire(
            role, timeout_s=timeout_s, take_slot=False, no_evict=no_evict
        )

    async def unload(self, role: str) -> None:
        """Stop ``role``'s backend (``rosterd unload``); see :meth:`NodeScheduler.unload`."""
        await self.node_of(role).unload(role)

    async def shutdown(self) -> None:
        """Drain and stop every node (concurrently); returns when every backend exited."""
        await asyncio.gather(*(node.shutdown() for node in self.nodes.values()))

    def snapshot(self) -> dict[str, object]:
        """``{"nodes": {name: NodeScheduler.snapshot()}}``."""
        return {"nodes": {name: node.snapshot() for name, node in self.nodes.items()}}

    def events(self) -> list[SchedulerEvent]:
        """Every node's event log, oldest first."""
        merged = [e for node in self.nodes.values() for e in node.events]
        merged.sort(key=lambda e: e.at)
        return merged
