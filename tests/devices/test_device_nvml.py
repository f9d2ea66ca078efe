"""NVML through nvidia-ml-py: read with a stand-in module (tests/support/nvml_stand_in.py) for the
NVIDIA GPU this machine lacks, and, without one, the real import degrading cleanly."""

from __future__ import annotations

from types import ModuleType
from typing import cast

from rosterd.devices.nvml import read_nvml
from support.nvml_stand_in import StandInGpu, StandInNvml

GiB = 1 << 30


def _module(stand_in: StandInNvml) -> ModuleType:
    return cast(ModuleType, stand_in)


def test_each_gpu_gives_total_free_used_and_each_process_its_bytes() -> None:
    stand_in = StandInNvml(
        [
            StandInGpu("NVIDIA H200", 141 * GiB, 10 * GiB, "00000000:1B:00.0", {401: 6 * GiB}),
            StandInGpu("NVIDIA H200", 141 * GiB, 0, "00000000:2B:00.0"),
        ]
    )
    reading = read_nvml(_module(stand_in))
    assert reading.unavailable is None
    first, second = reading.devices
    assert (first.cuda_id, first.total_bytes, first.free_bytes, first.used_bytes) == (
        "CUDA0",
        141 * GiB,
        131 * GiB,
        10 * GiB,
    )
    assert first.processes == {401: 6 * GiB}
    assert first.pci_bus_id == "00000000:1B:00.0"
    assert second.cuda_id == "CUDA1"
    assert second.processes == {}
    assert not stand_in.open, "NVML is shut down after the read"


def test_memory_of_other_processes_is_what_rosterd_does_not_own() -> None:
    gpu = StandInGpu("NVIDIA RTX 4090", 24 * GiB, 9 * GiB, "0:1:0.0", {7: 6 * GiB, 8: None})
    (device,) = read_nvml(_module(StandInNvml([gpu]))).devices
    # pid 7 is rosterd's backend; the rest (pid 8 unattributed, the driver) is others'.
    assert device.others_bytes(frozenset({7})) == 3 * GiB
    assert device.others_bytes(frozenset()) == 9 * GiB
    assert device.processes[8] == 0


def test_no_driver_is_an_empty_reading_with_the_reason() -> None:
    reading = read_nvml(_module(StandInNvml([], init_error="Driver Not Loaded")))
    assert reading.devices == ()
    assert reading.unavailable is not None
    assert "Driver Not Loaded" in reading.unavailable


def test_the_real_module_on_a_machine_without_a_gpu_degrades_cleanly() -> None:
    reading = read_nvml()
    # This machine has no NVIDIA GPU (or nvidia-ml-py is absent): never an exception.
    if reading.devices:
        assert reading.unavailable is None
    else:
        assert reading.unavailable
