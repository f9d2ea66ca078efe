"""What one role needs on a device, and whether a node's devices could ever hold it (layer 3:
pure; no I/O, clock or logging).

Apart from :mod:`rosterd.placement.devices` so that the node planner
(:mod:`rosterd.placement.problem`) can ask which nodes a role's device need rules out
without importing the device planner, which builds on the node plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from rosterd.flavors import DeviceUse
from rosterd.fleet import Node
from rosterd.fleet.model import DeviceSpec
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB


def gb_text(n_bytes: int) -> str:
    """``n_bytes`` in GiB with two decimals, as plans and reasons show memory."""
    return f"{n_bytes / GB:.2f} GiB"


@dataclass(frozen=True)
class DeviceNeed:
    """What one role needs on a device, in bytes.

    ``full_bytes``: every layer offloaded (llama.cpp's ``-ngl 999``; an mlx role: all of
    it). ``by_layers``: the device bytes for ``-ngl 0, 1, ...`` up to every layer and the
    output layer (``rosterd.memory.split.split_llamacpp``), empty when the weights'
    facts are unknown. ``offload``: the fleet entry's ``full`` or ``partial``.
    """

    full_bytes: int
    by_layers: tuple[int, ...] = ()
    offload: str = "full"

    @property
    def layers(self) -> int | None:
        """Repeating layers (``len(by_layers) - 2``), ``None`` when unknown."""
        return len(self.by_layers) - 2 if len(self.by_layers) >= 2 else None


def uses_device(spec: InferenceSpec, node: Node) -> bool:
    """Whether ``spec`` on ``node`` runs on one of its devices (its flavor's ``devices``
    fact, ``rosterd.flavors.DeviceUse``; module docstring)."""
    return bool(node.devices) and bool(devices_for(spec, node))


def device_eligibility(
    spec: InferenceSpec, node: Node, need: DeviceNeed | None
) -> tuple[bool, str]:
    """Whether any device of ``node`` could ever hold ``spec`` alone, and if not why."""
    if not uses_device(spec, node) or need is None:
        return True, ""
    devices = devices_for(spec, node)
    if any(need.full_bytes <= d.capacity_bytes for d in devices) or need.offload == "partial":
        return True, ""
    biggest = max(devices, key=lambda d: d.capacity_bytes)
    return False, (
        f"{node.name}: needs {gb_text(need.full_bytes)} on a device; its largest is "
        f"{biggest.id} with {gb_text(biggest.capacity_bytes)} (capacity = memory - reserved)"
    )


def devices_for(spec: InferenceSpec, node: Node) -> list[DeviceSpec]:
    """The devices of ``node`` that ``spec``'s flavor runs on: every device for a flavor
    that runs on any (llama.cpp: a GPU, or a Mac's GPU share, declared or the default one,
    ``DeviceSpec.default_share``), a Mac's GPU share for one that runs there alone
    (mlx_lm), none for a flavor that sizes its GPU use itself (ollama)."""
    use = spec.flavor.facts.devices
    if use is DeviceUse.ANY_DEVICE:
        return list(node.devices)
    if use is DeviceUse.GPU_SHARE:
        return [d for d in node.devices if d.gpu_share]
    return []


#: How many times a GPU's memory bandwidth a host's is taken to be, for the slowdown of a
#: partial offload: generating a token reads every weight once, so it is bound by memory
#: bandwidth (a 24 GiB GPU reads about 1 TB/s, a desktop's dual-channel DDR5 about 80 to
#: 100 GB/s: about 10x). LM Studio#2431 measured about 3 tok/s instead of 8 for a model
#: mostly on the CPU, within this bound.
GPU_TO_HOST_BANDWIDTH: float = 10.0


def partial_slowdown(gpu_layers: int, layers: int) -> float:
    """How many times slower a role generates with ``gpu_layers`` (llama.cpp's ``-ngl``: the
    output layer, then that many less one of its ``layers`` repeating layers) on the device
    than with every layer there: the layers left on the host are read at host memory
    bandwidth (:data:`GPU_TO_HOST_BANDWIDTH` times slower). An estimate of the bound, not a
    measurement; 1.0 when every layer is on the device or ``layers`` is not positive."""
    if layers <= 0:
        return 1.0
    on_host = min(max(layers - max(gpu_layers - 1, 0), 0), layers) / layers
    return (1 - on_host) + on_host * GPU_TO_HOST_BANDWIDTH
