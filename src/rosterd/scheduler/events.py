"""What goes into the node state machine and what comes out (DESIGN.md layer 6, pure).

Events in: every one carries ``now`` (monotonic seconds, as the node's clock
reads it when the event happened); the machine reads no clock of its own.
Effects out: what the node loop must do, in order. Waiters (requests, loads,
unloads) are named by plain ``ticket`` ids the loop hands out, never by
futures, so the machine holds no asyncio object and a test can drive it with
synchronous calls. All are frozen dataclasses of plain values (picklable).
See ``docs/scheduler.md`` for the state table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rosterd.backends.values import Endpoint
from rosterd.errors import SchedulerError
from rosterd.scheduler.values import DevicePool, NodeChange, NodeConcurrency, Revocation
from rosterd.spec import InferenceSpec

# --------------------------------------------------------------------------- events in


@dataclass(frozen=True, slots=True)
class Acquire:
    """A request (``take_slot``) or a load (``rosterd load``, warm-up) wants ``role``.

    ``no_evict``: give up rather than evict anything (warm-up); ``timeout_s``:
    how long it may wait, seconds; ``newer_than``: a generation whose backend
    failed this request before answering (it died, or refused the connection):
    the lease must be of a later generation (the restarted backend), unless a
    generation probe finds the backend alive after all. Answered by
    ``GrantLease`` or ``FailWaiter``.
    """

    now: float
    ticket: int
    role: str
    take_slot: bool = True
    no_evict: bool = False
    timeout_s: float = 300.0
    newer_than: int | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """The waiter ``ticket`` gave up (client gone); it leaves the queue, nothing is answered."""

    now: float
    ticket: int
    role: str


@dataclass(frozen=True, slots=True)
class Release:
    """A lease of ``role`` taken with a slot was given back (ignored if ``generation`` is old)."""

    now: float
    role: str
    generation: int


@dataclass(frozen=True, slots=True)
class Unload:
    """Stop ``role`` once its requests finished (``rosterd unload``); ``FinishUnload`` after."""

    now: float
    ticket: int
    role: str


@dataclass(frozen=True, slots=True)
class BackendChanged:
    """The backend of ``role`` changed by itself (the supervisor's ``BackendEvent``).

    ``kind``: ``exited``, ``restarting``, ``ready``, ``restart_failed`` (others
    are ignored); ``exit_reason``: how it exited, in words; ``final``: the
    supervisor gave up and no process is left; ``pid_is_local``: ``pid`` is a
    process of this machine (a node agent's backends run on another one, and a
    restarted endpoint then carries no pid).
    """

    now: float
    role: str
    kind: str
    pid: int | None = None
    exit_reason: str | None = None
    detail: str = ""
    final: bool = False
    pid_is_local: bool = True


@dataclass(frozen=True, slots=True)
class NodeLost:
    """The node itself is lost (its Ray node or its node agent died): ``reason`` says why.

    Every role goes ``lost``; no start or stop is asked of the node again.
    Waiters are not failed: they wait, up to their ``timeout_s``, for the
    run-time re-plan to serve their role on another node.
    """

    now: float
    reason: str


@dataclass(frozen=True, slots=True)
class LoadDone:
    """The ``StartBackend`` of ``role`` returned: its ``endpoint``, or the ``error`` text
    (full, for the log) and ``client_message`` (short, for clients; ``None``: cut from
    ``error``)."""

    now: float
    role: str
    endpoint: Endpoint | None = None
    error: str | None = None
    client_message: str | None = None


@dataclass(frozen=True, slots=True)
class StopDone:
    """The ``StopBackend`` of ``role`` returned (the process exited); ``error`` if it raised."""

    now: float
    role: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Suspect:
    """A request to ``role``'s backend (lease ``generation``) got no byte within its
    deadline, or could not reach it: run the generation probe. ``reason`` in words.

    ``wedged``: the request's progress check found the backend wedged already (its
    ``/slots`` did not answer, or showed no progress): it is unhealthy at once, no probe.
    """

    now: float
    role: str
    generation: int
    reason: str
    wedged: bool = False


@dataclass(frozen=True, slots=True)
class ProbeDone:
    """The ``ProbeBackend`` of ``role``'s ``generation`` returned: ``ok``, or why not
    (``detail``, e.g. "no answer within 5 s"). ``unreachable``: the probe never reached
    the backend because its node did not answer (a remote node's agent, silent or found
    dead): no verdict on the backend, the node's is awaited."""

    now: float
    role: str
    generation: int
    ok: bool
    detail: str = ""
    unreachable: bool = False


