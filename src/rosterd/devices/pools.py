"""A node's memory pools from what the fleet declares and what the probes found (layer 3:
pure; no I/O, clock or logging: warnings are returned).

Pools: ``host`` (RAM: ``memory - reserved``, as it always was) and one per device.
A device's pool is, in order of precedence:

- **declared** in the fleet file (``devices:``): its ``memory_gb`` (or a Mac's GPU share)
  overrides what a probe lists, because an operator declares a device to say what rosterd
  may use; a declared device that no probe sees is used as declared, with one warning
  (so a fleet planned on another machine, or a machine whose probe failed, still runs);
- **probed**: listed by ``llama-server --list-devices`` (:mod:`rosterd.devices.listing`)
  or found by NVML (:mod:`rosterd.devices.nvml`) but not declared: its listed total.

Memory other processes hold on a GPU lowers what rosterd may use there (GPUStack#6044 is
what ignoring it costs): NVML's used bytes less rosterd's own processes' where NVML reads
the device, else the listing's ``total - free`` (probed before rosterd starts a backend).
A Mac's GPU share is capped by Metal, not held by processes: nothing is subtracted.

``capacity = memory - reserved - others`` (never below 0). A node with no device declared
or found has the host pool alone: planning and residency are as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from rosterd.devices.listing import ListedDevice
from rosterd.devices.nvml import NvmlDevice
from rosterd.fleet.model import DeviceSpec, Node

#: The host pool's id: the node's RAM.
HOST: str = "host"


@dataclass(frozen=True, slots=True)
class Pool:
    """One budget of memory on a node, every figure in bytes.

    ``id``: ``host`` or the device's id; ``kind``: ``host``, ``gpu`` (a device's own
    memory) or ``gpu-share`` (a Mac's GPU share of unified memory). ``declared_bytes``:
    the fleet file's figure (``None``: not declared); ``probed_total_bytes`` /
    ``probed_free_bytes``: what the listing or NVML found (``None``: not seen);
    ``others_bytes``: held by processes other than rosterd's; ``capacity_bytes``: what
    rosterd may count against (``memory - reserved - others``, at least 0);
    ``source``: ``declared``, ``declared, probed``, ``probed`` or ``host``.
    """

    id: str
    kind: str
    capacity_bytes: int
    reserved_bytes: int
    declared_bytes: int | None
    probed_total_bytes: int | None
    probed_free_bytes: int | None
    others_bytes: int
    source: str


@dataclass(frozen=True, slots=True)
class NodePools:
    """A node's pools (host first, then devices in declared, then listed order) and the
    warnings a person should read (one per declared device no probe saw)."""

    pools: tuple[Pool, ...]
    warnings: tuple[str, ...] = ()

    def devices(self) -> tuple[Pool, ...]:
        """The device pools (all but host)."""
        return tuple(p for p in self.pools if p.kind != "host")


def node_pools(
    node: Node,
    listed: Sequence[ListedDevice] = (),
    nvml: Sequence[NvmlDevice] = (),
    own_pids: frozenset[int] = frozenset(),
    *,
    probed: bool = True,
) -> NodePools:
    """``node``'s pools from its declared ``devices`` and what the probes found.

    ``listed``: ``llama-server --list-devices`` on the node; ``nvml``: its NVIDIA GPUs;
    ``own_pids``: rosterd's backends there (their NVML bytes are not others');
    ``probed``: whether a probe ran at all (``False``: plan-time, from the fleet file
    alone: declared devices are used as declared, without a warning). Device ids match
    case-insensitively, as llama.cpp matches ``--device`` names; ``Metal`` and ``MTL0``
    are the same Mac GPU (llama.cpp renamed it).
    """
    host = Pool(
        id=HOST,
        kind="host",
        capacity_bytes=node.capacity_bytes,
        reserved_bytes=node.reserved_bytes,
        declared_bytes=node.memory_bytes,
        probed_total_bytes=None,
        probed_free_bytes=None,
        others_bytes=0,
        source="host",
    )
    by_id = {_key(d.id): d for d in listed}
    gpus = {_key(g.cuda_id): g for g in nvml}
    pools = [host]
    warnings: list[str] = []
    seen: set[str] = set()
    for spec in node.devices:
        key = _key(spec.id)
        seen.add(key)
        found, gpu = by_id.get(key), gpus.get(key)
        if probed and found is None and gpu is None:
            warnings.append(
                f"node {node.name}: device {spec.id} is declared in the fleet file but no probe "
                "sees it (llama-server --list-devices, NVML); it is used as declared"
            )
        pools.append(_pool(spec, found, gpu, own_pids))
    for device in listed:
        key = _key(device.id)
        if key in seen:
            continue
        seen.add(key)
        spec = DeviceSpec(id=device.id, memory_bytes=device.total_bytes)
        pool = _pool(spec, device, gpus.get(key), own_pids)
        pools.append(replace(pool, declared_bytes=None, source="probed"))
    for gpu in nvml:
        key = _key(gpu.cuda_id)
        if key in seen:
            continue
        seen.add(key)
        spec = DeviceSpec(id=gpu.cuda_id, memory_bytes=gpu.total_bytes)
        pool = _pool(spec, None, gpu, own_pids)
        pools.append(replace(pool, declared_bytes=None, source="probed"))
    return NodePools(tuple(pools), tuple(warnings))


def _key(device_id: str) -> str:
    """A device id as matched: case-insensitive (llama.cpp's ``--device`` is), and a Mac's
    one GPU as ``mtl0`` whether its build names it ``Metal`` (older) or ``MTL0``."""
    key = device_id.lower()
    return "mtl0" if key == "metal" else key


def _pool(
    spec: DeviceSpec, found: ListedDevice | None, gpu: NvmlDevice | None, own_pids: frozenset[int]
) -> Pool:
    total = free = None
    others = 0
    if gpu is not None:
        total, free = gpu.total_bytes, gpu.free_bytes
        others = gpu.others_bytes(own_pids)
    elif found is not None:
        total, free = found.total_bytes, found.free_bytes
        others = found.total_bytes - found.free_bytes
    if spec.gpu_share:
        others = 0
    capacity = max(spec.memory_bytes - spec.reserved_bytes - others, 0)
    source = "declared" if total is None else "declared, probed"
    return Pool(
        id=spec.id,
        kind="gpu-share" if spec.gpu_share else "gpu",
        capacity_bytes=capacity,
        reserved_bytes=spec.reserved_bytes,
        declared_bytes=spec.memory_bytes,
        probed_total_bytes=total,
        probed_free_bytes=free,
        others_bytes=others,
        source=source,
    )


def with_counted_devices(node: Node, pools: NodePools) -> Node:
    """``node`` with its devices as counted (each pool's capacity, no reserve left to take):
    the node placement and residency hold to once the probes have run."""
    devices = tuple(
        DeviceSpec(id=p.id, memory_bytes=p.capacity_bytes, gpu_share=p.kind == "gpu-share")
        for p in pools.devices()
        if p.capacity_bytes > 0
    )
    return replace(node, devices=devices)
