"""The scheduler's values (DESIGN.md layer 6, pure): phases, limits, revocations, logged events.

Plain frozen dataclasses and enums: our own values, nothing to parse.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


class Phase(enum.Enum):
    """Where a role's backend is: every phase but ``stopped`` holds memory.

    ``restarting``: the backend crashed and the supervisor is starting it again;
    ``unhealthy``: its generation probe failed, or a request's progress check found
    it stuck (HTTP up, generation wedged), so it is being killed and started again;
    ``lost``: the node it was on is lost (its Ray node or its agent died): no
    process of it is left, and it holds nothing; its requests wait (up to their
    queue timeout) for the run-time re-plan to serve it elsewhere.
    """

    STOPPED = "stopped"
    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    UNHEALTHY = "unhealthy"
    LOST = "lost"


#: The phases whose role counts against the node's budget.
HOLDS_MEMORY = frozenset(
    {Phase.LOADING, Phase.READY, Phase.RESTARTING, Phase.STOPPING, Phase.UNHEALTHY}
)


def backoff_s(failures: int, initial_s: float, max_s: float) -> float:
    """Seconds to wait after ``failures`` failures in a row (at least 1) before trying again.

    ``initial_s * 2**(failures - 1)``, at most ``max_s``: as the supervisor backs off
    crash restarts (``rosterd.supervisor.backoff_delay``), 0.5, 1, 2, 4, ... capped.
    """
    return min(max_s, initial_s * (2.0 ** min(max(failures - 1, 0), 62)))


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The scheduler's knobs; durations in seconds.

    ``max_concurrency``: leases per role at once; ``max_queue``: waiters per
    role; ``queue_timeout_s``: how long a request waits for its role;
    ``drain_s``: how long a waiter lets busy roles finish before they may be
    evicted (and how long shutdown lets requests finish); ``idle_ttl_s``: idle
    time after which a non-sticky batch role is unloaded (``math.inf``: never);
    ``min_busy_residency_s``: how long a just-loaded role that has work (a request
    in flight or queued) is protected from a batch role that was itself evicted to
    make room for it (the ping-pong it prevents; an idle role is never held, the
    first swap neither); ``max_wait_s``: how long the oldest request of a role that
    cannot be resident with the one serving may wait for its turn while that role
    serves its own queue (then the turn ends); ``tick_s``: how often timers (TTL,
    min residency, drain, queue timeouts, probes) are checked.
    ``probe_interval_s``: how long a ready role may stay idle before its
    generation probe runs (``math.inf``: never while idle); ``probe_timeout_s``:
    how long a probe may take before the backend counts as wedged, unless its
    progress moves within ``probe_busy_window_s`` after that (``--progress-window``: a
    backend busy prefilling for a client that left answers no probe in time);
    ``load_backoff_s`` / ``max_load_backoff_s``: after a failed load, requests
    are refused (503, ``Retry-After``) for ``load_backoff_s`` doubling per
    failure in a row, at most ``max_load_backoff_s``. ``kv_idle_save_s``: how long a
    role stays idle after its last request before its KV cache is saved (``SaveKv``),
    so that an eviction finds it saved (``math.inf``: only when it stops).
    """

    max_concurrency: int = 4
    max_queue: int = 64
    queue_timeout_s: float = 300.0
    drain_s: float = 30.0
    idle_ttl_s: float = 600.0
    min_busy_residency_s: float = 10.0
    max_wait_s: float = 30.0
    tick_s: float = 0.25
    probe_interval_s: float = 30.0
    probe_timeout_s: float = 20.0
    probe_busy_window_s: float = 45.0
    load_backoff_s: float = 0.5
    max_load_backoff_s: float = 30.0
    kv_idle_save_s: float = 1.5


