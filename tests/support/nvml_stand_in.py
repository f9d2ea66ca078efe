"""A stand-in for ``pynvml`` (nvidia-ml-py): it stands in for an NVIDIA GPU and driver this
machine lacks, answering the NVML calls rosterd.devices.nvml makes with the figures a test
gives. Its shapes follow nvidia-ml-py: ``nvmlDeviceGetMemoryInfo`` returns an object with
``total``, ``free`` and ``used`` bytes; running processes have ``pid`` and
``usedGpuMemory`` (``None`` where the driver cannot attribute it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    """As ``pynvml.NVMLError``."""


@dataclass
class StandInGpu:
    name: str
    total: int
    used: int
    bus_id: str
    processes: dict[int, int | None] = field(default_factory=dict)


class StandInNvml:
    """Module-like object: pass it where ``pynvml`` is expected."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[StandInGpu], *, init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.open = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.open = True

    def nvmlShutdown(self) -> None:
        self.open = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: StandInGpu) -> str:
        return gpu.name

    def nvmlDeviceGetPciInfo(self, gpu: StandInGpu) -> SimpleNamespace:
        return SimpleNamespace(busId=gpu.bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, gpu: StandInGpu) -> SimpleNamespace:
        return SimpleNamespace(total=gpu.total, used=gpu.used, free=gpu.total - gpu.used)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: StandInGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in gpu.processes.items()]
