"""The backends boundary (between DESIGN.md layers 5 and 6): what a node's scheduler asks of
the backends of its roles, as Protocols and plain values.

The node scheduler decides; whatever implements this boundary acts. It is the
scheduler's syscall table: :class:`RoleBackends` (start a role, stop a role,
probe that it generates, restart it when it does not) and
:class:`BackendEventSource` (what happened to a backend by itself: a crash, a
restart, a restart given up). Everything that crosses it is a plain,
picklable value (role ids, :class:`Endpoint`, ``BackendEvent``) and every call
is async, so the same boundary can be served by a node agent on another
machine. Implementations: :class:`rosterd.backends.local.SupervisorBackends`
(this machine's supervisor and the flavor adapters) and
``rosterd.node_agent.AgentBackends`` (a node agent over Ray).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from rosterd.backends.values import BackendEvent, Endpoint, KeptKv, ProbeResult

__all__ = [
    "BackendEvent",
    "BackendEventSource",
    "DeviceBytesSource",
    "Endpoint",
    "IdleKvSaver",
    "KeptKv",
    "KeptKvSource",
    "LoadHistory",
    "MeasuredBackends",
    "PeakSource",
    "ProbeResult",
    "ReportedDeviceBytes",
    "RoleBackends",
]


class RoleBackends(Protocol):
    """How a node scheduler starts and stops a role's backend (the syscall table).

    The node scheduler calls ``start`` and ``stop`` only as its state machine
    says: never two transitions of one node at once, except that shutdown stops
    a role whose start is under way. Arguments and results are plain values.
    """

    async def start(self, role: str) -> Endpoint:
        """Start ``role``'s backend; return once it is ready to serve.

        Contract: raises on failure (any exception; its message, or its
        ``client_message`` attribute when it has one, reaches the waiting
        requests). A start that fails must leave no process holding memory
        once ``stop(role)`` returned.
        """
        ...

    async def stop(self, role: str) -> None:
        """Stop ``role``'s backend; return only after it exited, so its memory is free.

        Contract: a no-op for a role that is not running. Called while
        ``start(role)`` is still running (shutdown), it makes that start fail
        promptly and leaves no process.
        """
        ...

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        """Run the flavor's generation probe (a one-token completion) against ``role``'s
        running backend, bounded by ``timeout_s`` seconds.

        Contract: never raises for a backend that does not answer or answers wrong;
        that is a result with ``ok`` false and ``detail`` saying what happened.
        """
        ...

    async def restart(self, role: str) -> None:
        """Kill ``role``'s running (wedged) backend and start it again at once, as after a
        crash; return once the kill was sent.

        Contract: the outcome reaches the scheduler as backend events of ``role``
        (``exited``, ``restarting``, then ``ready`` or ``restart_failed``); the
        role's memory stays held meanwhile. Raises if ``role`` is not running.
        """
        ...


class BackendEventSource(Protocol):
    """Where a node's backend events come from when the node's backends are not in this
    process (a node agent).

    Locally the supervisor's ``on_event`` callback reaches the scheduler
    directly (``NodeDirectory.backend_event``); a remote node agent has no callback
    into us, so the node scheduler asks it instead.
    """

    async def changes(self) -> Sequence[BackendEvent]:
        """Wait until something happened to a backend by itself; return it, oldest first.

        Contract: returns at least one event; never the same event twice; only
        events of this node's roles (``BackendEvent.name`` is the role id); the
        kinds and fields as ``Supervisor(on_event=...)`` gives them.
        """
        ...


@runtime_checkable
class MeasuredBackends(Protocol):
    """Backends that can say how much memory their processes hold, measured where they run.

    The one way rosterd learns a role's measured RSS: locally the supervisor
    measures its process tree; a node agent measures on its node (a pid of
    another machine means nothing here).
    """

    async def measured_bytes(self) -> Mapping[str, int]:
        """Role -> resident memory (RSS, bytes) of its backend and its children, measured
        now; roles without a running process are left out."""


class PeakSource(Protocol):
    """What a node's backends measured of their memory (implemented beside ``RoleBackends``)."""

    async def peak_rss_bytes(self) -> dict[str, int]:
        """Role -> the largest peak RSS (bytes) of its backend's process tree in its last run.

        Contract: only roles these backends started; a running backend is sampled
        now; a stopped one keeps the peak sampled just before its stop (so it is not
        lost with the process) until it starts again; roles never started are absent.
        A role of a shared server (ollama) is no process of its own: its figure is the
        size the server reports holding for its model (ollama's ``/api/ps`` ``size``),
        the largest seen.
        """
        ...


@runtime_checkable
class DeviceBytesSource(Protocol):
    """Backends whose processes run on another machine and read, there, what each holds on
    that machine's NVIDIA GPUs (a node agent's; this machine's backends are read here, by
    their pids)."""

    async def device_bytes(self) -> dict[str, dict[str, int]]:
        """Role -> device id (``CUDA<index>``) -> bytes its backend's process holds on that
        GPU now (NVML, per process); roles holding nothing on any GPU are left out."""
        ...


@runtime_checkable
class ReportedDeviceBytes(Protocol):
    """Backends of this machine that read, from each backend's own log, what it allocated on
    each device as it loaded (llama-server's load lines, for every llama.cpp backend: CUDA,
    ROCm, Vulkan, Metal; ``rosterd.devices.load_buffers``)."""

    async def reported_device_bytes(self) -> dict[str, dict[str, int]]:
        """Role -> device id (``CUDA0``, ``ROCm0``, ``Vulkan0``, ``MTL0``) -> bytes its
        running, ready backend reported allocating there; roles that reported nothing on a
        device are left out."""
        ...


@runtime_checkable
class KeptKvSource(Protocol):
    """Backends that keep their roles' KV caches across stops (on this machine's disk)."""

    def kept_kv(self, role: str) -> KeptKv | None:
        """What is kept of ``role``'s KV cache now, for ``/status``, from memory (no disk
        I/O); ``None`` when these backends keep nothing for it."""
        ...


@runtime_checkable
class IdleKvSaver(Protocol):
    """Backends that can save a role's KV cache while it is idle, so that its stop only
    stops the process (the node machine's ``SaveKv``; ``rosterd.scheduler.kv_saves``)."""

    async def save_kv(self, role: str) -> None:
        """Save ``role``'s KV cache now; the node scheduler grants no lease of ``role``
        until it returns.

        Contract: never raises (a failure is logged, and the stop saves instead); a no-op
        for a role whose KV is not kept or not running.
        """
        ...

    def kv_changing(self, role: str) -> None:
        """A lease was granted on ``role``: its KV cache changes, so its next idle save or
        its stop must save it again. Synchronous and cheap: called as the lease is given."""
        ...


@runtime_checkable
class LoadHistory(Protocol):
    """Backends that keep their roles' past load times across runs (this machine's
    supervisor's run records), so that a load's expected total can come from them."""

    def past_loads_s(self, role: str) -> tuple[float, ...]:
        """``role``'s past loads on this node, seconds from spawn to ready, oldest first;
        ``()`` when none are kept. Synchronous and cheap: read as a progress line is built."""
        ...


@runtime_checkable
class NodeBackends(RoleBackends, MeasuredBackends, PeakSource, Protocol):
    """One fleet node's backends as the fleet scheduler holds them: a node scheduler's
    :class:`RoleBackends` that also measure memory where they run and report peaks.
    Implemented by ``SupervisorBackends`` (this machine) and ``AgentBackends`` (a node
    agent on Ray)."""

    @property
    def pids_are_local(self) -> bool:
        """Whether an endpoint's pid is a process of this machine (a node agent's are not)."""
        ...