@dataclass(frozen=True)
class NodeConcurrency:
    """The node-wide limit on generations running at once (leases taken with a slot).

    ``max_concurrency``: the fleet node's ``max_concurrency`` (``None``: the sum of
    the slots of the roles holding memory); ``slots``: role -> its backend's
    parallel slots (the fleet's ``parallel``; 1 for a role not named). Per-role
    limits (``SchedulerLimits.max_concurrency``) still hold inside it.
    ``role_caps``: role -> the most requests its backend serves at once (a
    llama-server's ``--parallel`` slots): no more leases than that go to it, the
    rest wait in rosterd's queue, where they can be counted and cut (issue 22: a
    one-slot role held 2 in flight, the second waiting inside llama-server).
    """

    max_concurrency: int | None = None
    slots: Mapping[str, int] = field(default_factory=dict, hash=False)
    role_caps: Mapping[str, int] = field(default_factory=dict, hash=False)

    def limit(self, resident: Iterable[str]) -> int:
        """Generations the node may run at once while ``resident`` roles hold memory."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        return sum(self.slots.get(role, 1) for role in resident)


@dataclass(frozen=True, slots=True)
class Revocation:
    """Why the leases of a role were revoked: the scheduler stops the role's backend while
    requests are still in flight (after ``drain_s``), so the router ends them itself.

    ``code``: the OpenAI error code for the client (``evicted``, ``shutting_down``,
    ``backend_unhealthy``, ``node_lost``);
    ``message``: what the client is told (no paths, no pids);
    ``resend``: a request of which no byte was answered yet may be sent again, on
    wherever its role is served next (its backend vanished with its node, so it never
    ran to an end anywhere: a power cut leaves connections that no RST closes).
    """

    code: str
    message: str
    resend: bool = False


@dataclass(frozen=True, slots=True)
class SchedulerEvent:
    """One step of a node's resident set, as logged.

    ``kind``: ``loading``, ``loaded``, ``load_failed``, ``stopping``,
    ``stopped``, ``refused``, ``crashed``, ``restarted``, ``restart_failed``,
    ``unhealthy`` (its generation probe failed), ``load_cancelled`` (nobody
    waited for it and another role needed the room);
    ``node_silent`` (its node did not answer a probe: its requests wait for the
    node's verdict) and ``node_answers`` (it answers again);
    ``lost`` (the role's node is lost); ``moved`` / ``unplaced`` (a re-plan after a
    loss moved the role to another node / found it no node: recorded on the lost node);
    ``cause``: why (the policy's reason, ``idle``, ``unload``, ``shutdown``, …);
    ``resident``: roles holding memory after the step (sorted);
    ``resident_bytes``: their spec bytes; ``at``: wall-clock time (seconds
    since the epoch); ``duration_s``: for ``loaded``/``stopped``, how long the
    step took.
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


@dataclass(frozen=True, slots=True)
class NodeChange:
    """What a re-plan changes on one node (``NodeScheduler.apply``); roles sorted by id.

    ``added``: placed here from now on; ``retired``: no longer placed here (they
    drain, stop and are forgotten); ``restarted``: what they launch changed (they
    restart once idle); ``updated``: only scheduling facts changed (memory, latency
    class, sticky, excludes: applied at once); ``capacity_bytes``: ``(before,
    after)`` when the budget changed, else ``None``; ``device_capacity_bytes``:
    ``(device id, before, after)`` for each device pool whose capacity changed, by id.
    """

    added: tuple[str, ...] = ()
    retired: tuple[str, ...] = ()
    restarted: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    capacity_bytes: tuple[int, int] | None = None
    device_capacity_bytes: tuple[tuple[str, int, int], ...] = ()

    @property
    def changed(self) -> bool:
        """Whether anything changed."""
        return bool(
            self.added
            or self.retired
            or self.restarted
            or self.updated
            or self.capacity_bytes
            or self.device_capacity_bytes
        )

    def as_json(self) -> dict[str, object]:
        """The change as JSON-ready data (``POST /rosterd/reload``)."""
        return {
            "added": list(self.added),
            "retired": list(self.retired),
            "restarted": list(self.restarted),
            "updated": list(self.updated),
            "capacity_bytes": list(self.capacity_bytes) if self.capacity_bytes else None,
            "device_capacity_bytes": {
                device: [before, after] for device, before, after in self.device_capacity_bytes
            },
        }


@dataclass(frozen=True, slots=True)
class DevicePool:
    """One device's memory on a node as the node machine holds roles to it (issue 29: a
    GPU's memory is a budget of its own): ``capacity_bytes`` (what rosterd may count
    there: declared or probed, less the reserve and what other processes hold) and
    ``bytes_by_role`` (role -> the bytes it holds on the device when resident: the plan's
    ``DeviceChoice.device_bytes``). A role not in ``bytes_by_role`` uses no room there.
    For display only (``/status``'s ``pools``): ``declared_bytes`` (the fleet file's
    figure; ``None``: not declared), ``probed_total_bytes`` (what a probe listed;
    ``None``: no probe saw it) and ``source`` (``declared``, ``declared, probed``,
    ``probed``, ``default``: a Mac's GPU share by Metal's default rule)."""

    capacity_bytes: int
    bytes_by_role: Mapping[str, int] = field(default_factory=dict)
    declared_bytes: int | None = None
    probed_total_bytes: int | None = None
    source: str = "declared"
