"""NVIDIA GPUs' memory through NVML, read with ``nvidia-ml-py`` (NVIDIA's own binding,
module ``pynvml``), where it loads (layer 2: reading is the only I/O).

:func:`read_nvml` gives, per GPU, its total, free and used bytes and each process's used
bytes (``nvmlDeviceGetComputeRunningProcesses``), so rosterd can tell the memory its own
backends hold on a device from the memory other processes hold, which lowers what
rosterd may use there (GPUStack#6044 is what ignoring it costs). Where the module, the
library or the driver is missing (every machine without an NVIDIA GPU), it returns
``None`` with the reason and never raises.

Device ids: NVML numbers GPUs in PCI bus order; CUDA (and so llama.cpp's ``CUDA0``...)
numbers them fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. ``NvmlDevice.pci_bus_id``
is kept so a caller can match the two by bus id (``--list-devices-format json`` gives it);
``cuda_id`` assumes the PCI order, which is what rosterd sets for the backends it starts.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType


@dataclass(frozen=True, slots=True)
class NvmlDevice:
    """One GPU as NVML reads it: ``index`` (NVML's, PCI order), ``name``, ``pci_bus_id``,
    memory in bytes, and ``processes``: pid -> bytes that process holds on this GPU (a
    process NVML reports without a figure counts 0)."""

    index: int
    name: str
    pci_bus_id: str
    total_bytes: int
    free_bytes: int
    used_bytes: int
    processes: Mapping[int, int] = field(default_factory=dict, hash=False)

    @property
    def cuda_id(self) -> str:
        """llama.cpp's name for this GPU under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``: ``CUDA<index>``."""
        return f"CUDA{self.index}"

    def others_bytes(self, own_pids: frozenset[int]) -> int:
        """Bytes on this GPU held by processes not in ``own_pids`` (rosterd's backends):
        ``used`` less what rosterd's own processes hold, so the driver's own reserve and
        processes NVML cannot attribute count as others'."""
        own = sum(b for pid, b in self.processes.items() if pid in own_pids)
        return max(self.used_bytes - own, 0)


@dataclass(frozen=True, slots=True)
class NvmlReading:
    """What one NVML read found: ``devices`` in NVML order, or none with ``unavailable``
    saying why (no module, no library, no driver, no GPU)."""

    devices: tuple[NvmlDevice, ...]
    unavailable: str | None = None


def read_nvml(module: ModuleType | None = None) -> NvmlReading:
    """Read every NVIDIA GPU's memory and per-process use.

    ``module`` is ``pynvml`` (imported when not given; tests pass a stand-in). Never
    raises for a machine without NVIDIA's driver: the reading is empty and says why.
    """
    if module is None:
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            return NvmlReading((), "nvidia-ml-py is not installed")
    nvml_error: type[BaseException] = getattr(module, "NVMLError", Exception)
    try:
        module.nvmlInit()
    except (nvml_error, OSError) as err:
        return NvmlReading((), f"NVML did not start: {err}")
    try:
        devices = tuple(_device(module, i) for i in range(module.nvmlDeviceGetCount()))
    except nvml_error as err:
        return NvmlReading((), f"NVML could not be read: {err}")
    finally:
        with contextlib.suppress(nvml_error):
            module.nvmlShutdown()
    return NvmlReading(devices, None if devices else "NVML found no GPU")


def _device(module: ModuleType, index: int) -> NvmlDevice:
    handle = module.nvmlDeviceGetHandleByIndex(index)
    memory = module.nvmlDeviceGetMemoryInfo(handle)
    name = module.nvmlDeviceGetName(handle)
    bus = module.nvmlDeviceGetPciInfo(handle).busId
    processes: dict[int, int] = {}
    for proc in module.nvmlDeviceGetComputeRunningProcesses(handle):
        used = proc.usedGpuMemory
        processes[int(proc.pid)] = processes.get(int(proc.pid), 0) + (
            int(used) if isinstance(used, int) else 0
        )
    return NvmlDevice(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        pci_bus_id=bus.decode() if isinstance(bus, bytes) else str(bus),
        total_bytes=int(memory.total),
        free_bytes=int(memory.free),
        used_bytes=int(memory.used),
        processes=processes,
    )


def held_by_roles(reading: NvmlReading, pids: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Role -> device id (``CUDA<index>``) -> bytes its backend's process holds there, from
    ``reading``'s per-process figures; ``pids``: role -> its backend's pid. A role NVML
    reports nothing for is left out (it holds nothing on any GPU)."""
    role_of = {pid: role for role, pid in pids.items()}
    held: dict[str, dict[str, int]] = {}
    for device in reading.devices:
        for pid, n_bytes in device.processes.items():
            role = role_of.get(pid)
            if role is not None:
                held.setdefault(role, {})[device.cuda_id] = n_bytes
    return held
