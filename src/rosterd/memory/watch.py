"""Recording each role's measured peak while ``rosterd up`` runs (DESIGN.md layer 6).

A :class:`PeakRecorder` per node asks the node's backends boundary for its
peaks (``rosterd.backends.interface.PeakSource``: the local supervisor's backends or a
node agent's, sampled on the node, so nothing here reads a pid) and stores
each one that changed in the state folder (``rosterd.memory.peaks``), under
the role's run fingerprint (``rosterd.memory.gathering.run_fingerprint``), so the
next ``up`` and ``plan`` count it. It records after every backend stop (the
boundary sampled the peak just before it), every ``interval_s`` while serving
(a crash loses nothing older), and once more at shutdown, after the last stop.

What is stored is the largest peak of the role during this ``up`` under its
settings (the backends report each run's own peak; the recorder keeps the largest
for the same fingerprint): it replaces what an earlier ``up`` measured, as
``rosterd.memory.count`` wants it.
A reload gives a node new backends and new fingerprints (:meth:`PeakRecorder.add_source`):
the backends of before keep reporting the roles they started (they stop them), and
a role's figure comes from the newest backends that started it, under their
fingerprint, so a peak measured with old settings is never stored under new ones.
A peak that cannot be stored is said once through ``on_error`` and the run
goes on: the figure only ever adds evidence.

With each peak goes what the role's backend holds on each device (issue 29), where its node
has device pools: on each NVIDIA GPU, NVML's per-process figure; on any device, what each
llama.cpp backend's own log reports it allocated there while it loaded; in a Mac's GPU share,
the process's physical footprint (macOS's ``phys_footprint``, which counts the memory Metal
wired for it; RSS does not). This machine's backends are read here, each reader a function
of its own (:func:`nvml_device_bytes` by their pids, :func:`log_device_bytes` from their
logs, :func:`footprint_device_bytes` by their pids), composed by
:func:`largest_device_bytes`: the larger figure where two give one for the same role and
device. A node agent's are read on its node by the agent (``DeviceBytesSource``:
:func:`agent_device_bytes`, NVML and the logs there).

Each peak read also goes to the node, as an event (``NodeScheduler.measured_peak``):
what ``/status`` shows of it, and whether the role's count follows it at once
(``MEASURED_OVER_COUNTED``), are the node machine's to decide. Nothing here writes
to a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from rosterd.backends.interface import DeviceBytesSource, PeakSource, ReportedDeviceBytes
from rosterd.devices.footprint import footprints_by_roles, read_phys_footprints
from rosterd.devices.load_buffers import largest_per_device
from rosterd.devices.nvml import NvmlReading, held_by_roles, read_nvml
from rosterd.devices.pools import is_metal_device
from rosterd.errors import MeasuredPeaksError
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerEvent

log = logging.getLogger("rosterd.memory")


class PeakRecorder:
    """Stores the peaks of one node's roles (see the module docstring).

    ``node``: the node scheduler (told each role's peak: ``measured_peak``); ``source``:
    its backends boundary; ``peaks``: the state
    folder's measured peaks; ``fingerprints``: role -> the run fingerprint
    (roles not named are not recorded); ``wall_clock``: seconds since the epoch;
    ``device_bytes``: reads role -> device id -> bytes its backend holds there now (NVML's
    :func:`nvml_device_bytes` and the logs' :func:`log_device_bytes` here, the larger of
    the two; :func:`agent_device_bytes` on an agent's node), told to the node with each
    peak (``None``: not read).
    """

    def __init__(
        self,
        node: NodeScheduler,
        source: PeakSource,
        peaks: MeasuredPeaks,
        fingerprints: Mapping[str, str],
        *,
        interval_s: float = 10.0,
        on_error: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        device_bytes: Callable[[], Awaitable[Mapping[str, Mapping[str, int]]]] | None = None,
    ) -> None:
        self.node = node
        self._device_bytes = device_bytes
        self.peaks = peaks
        # (backends, role -> fingerprint), oldest first: one per configuration served
        self._sources: list[tuple[PeakSource, dict[str, str]]] = [(source, dict(fingerprints))]
        self.interval_s = interval_s
        self._on_error = on_error
        self._wall_clock = wall_clock
        self._recorded: dict[str, tuple[str, int]] = {}
        self._failed = False
        self._task: asyncio.Task[None] | None = None
        self._after_stop: set[asyncio.Task[dict[str, int]]] = set()

    @property
    def fingerprints(self) -> dict[str, str]:
        """Role -> the run fingerprint of the configuration served now."""
        return self._sources[-1][1]

    def add_source(self, source: PeakSource, fingerprints: Mapping[str, str]) -> None:
        """A reload gave the node ``source`` (its new backends) and ``fingerprints`` (role ->
        run fingerprint): roles it starts are recorded under these from now on."""
        if source is self._sources[-1][0]:
            self._sources[-1] = (source, dict(fingerprints))
        else:
            self._sources.append((source, dict(fingerprints)))

    def start(self) -> None:
        """Record after every stop of a backend and every ``interval_s`` (on the running loop)."""
        self.node.listeners.append(self._on_event)
        if self._task is None:
            self._task = asyncio.create_task(self._every(), name=f"rosterd-peaks-{self.node.name}")

    async def finish(self) -> dict[str, int]:
        """Stop the timer and record once more (call after the node's last stop)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._after_stop):
            with contextlib.suppress(Exception):
                await task
        return await self.record()

    async def record(self) -> dict[str, int]:
        """Ask the boundary for its peaks and store those that changed; role -> peak bytes."""
        found: dict[str, int] = {}
        fingerprint_of: dict[str, str | None] = {}
        for source, fingerprints in self._sources:  # oldest first: the newest run wins
            try:
                peaks = await source.peak_rss_bytes()
            except Exception as exc:  # a node that cannot answer now is asked again later
                log.warning("node %s: cannot read the backends' peaks: %s", self.node.name, exc)
                continue
            for role, peak in peaks.items():
                fingerprint = fingerprints.get(role)
                if role in found and fingerprint_of[role] == fingerprint:
                    peak = max(peak, found[role])  # the same settings: the largest of this up
                found[role] = peak
                fingerprint_of[role] = fingerprint
        on_devices: Mapping[str, Mapping[str, int]] = {}
        if self._device_bytes is not None:
            try:
                on_devices = await self._device_bytes()
            except Exception as exc:  # the reading only adds evidence: the peaks go on
                log.warning("node %s: cannot read the devices: %s", self.node.name, exc)
        for role, peak in sorted(found.items()):
            fingerprint = fingerprint_of[role]
            prior = self._recorded.get(role)
            run_peak = peak
            if prior is not None and prior[0] == fingerprint:
                run_peak = max(peak, prior[1])  # an earlier run of this `up`, same settings
            self.node.measured_peak(role, peak, run_peak, on_devices.get(role))
            if fingerprint is None or self._recorded.get(role) == (fingerprint, run_peak):
                continue
            try:
                self.peaks.record(
                    self.node.name,
                    role,
                    run_peak,
                    measured_at_s=self._wall_clock(),
                    fingerprint=fingerprint,
                )
            except MeasuredPeaksError as exc:
                if not self._failed and self._on_error is not None:
                    self._on_error(str(exc))
                self._failed = True
                continue
            self._recorded[role] = (fingerprint, run_peak)
        return found

    def _on_event(self, event: SchedulerEvent) -> None:
        if event.kind == "stopped":
            task = asyncio.get_running_loop().create_task(self.record())
            self._after_stop.add(task)
            task.add_done_callback(self._after_stop.discard)

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.record()


def follow_peaks(
    nodes: Mapping[str, NodeScheduler],
    sources: Mapping[str, PeakSource],
    recorders: Sequence[PeakRecorder],
    fingerprints: Mapping[str, str],
    peaks: MeasuredPeaks,
    *,
    on_error: Callable[[str], None] | None = None,
) -> list[PeakRecorder]:
    """Record each node's peaks in ``peaks`` under ``fingerprints`` (role -> run
    fingerprint): ``sources`` is node -> its backends now (a node without one is
    skipped); a node with a recorder among ``recorders`` has it record those
    backends too from now on (a reload); the others (and a node whose scheduler was
    made afresh) get a recorder, started now
    (on the running loop), and those are returned."""
    following = {r.node.name: r for r in recorders}
    added = []
    for name, node in nodes.items():
        source = sources.get(name)
        if source is None:
            continue
        if name in following and following[name].node is node:
            following[name].add_source(source, fingerprints)
            continue
        device_bytes = None
        if getattr(source, "pids_are_local", False):
            readers = [nvml_device_bytes(node), footprint_device_bytes(node)]
            if isinstance(source, ReportedDeviceBytes):
                readers.append(log_device_bytes(node, source))
            device_bytes = largest_device_bytes(*readers)
        elif isinstance(source, DeviceBytesSource):
            device_bytes = agent_device_bytes(node, source)
        recorder = PeakRecorder(
            node, source, peaks, fingerprints, on_error=on_error, device_bytes=device_bytes
        )
        recorder.start()
        added.append(recorder)
    return added


def nvml_device_bytes(
    node: NodeScheduler, read: Callable[[], NvmlReading] = read_nvml
) -> Callable[[], Awaitable[dict[str, dict[str, int]]]]:
    """A reader of what ``node``'s backends hold on each NVIDIA GPU (role -> device id ->
    bytes, NVML's per-process figure, issue 29) for a node whose backends are processes of
    this machine, read off the event loop; it reads nothing on a node without device pools.
    ``read``: NVML's reading (a stand-in in tests)."""

    async def held() -> dict[str, dict[str, int]]:
        view = node.snapshot()
        if len(view.pools) <= 1:
            return {}
        pids = {role: info.pid for role, info in view.roles.items() if info.pid is not None}
        return held_by_roles(await asyncio.to_thread(read), pids)

    return held


def footprint_device_bytes(
    node: NodeScheduler,
    read: Callable[[Sequence[int]], Mapping[int, int]] = read_phys_footprints,
) -> Callable[[], Awaitable[dict[str, dict[str, int]]]]:
    """A reader of what ``node``'s backends hold in its Mac's GPU share (role -> the share's
    id, ``MTL0`` -> bytes) for a node whose backends are processes of this machine: each
    backend's physical footprint (``phys_footprint``, :func:`read_phys_footprints`), read
    off the event loop; it reads nothing on a node without a Mac's GPU share among its
    pools, and nothing anywhere but macOS. ``read``: pids -> bytes (a stand-in in tests).

    The footprint counts in the GPU share, not in host RAM: it is the figure that counts
    what Metal wired for the process, which RSS misses, and the share is what Metal caps.
    Host RAM keeps following peak RSS (what the state folder keeps per run): the footprint
    leaves out what RSS counts of a mapped file (llama-server's GGUF), so neither figure
    holds the other, and the host pool already counts the whole of a role placed in the
    share.
    """

    async def held() -> dict[str, dict[str, int]]:
        view = node.snapshot()
        share = next((p for p in view.pools if is_metal_device(p)), None)
        if share is None:
            return {}
        pids = {role: info.pid for role, info in view.roles.items() if info.pid is not None}
        if not pids:
            return {}
        footprints = await asyncio.to_thread(read, tuple(pids.values()))
        return footprints_by_roles(footprints, pids, share)

    return held


def log_device_bytes(
    node: NodeScheduler, source: ReportedDeviceBytes
) -> Callable[[], Awaitable[dict[str, dict[str, int]]]]:
    """A reader of what ``node``'s backends reported allocating on each device as they loaded
    (role -> device id -> bytes: llama-server's load lines, read from each backend's log by
    ``source``, this machine's backends; issue 29: ROCm, Vulkan and Metal have no NVML); it
    reads nothing on a node without device pools."""

    async def reported() -> dict[str, dict[str, int]]:
        if len(node.snapshot().pools) <= 1:
            return {}
        return await source.reported_device_bytes()

    return reported


def largest_device_bytes(
    *readers: Callable[[], Awaitable[Mapping[str, Mapping[str, int]]]],
) -> Callable[[], Awaitable[dict[str, dict[str, int]]]]:
    """One reader of what roles hold per device (role -> device id -> bytes) from several
    (NVML's, the backends' logs', ...), the larger figure where two give one for the same
    role and device (:func:`~rosterd.devices.load_buffers.largest_per_device`). A reader that
    fails is said and left out: the others' figures still count."""

    async def held() -> dict[str, dict[str, int]]:
        readings = []
        for read in readers:
            try:
                readings.append(await read())
            except Exception as exc:  # the readings only add evidence
                log.warning("cannot read what the backends hold on the devices: %s", exc)
        return largest_per_device(*readings)

    return held


def agent_device_bytes(
    node: NodeScheduler, source: DeviceBytesSource
) -> Callable[[], Awaitable[dict[str, dict[str, int]]]]:
    """A reader of what ``node``'s backends hold on each device of its machine (role ->
    device id -> bytes) for a node a node agent runs: the agent reads there NVML by its
    backends' pids, their logs and, on a Mac, their physical footprints (``source``: its
    ``AgentBackends``); it asks nothing of a node without device pools. A figure the agent
    gives for a Mac's GPU share counts on the node's share pool, whichever of ``MTL0`` and
    ``Metal`` it is named (the larger where both are given)."""

    async def held() -> dict[str, dict[str, int]]:
        pools = node.snapshot().pools
        if len(pools) <= 1:
            return {}
        share = next((p for p in pools if is_metal_device(p)), None)
        reading = await source.device_bytes()
        if share is None:
            return reading
        # each figure under the pool's name; MTL0's and Metal's for one role: the larger
        return largest_per_device(
            *(
                {role: {share if is_metal_device(device) else device: used}}
                for role, devices in reading.items()
                for device, used in devices.items()
            )
        )

    return held
