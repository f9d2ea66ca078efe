"""On a Mac node with a GPU share, each backend's physical footprint (``phys_footprint``)
goes to the node with its peak as what the role holds in the share (``MTL0``), and past the
count there by more than 10 % the share counts it, with one warning. This machine is not a
Mac: a stand-in for libproc's ``proc_pid_rusage`` gives the footprints, and the node is a
stand-in that shows its pools and backends' pids as a node scheduler's snapshot does."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from rosterd.devices.footprint import RusageInfoV4, read_phys_footprints
from rosterd.devices.nvml import NvmlReading
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import (
    PeakRecorder,
    footprint_device_bytes,
    largest_device_bytes,
    nvml_device_bytes,
)
from rosterd.scheduler.events import LogNote, MeasuredPeak
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import DevicePool
from support.node_bench import LIMITS, MIB, Bench, spec

#: What each backend's process holds by macOS's ledger, MiB: writer (mlx_lm, pid 501)
#: 700 MiB wired by Metal, chat (llama.cpp, pid 502) 380 MiB.
FOOTPRINTS_MIB = {501: 700, 502: 380}


def _libproc(pid: int, flavor: int, buffer: ctypes._Pointer[RusageInfoV4], /) -> int:
    """Stands in for macOS's proc_pid_rusage (this machine is Linux): the footprints above."""
    if pid not in FOOTPRINTS_MIB:
        return -1
    buffer.contents.ri_phys_footprint = FOOTPRINTS_MIB[pid] * MIB
    return 0


def _read(pids: Sequence[int]) -> dict[int, int]:
    return read_phys_footprints(pids, _libproc)


class _MacNode:
    """A node scheduler as the recorder and the readers see it: its snapshot's pools and
    roles' pids, and what it was told with each peak (``measured_peak``)."""

    name = "air"

    def __init__(self, pools: Sequence[str]) -> None:
        self.pools: dict[str, dict[str, object]] = {p: {} for p in pools}
        self.roles = {"writer": SimpleNamespace(pid=501), "chat": SimpleNamespace(pid=502)}
        self.told: list[MeasuredPeak] = []
        self.listeners: list[object] = []

    def snapshot(self) -> SimpleNamespace:
        return SimpleNamespace(pools=self.pools, roles=self.roles)

    def measured_peak(
        self, role: str, peak: int, run_peak: int, device_bytes: Mapping[str, int] | None = None
    ) -> None:
        self.told.append(MeasuredPeak(0.0, role, peak, run_peak, dict(device_bytes or {})))


class _Peaks:
    async def peak_rss_bytes(self) -> dict[str, int]:
        return {"writer": 100 * MIB, "chat": 300 * MIB}  # RSS: Metal's memory not in it


def _recorder(node: _MacNode, tmp_path: Path) -> PeakRecorder:
    scheduler = cast(NodeScheduler, node)
    return PeakRecorder(
        scheduler,
        _Peaks(),
        MeasuredPeaks(tmp_path),
        {"writer": "w1", "chat": "c1"},
        # As `up` composes them for this machine's backends: NVML (no GPU on a Mac) and the
        # footprint, each its own reader.
        device_bytes=largest_device_bytes(
            nvml_device_bytes(scheduler, lambda: NvmlReading((), "no NVIDIA GPU on a Mac")),
            footprint_device_bytes(scheduler, _read),
        ),
    )


async def test_each_backends_footprint_goes_to_the_node_as_held_in_the_share(
    tmp_path: Path,
) -> None:
    node = _MacNode(["host", "MTL0"])
    await _recorder(node, tmp_path).record()
    assert [(m.role, m.peak_bytes, m.device_bytes) for m in node.told] == [
        ("chat", 300 * MIB, {"MTL0": 380 * MIB}),
        ("writer", 100 * MIB, {"MTL0": 700 * MIB}),
    ]
    # An older build's name for the Mac's GPU is the same share.
    older = _MacNode(["host", "Metal"])
    await _recorder(older, tmp_path).record()
    assert older.told[1].device_bytes == {"Metal": 700 * MIB}


async def test_a_node_without_a_macs_share_reads_no_footprint(tmp_path: Path) -> None:
    asked: list[Sequence[int]] = []

    def read(pids: Sequence[int]) -> dict[int, int]:
        asked.append(pids)
        return _read(pids)

    for pools in (["host"], ["host", "CUDA0"]):
        node = _MacNode(pools)
        held = await footprint_device_bytes(cast(NodeScheduler, node), read)()
        assert held == {}
    assert asked == []


async def test_a_footprint_past_the_count_in_the_share_is_counted_there_with_one_warning(
    tmp_path: Path,
) -> None:
    node = _MacNode(["host", "MTL0"])
    recorder = _recorder(node, tmp_path)
    await recorder.record()
    await recorder.record()
    # The node machine, as the plan placed both in a 1000 MiB share: writer counted 400 MiB
    # there (its footprint, 700 MiB, passes it by 75 %), chat 400 MiB (380: within).
    bench = Bench([spec("writer", 100, sticky=False), spec("chat", 300, sticky=False)], 10_240)
    share = DevicePool(1000 * MIB, {"writer": 400 * MIB, "chat": 400 * MIB})
    bench.machine = NodeMachine(bench.capacity, bench.specs, LIMITS, devices={"MTL0": share})
    for measured in node.told:
        bench.send(measured)
    warnings = [n.message for n in bench.of(LogNote) if "on device" in n.message]
    assert warnings == [
        "role writer holds 700 MiB on device MTL0, 75% more than the 400 MiB counted for it "
        "there; counting what it holds from now on"
    ]
    assert bench.machine.state.pools_view()["MTL0"]["roles"] == {
        "chat": 400 * MIB,
        "writer": 700 * MIB,
    }
