"""A node's memory pools from what the fleet declares and what the probes found (layer 3:
pure; no I/O, clock or logging: warnings are returned).

Pools: ``host`` (RAM: ``memory - reserved``, as it always was) and one per device.
A device's pool is, in order of precedence:

- **declared** in the fleet file (``devices:``): its ``memory_gb`` (or a Mac's GPU share)
  overrides what a probe lists, because an operator declares a device to say what rosterd
  may use; a declared device that no probe sees is used as declared, with one warning
  (so a fleet planned on another machine, or a machine whose probe failed, still runs);
- **probed**: listed by ``llama-server --list-devices`` (:mod:`rosterd.devices.listing`)
  or found by NVML (:mod:`rosterd.devices.nvml`) but not declared: its listed total;
- **default**: a Mac (``macos-arm64``) that declares no GPU share, in a fleet whose roster
  has roles that run on a Mac's GPU (llama.cpp, mlx_lm) and that the node runs, gets one
  (``MTL0``, :func:`with_default_gpu_shares`) sized by Metal's default rule
  (:func:`metal_default_share_bytes`), unless a probe lists the Mac's GPU: Metal's own
  ``recommendedMaxWorkingSetSize``, which llama.cpp lists as the device's total, wins (and
  the pool takes the name the listing gives it, ``MTL0`` or ``Metal`` on older builds, so
  that ``--device`` names it as that build does). Both kinds count in it, as in a declared
  share: llama-server offloads every layer to Metal by default, so its roles wire the same
  memory as mlx_lm's.

Memory other processes hold on a GPU lowers what rosterd may use there (GPUStack#6044 is
what ignoring it costs): NVML's used bytes less rosterd's own processes' where NVML reads
the device, else the listing's ``total - free`` (probed before rosterd starts a backend).
A Mac's GPU share is capped by Metal, not held by processes: nothing is subtracted.

``capacity = memory - reserved - others`` (never below 0). A node with no device declared
or found has the host pool alone: planning and residency are as they were.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from rosterd.devices.listing import ListedDevice
from rosterd.devices.nvml import NvmlDevice
from rosterd.flavors import DeviceUse, InferFlavor, Platform
from rosterd.fleet.model import DeviceSpec, Fleet, Node
from rosterd.tokens import GB

#: The host pool's id: the node's RAM.
HOST: str = "host"

#: The id of a Mac's default GPU share: llama.cpp's name for the Mac's GPU (``MTL0``;
#: ``Metal`` on older builds, matched as the same device).
METAL_DEVICE: str = "MTL0"

#: Up to this much memory (bytes) Metal lets the GPU wire two thirds of it by default, above
#: it three quarters (:func:`metal_default_share_bytes`).
METAL_TWO_THIRDS_UP_TO_BYTES: int = 36 * GB


@dataclass(frozen=True, slots=True)
class Pool:
    """One budget of memory on a node, every figure in bytes.

    ``id``: ``host`` or the device's id; ``kind``: ``host``, ``gpu`` (a device's own
    memory) or ``gpu-share`` (a Mac's GPU share of unified memory). ``declared_bytes``:
    the fleet file's figure (``None``: not declared); ``probed_total_bytes`` /
    ``probed_free_bytes``: what the listing or NVML found (``None``: not seen);
    ``others_bytes``: held by processes other than rosterd's; ``capacity_bytes``: what
    rosterd may count against (``memory - reserved - others``, at least 0);
    ``source``: ``declared``, ``declared, probed``, ``probed``, ``default`` (a Mac's GPU
    share by Metal's default rule, :func:`metal_default_share_bytes`) or ``host``.
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
    #: Declared devices the node's ``llama-server --list-devices`` ran and did not list: its
    #: ``--device`` would refuse them, so roles placed there launch on the CPU.
    unlisted: tuple[str, ...] = ()

    def lists(self, device_id: str) -> bool:
        """Whether the node's llama-server can be pinned to ``device_id`` (``False`` for a
        declared device its listing lacked; ``True`` where no listing ran: unknown)."""
        return _key(device_id) not in {_key(d) for d in self.unlisted}

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
    listing_ran: bool = False,
) -> NodePools:
    """``node``'s pools from its declared ``devices`` and what the probes found.

    ``listed``: ``llama-server --list-devices`` on the node; ``nvml``: its NVIDIA GPUs;
    ``own_pids``: rosterd's backends there (their NVML bytes are not others');
    ``probed``: whether a probe ran at all (``False``: plan-time, from the fleet file
    alone: declared devices are used as declared, without a warning); ``listing_ran``:
    whether ``listed`` is a listing that ran (a declared device it lacks is ``unlisted``: a
    launch there would be refused, so one more warning says its roles run on the CPU
    here). Device ids match
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
    unlisted: list[str] = []
    seen: set[str] = set()
    for spec in node.devices:
        key = _key(spec.id)
        seen.add(key)
        found, gpu = by_id.get(key), gpus.get(key)
        cpu_instead = ""
        if listing_ran and found is None:
            unlisted.append(spec.id)
            # a misspelt id (GPU-0 for CUDA0) is told by what the listing does have
            has = f" (it lists {', '.join(d.id for d in listed)})" if listed else ""
            cpu_instead = (
                f"; the node's llama-server lists no such device{has}, so the roles placed "
                "on it run on the CPU (--device none)"
            )
        if probed and found is None and gpu is None and not spec.default_share:
            warnings.append(
                f"node {node.name}: device {spec.id} is declared in the fleet file but no probe "
                f"sees it (llama-server --list-devices, NVML); it is used as declared{cpu_instead}"
            )
        elif cpu_instead:
            warnings.append(f"node {node.name}: device {spec.id}{cpu_instead}")
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
    return NodePools(tuple(pools), tuple(warnings), tuple(unlisted))


def is_metal_device(device_id: str) -> bool:
    """Whether ``device_id`` names a Mac's GPU (its share of unified memory): ``MTL0``, or
    ``Metal`` as older llama.cpp builds list it, in any case."""
    return _key(device_id) == _key(METAL_DEVICE)


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
    memory: int = spec.memory_bytes
    declared: int | None = spec.memory_bytes
    source = "declared" if total is None else "declared, probed"
    device_id = spec.id
    if spec.default_share:
        # Not declared: the Mac's own figure, where llama.cpp lists it, over the rule, under
        # the name this build lists (pinned as `--device <id>`).
        memory = total if total is not None else spec.memory_bytes
        declared = None
        source = "default" if total is None else "probed"
        device_id = found.id if found is not None else spec.id
    capacity = max(memory - spec.reserved_bytes - others, 0)
    return Pool(
        id=device_id,
        kind="gpu-share" if spec.gpu_share else "gpu",
        capacity_bytes=capacity,
        reserved_bytes=spec.reserved_bytes,
        declared_bytes=declared,
        probed_total_bytes=total,
        probed_free_bytes=free,
        others_bytes=others,
        source=source,
    )


def with_counted_devices(node: Node, pools: NodePools) -> Node:
    """``node`` with its devices as counted (each pool's capacity, no reserve left to take):
    the node placement and residency hold to once the probes have run."""
    devices = tuple(
        DeviceSpec(
            id=p.id,
            memory_bytes=p.capacity_bytes,
            gpu_share=p.kind == "gpu-share",
            default_share=p.kind == "gpu-share" and p.declared_bytes is None,
        )
        for p in pools.devices()
        if p.capacity_bytes > 0
    )
    return replace(node, devices=devices)


def metal_default_share_bytes(memory_bytes: int) -> int:
    """What Metal lets a Mac's GPU wire by default, in bytes, for ``memory_bytes`` of RAM:
    two thirds of it up to 36 GiB (:data:`METAL_TWO_THIRDS_UP_TO_BYTES`), three quarters
    above; between 66 and 75 % of RAM, never decreasing as RAM grows.

    The cap is ``MTLDevice.recommendedMaxWorkingSetSize`` (Apple's Metal documentation),
    which llama.cpp's ggml-metal prints at start and lists as the GPU's total
    (``llama-server --list-devices``). Apple does not document how macOS sets it; the rule
    is the one commonly cited, and matches the figures recorded: 10.67 GiB of 16 GiB
    (issue 29), 96 GiB of 128 GiB (an M4 Max's listing, ardanlabs/kronk#10, in
    ``tests/data/list_devices/metal_m4_max.txt``; GPUStack#1375: "75% of total RAM").
    Newer macOS releases give more (107.5 GiB of 128 GiB, about 84 %, antirez/ds4#893), and
    ``sysctl iogpu.wired_limit_mb`` raises it: the rule is the low end, used only where no
    probe lists the GPU and the fleet file declares no share.
    """
    if memory_bytes <= METAL_TWO_THIRDS_UP_TO_BYTES:
        return memory_bytes * 2 // 3
    return memory_bytes * 3 // 4


def with_default_gpu_shares(fleet: Fleet, flavors: Collection[InferFlavor]) -> Fleet:
    """``fleet`` with a default GPU share on each Mac node (``macos-arm64``) that declares
    none, where one of ``flavors`` (the roster's) runs on a Mac's GPU (``DeviceUse``
    ``GPU_SHARE``: mlx_lm, or ``ANY_DEVICE``: llama.cpp) and the node runs it: a device
    :data:`METAL_DEVICE` of :func:`metal_default_share_bytes` of the node's memory,
    ``default_share`` set.

    Every ``mlx_lm.server`` wires its arrays for Metal, and several of them together over
    Metal's cap hang the Mac or panic its kernel (mlx-lm#883); llama-server on a Mac
    offloads every layer to Metal by default (its ``-ngl`` defaults to all layers there), so
    its roles wire the same memory. The share holds both kinds to it as a declared one does
    (a llama.cpp role is pinned to it: ``--device MTL0 -ngl 999 --fit off``). Other nodes,
    and every node of a roster without such roles (ollama alone), are returned unchanged,
    so their plans, loads and launches are as before.
    """
    on_metal = {f for f in flavors if f.facts.devices is not DeviceUse.NONE}
    nodes = []
    for node in fleet.nodes:
        if (
            node.platform is Platform.MACOS_ARM64
            and not any(d.gpu_share for d in node.devices)
            and on_metal & node.flavors
        ):
            share = DeviceSpec(
                id=METAL_DEVICE,
                memory_bytes=metal_default_share_bytes(node.memory_bytes),
                gpu_share=True,
                default_share=True,
            )
            node = replace(node, devices=(*node.devices, share))
        nodes.append(node)
    return replace(fleet, nodes=tuple(nodes))
