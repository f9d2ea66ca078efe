"""The fleet's value types: nodes, their platforms and budgets, where weights are (layer 2;
value types, no I/O).

A :class:`Fleet` is the node inventory rosterd plans across plus where each
model's weights are; a :class:`Node` is one machine with its memory budget
(``capacity_bytes``), :class:`Platform`, flavors and the accelerator devices it
declares (:class:`DeviceSpec`, each a memory pool of its own). The fleet file reader
(:mod:`rosterd.fleet.reader`) and the local machine's fleet
(:mod:`rosterd.fleet.local`) build them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rosterd.flavors import Platform
from rosterd.spec import InferFlavor
from rosterd.tokens import GB

#: ``Platform`` is re-exported: a node's platform (defined with the flavors' facts in
#: ``rosterd.flavors``, which say where each flavor runs).
__all__ = [
    "LOAD_PROGRESS_MODES",
    "OFFLOADS",
    "RERANKING_FLAGS",
    "DeviceSpec",
    "Fleet",
    "ModelSource",
    "Node",
    "Platform",
    "default_reserved_bytes",
    "normal_ip",
]

#: llama-server's flag that serves ``/v1/rerank`` and its alias (llama.cpp's
#: ``common/arg.cpp``): in a ``models:`` entry's ``extra_args`` it says ``reranking: true``.
RERANKING_FLAGS: frozenset[str] = frozenset({"--reranking", "--rerank"})


#: A ``models:`` entry's ``offload``: ``full`` (every layer on the role's device, or the
#: role is unplaced) or ``partial`` (the layers that fit, the rest on the CPU).
OFFLOADS: tuple[str, ...] = ("full", "partial")

#: A ``models:`` entry's ``load_progress``: what a streamed request waiting for the role's
#: load gets (``rosterd up --load-progress``'s words; the router's ``LoadProgressMode``).
LOAD_PROGRESS_MODES: tuple[str, ...] = ("ping", "text", "off")


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator device a node declares in the fleet file (a pool of its own).

    ``id`` is llama.cpp's device name (``CUDA0``, ``ROCm0``, ``Vulkan0``, ``MTL0``), the
    name ``llama-server --list-devices`` prints and ``--device`` takes.
    ``memory_bytes``: the device's memory; ``reserved_bytes``: what rosterd leaves free
    on it (the driver's and other work's); ``capacity_bytes`` is the difference. On a Mac
    the device is the GPU's share of unified memory: ``memory_bytes`` is the share's cap
    (Metal's ``recommendedMaxWorkingSetSize``, or ``iogpu.wired_limit_mb`` where raised),
    declared as ``gpu_share_gb`` or as ``gpu_share`` (a fraction of the node's memory).
    ``default_share``: a Mac's GPU share the fleet file does not declare, which rosterd
    gives a Mac whose roster has llama.cpp or mlx_lm roles (``rosterd.devices.pools``:
    Metal's default rule, or the figure a probe lists); both count in it, as in a declared
    share.
    """

    id: str
    memory_bytes: int
    reserved_bytes: int = 0
    gpu_share: bool = False
    default_share: bool = False

    @property
    def capacity_bytes(self) -> int:
        """``memory_bytes - reserved_bytes``: the bytes roles may hold on this device."""
        return self.memory_bytes - self.reserved_bytes