@dataclass(frozen=True, slots=True)
class KvSaveDone:
    """The ``SaveKv`` of ``role``'s ``generation`` returned (saved, or failed and logged by
    the backends): its leases may be granted again."""

    now: float
    role: str
    generation: int


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: timers (queue timeouts, drain, revocation wait, idle TTL) are checked."""

    now: float


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop taking requests, drain up to ``drain_s``, stop everything; ``FinishShutdown`` after.
    ``at_once``: no drain (a second Ctrl-C): requests in flight are cut now."""

    now: float
    at_once: bool = False


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """What the node should serve from now on (a reload, a lost node, a node back): the
    desired state, whole. The machine compares it with its own state and acts on the
    difference, so the same ``Reconfigure`` taken twice changes nothing the second time.

    ``specs``: role -> spec placed here; a role the machine serves that is not in it
    retires (new requests are refused with ``UnknownRoleError``, the requests it has are
    served, then it stops, cut after ``drain_s``, and is forgotten: ``ForgetRole``); a
    role new here is added, stopped until a request wants it (a role still retiring is
    taken back). A role whose spec changed what it launches, or named in ``restart``
    (its weights or launch options changed outside the spec), restarts: once its
    requests finished (cut after ``drain_s``) it stops, takes the new spec and, if it
    was resident, loads again without evicting anything; meanwhile new requests wait.
    A change of scheduling facts only (memory, latency class, sticky, excludes)
    applies at once. ``capacity_bytes``: the budget; resident roles over it are evicted
    to fit (idle ones first, busy ones drained, then cut after ``drain_s``).
    ``concurrency``: the node-wide limit on generations at once (``None``: the one in
    force stays); waiters a larger limit lets in are granted, leases over a smaller one
    run to their end. ``unavailable``: role -> why it cannot be served (its requests
    fail at once with ``RoleUnavailableError``). ``memory``: role -> its figures as
    ``/status`` shows them (replacing those given before for the same roles).
    ``moved``: role -> the node a retired role moved to; its waiters this node cannot
    serve fail with ``RoleMovedError``, and the caller queues them there. A ``lost``
    role that retires holds nothing: it is forgotten at once. ``devices``: device id ->
    its pool (capacity, each placed role's bytes there), whole: a load needs room in
    host RAM and in the device its role is placed on (none: host RAM alone). Answered
    by one ``Reconfigured``, what changed.
    """

    now: float
    specs: Mapping[str, InferenceSpec]
    capacity_bytes: int
    concurrency: NodeConcurrency | None = None
    unavailable: Mapping[str, str] = field(default_factory=dict)
    memory: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    restart: frozenset[str] = frozenset()
    moved: Mapping[str, str] = field(default_factory=dict)
    devices: Mapping[str, DevicePool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """The backend of ``role`` was measured: ``peak_bytes`` is its run's peak RSS (what it
    holds at most), ``run_peak_bytes`` the largest of this ``up`` under the same settings
    (shown as the role's ``run_peak_bytes``). When ``peak_bytes`` passes the role's
    counted figure by more than ``MEASURED_OVER_COUNTED`` its count follows the
    measurement at once, as a change of scheduling facts does (the machine evicts other
    roles if the node no longer fits). ``device_bytes``: device id -> what the backend
    holds on that device (NVML's per-process figure, or its log's, the larger); where it
    passes the bytes counted for the role in that device's pool by the same margin, the
    pool counts it from then on, with the same warning."""

    now: float
    role: str
    peak_bytes: int
    run_peak_bytes: int
    device_bytes: Mapping[str, int] = field(default_factory=dict)


Event = (
    Acquire
    | Cancel
    | Release
    | Unload
    | BackendChanged
    | NodeLost
    | LoadDone
    | StopDone
    | Suspect
    | ProbeDone
    | KvSaveDone
    | Tick
    | Shutdown
    | Reconfigure
    | MeasuredPeak
)

# --------------------------------------------------------------------------- effects out


@dataclass(frozen=True, slots=True)
class StartBackend:
    """Run ``RoleBackends.start(role)`` in the background; report it with ``LoadDone``."""

    role: str


@dataclass(frozen=True, slots=True)
class StopBackend:
    """Run ``RoleBackends.stop(role)`` in the background; report it with ``StopDone``.

    During shutdown it may come while the role's start is under way: that start
    then fails promptly (the ``RoleBackends.stop`` contract).
    """

    role: str


@dataclass(frozen=True, slots=True)
class ProbeBackend:
    """Run ``RoleBackends.probe(role)`` (the generation probe) in the background, bounded by
    ``timeout_s`` seconds; report it with ``ProbeDone`` for ``generation``."""

    role: str
    generation: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class SaveKv:
    """Run ``IdleKvSaver.save_kv(role)`` in the background: save the KV cache of the idle
    ``role`` (``generation``) now, so that a later stop finds it saved; report it with
    ``KvSaveDone``. No lease of the role is granted until then."""

    role: str
    generation: int


@dataclass(frozen=True, slots=True)
class RestartBackend:
    """Run ``RoleBackends.restart(role)``: kill the wedged backend and start it again; the
    outcome comes back as ``BackendChanged`` events (``ready`` or ``restart_failed``)."""

    role: str


@dataclass(frozen=True, slots=True)
class GrantLease:
    """Answer waiter ``ticket`` with a lease on ``role`` at ``endpoint``.

    With ``take_slot`` the slot is counted in flight from now on: if the waiter
    is gone, the loop must send ``Release(role, generation)`` back at once.
    ``waited_s``: time spent queued, seconds.
    """

    ticket: int
    role: str
    endpoint: Endpoint
    generation: int
    waited_s: float
    take_slot: bool


@dataclass(frozen=True, slots=True)
class FailWaiter:
    """Answer waiter ``ticket`` with ``error(message, retry_after_s)``."""

    ticket: int
    error: type[SchedulerError]
    message: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class RevokeLeases:
    """Tell every holder of a lease of ``role``'s ``generation`` to end its request now."""

    role: str
    generation: int
    revocation: Revocation


@dataclass(frozen=True, slots=True)
class RecordEvent:
    """One step of the resident set, for the event log, the log and the metrics.

    ``kind``/``role``/``cause``/``resident``/``resident_bytes``/``duration_s``
    as ``SchedulerEvent`` (``duration_s`` unrounded); ``label``: the metric's
    cause label (``loaded``: ``request``, ``warm-up``, ``load``; ``stopped``:
    ``make_room``, ``exclusion``, ``drain``, ``idle_ttl``, ``unload``,
    ``shutdown``), ``None`` for other kinds.
    """

    kind: str
    role: str
    cause: str
    resident: tuple[str, ...]
    resident_bytes: int
    duration_s: float | None = None
    label: str | None = None


@dataclass(frozen=True, slots=True)
class UpdateGauges:
    """``role`` has ``running`` leases out (requests its backend runs) and ``queued``
    waiters now."""

    role: str
    running: int
    queued: int


@dataclass(frozen=True, slots=True)
class LogNote:
    """A line for rosterd's log that is no resident-set step (a wait reason, a failed stop)."""

    level: Literal["info", "warning"]
    message: str


@dataclass(frozen=True, slots=True)
class FinishUnload:
    """The unload ``ticket`` is done: the role is not resident."""

    ticket: int


@dataclass(frozen=True, slots=True)
class ForgetRole:
    """``role`` retired: it is stopped and no longer on this node; drop what is kept for it."""

    role: str


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """A ``Reconfigure`` was taken: ``change`` says what it changed (roles added, retired,
    restarted, updated; the budget before and after)."""

    change: NodeChange


@dataclass(frozen=True, slots=True)
class FinishShutdown:
    """Shutdown is done: every backend this node started has exited."""


Effect = (
    StartBackend
    | StopBackend
    | ProbeBackend
    | SaveKv
    | RestartBackend
    | GrantLease
    | FailWaiter
    | RevokeLeases
    | RecordEvent
    | UpdateGauges
    | LogNote
    | FinishUnload
    | ForgetRole
    | Reconfigured
    | FinishShutdown
)