@dataclass(frozen=True)
class Node:
    """One machine of the fleet.

    ``memory_bytes`` is total RAM, ``reserved_bytes`` what rosterd leaves free for the
    OS and other work; ``capacity_bytes`` (memory - reserved) is the budget residency
    and placement count against. ``flavors`` are the adapters it runs; ``address`` is
    where its backends are reached from the router. ``max_concurrency`` is how many
    generations the node runs at once across its roles (``None``: the sum of the
    slots of the roles it holds). ``devices``: the accelerators it declares (none: host
    RAM is its only pool, as on a CPU-only machine).
    """

    name: str
    memory_bytes: int
    reserved_bytes: int
    platform: Platform
    flavors: frozenset[InferFlavor]
    address: str = "127.0.0.1"
    max_concurrency: int | None = None
    # Mappings are left out of the hash (a dict is unhashable); equality still compares them.
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    devices: tuple[DeviceSpec, ...] = ()

    @property
    def capacity_bytes(self) -> int:
        """``memory_bytes - reserved_bytes``: the bytes roles may hold on this node."""
        return self.memory_bytes - self.reserved_bytes


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights are, and how to serve them.

    ``path`` is absolute (relative paths in the fleet file resolve against the file's
    folder); ``ctx_size`` and ``parallel`` are positive or ``None`` (adapter default);
    ``extra_args`` are appended to the backend's argv as given; ``grace_s``: seconds
    from SIGTERM to SIGKILL when its backend stops (``None``: ``rosterd up --grace``);
    ``replicas``: how many copies of the role to place, each on its own node (>= 1).
    ``keep_kv``: save the backend's KV cache when it stops and restore it when it
    starts, where the flavor can (llama.cpp); ``cache_ram_mb``: the backend's RAM
    prompt cache in MiB (llama-server's ``--cache-ram``; ``None``: the adapter's small
    default), which the role's estimate counts. ``reranking``: the role's backend
    serves ``/v1/rerank`` (llama-server's ``--reranking``); ``None``: as the GGUF says (its
    pooling type is rank); ``--reranking`` in ``extra_args`` reranks whatever this says.
    ``offload``: on a node with devices, ``full`` (default: all layers on one device, or
    the role is unplaced with the reason) or ``partial`` (the layers that fit on the
    device, the rest on the CPU, shown in the plan with the layer count).
    ``load_progress``: what a streamed request waiting for the role's load gets, one of
    :data:`LOAD_PROGRESS_MODES` (``None``: ``rosterd up --load-progress``).
    """

    path: Path
    ctx_size: int | None = None
    parallel: int | None = None
    extra_args: tuple[str, ...] = ()
    grace_s: float | None = None
    replicas: int = 1
    keep_kv: bool = True
    cache_ram_mb: int | None = None
    reranking: bool | None = None
    offload: str = "full"
    load_progress: str | None = None


@dataclass(frozen=True)
class Fleet:
    """The node inventory plus where model weights are.

    ``models`` is keyed by roster model name or role id; ``model_roots`` are folders
    searched for weights (default: the fleet file's folder; none for :func:`local_fleet`).
    """

    nodes: tuple[Node, ...]
    models: Mapping[str, ModelSource] = field(default_factory=dict, hash=False)
    model_roots: tuple[Path, ...] = ()

    def node(self, name: str) -> Node:
        """The node called ``name``.

        Raises:
            KeyError: no node has that name.
        """
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def entry_of(self, role: str, model: str | None = None) -> ModelSource | None:
        """``role``'s ``models:`` entry, looked up as the weights are (the role id first, then
        the roster model name), or ``None`` when it has none."""
        for key in (role, model):
            if key is not None and key in self.models:
                return self.models[key]
        return None

    def replicas_of(self, role: str, model: str | None = None) -> int:
        """How many copies of ``role`` to place (>= 1): its ``models:`` entry's ``replicas``
        (:meth:`entry_of`), else 1."""
        entry = self.entry_of(role, model)
        return entry.replicas if entry is not None else 1


def default_reserved_bytes(memory_bytes: int) -> int:
    """The reserve when a node gives no ``reserved_gb``: ``max(10% of memory, 2 GiB)``,
    but at most half the memory.

    The cap keeps small machines usable: a 3 GiB node keeps 1.5 GiB rather than
    2 GiB. Below 2 GiB of memory the reserve is 10% of memory alone (a 2 GiB floor
    would leave nothing). Result in bytes, always below ``memory_bytes``.
    """
    tenth = memory_bytes // 10
    if memory_bytes < 2 * GB:
        return tenth
    return min(max(tenth, 2 * GB), memory_bytes // 2)


def normal_ip(text: str) -> str | None:
    """``text`` as a normalised IP address (``[::1]`` and ``fe80::1%eth0`` too), or ``None``
    if it is not one."""
    try:
        return str(ipaddress.ip_address(text.strip("[]").split("%", 1)[0]))
    except ValueError:
        return None
