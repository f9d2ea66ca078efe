"""Measured peaks persist in the state folder across store instances (so the next `up` starts
from them), per node and role, by atomic writes; damaged files are ignored with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import cast

import pytest

from rosterd.backends.interface import RoleBackends
from rosterd.devices.nvml import held_by_roles, read_nvml
from rosterd.errors import MeasuredPeaksError
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import PeakRecorder
from rosterd.scheduler.node import NodeScheduler
from rosterd.supervisor import process_tree_peak_rss_bytes
from support.nvml_stand_in import StandInGpu, StandInNvml


def test_peaks_survive_a_new_store(tmp_path: Path) -> None:
    first = MeasuredPeaks(tmp_path)
    first.record("mac1", "chat", 4_000_000_000, measured_at_s=100.0, fingerprint="c4096")
    first.record("mac1", "voice", 300_000_000, measured_at_s=101.0)
    first.record("box2", "chat", 5_000_000_000, measured_at_s=102.0)

    second = MeasuredPeaks(tmp_path)
    assert second.peak_bytes("mac1", "chat") == 4_000_000_000
    assert second.peak_bytes("mac1", "voice") == 300_000_000
    assert second.peak_bytes("box2", "chat") == 5_000_000_000
    assert second.peak_bytes("box2", "voice") is None
    assert second.peak_bytes("mac1", "chat", fingerprint="c4096") == 4_000_000_000
    assert second.peak_bytes("mac1", "chat", fingerprint="c8192") is None  # other settings
    assert second.for_node("mac1")["voice"].measured_at_s == 101.0
    assert second.warnings == ()
    assert (tmp_path / "memory" / "mac1.json").is_file()


def test_the_last_run_replaces_the_one_before(tmp_path: Path) -> None:
    store = MeasuredPeaks(tmp_path)
    store.record("n", "chat", 900, measured_at_s=1.0)
    store.record("n", "chat", 700, measured_at_s=2.0)
    assert MeasuredPeaks(tmp_path).peak_bytes("n", "chat") == 700


def test_no_temporary_files_are_left(tmp_path: Path) -> None:
    store = MeasuredPeaks(tmp_path)
    for i in range(5):
        store.record("n", f"r{i}", i, measured_at_s=float(i))
    assert sorted(os.listdir(tmp_path / "memory")) == ["n.json"]


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": 99, "roles": {}}', b'{"version": 1}', b"\xff\xfe"],
)
def test_a_damaged_file_is_ignored_with_a_warning(tmp_path: Path, content: bytes) -> None:
    folder = tmp_path / "memory"
    folder.mkdir()
    (folder / "n.json").write_bytes(content)
    store = MeasuredPeaks(tmp_path)
    assert store.peak_bytes("n", "chat") is None
    assert len(store.warnings) == 1
    assert "n.json" in store.warnings[0]
    assert "ignored" in store.warnings[0]
    store.record("n", "chat", 5, measured_at_s=0.0)  # the next measurement replaces it
    assert MeasuredPeaks(tmp_path).peak_bytes("n", "chat") == 5


def test_a_bad_entry_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    folder = tmp_path / "memory"
    folder.mkdir()
    document = {
        "version": 1,
        "roles": {"good": {"peak_rss_bytes": 10}, "bad": {"peak_rss_bytes": "lots"}},
    }
    (folder / "n.json").write_text(json.dumps(document))
    store = MeasuredPeaks(tmp_path)
    assert store.peak_bytes("n", "good") == 10
    assert store.peak_bytes("n", "bad") is None
    assert any("bad" in w for w in store.warnings)


def test_names_that_are_not_tokens_never_name_a_file(tmp_path: Path) -> None:
    store = MeasuredPeaks(tmp_path)
    with pytest.raises(MeasuredPeaksError, match="plain token"):
        store.record("../etc", "chat", 1, measured_at_s=0.0)
    with pytest.raises(MeasuredPeaksError, match="plain token"):
        store.record("n", "a/b", 1, measured_at_s=0.0)
    with pytest.raises(MeasuredPeaksError, match="negative"):
        store.record("n", "chat", -1, measured_at_s=0.0)


def test_peak_of_a_process_tree_counts_its_high_water_mark() -> None:
    # A child that touches 64 MiB, frees it, then waits: its peak stays above what it holds.
    code = (
        "import sys, time\n"
        "b = bytearray(64 << 20)\n"
        "for i in range(0, len(b), 4096): b[i] = 1\n"
        "del b\n"
        "print('ok', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ok"
        peak = process_tree_peak_rss_bytes(proc.pid)
        assert peak is not None
        if sys.platform.startswith("linux"):
            assert peak >= 64 << 20
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert process_tree_peak_rss_bytes(proc.pid) is None


class _Peaks:
    """A node's backends as the recorder sees them (``PeakSource``): role -> peak bytes."""

    def __init__(self, peaks: dict[str, int]) -> None:
        self.peaks = peaks

    async def peak_rss_bytes(self) -> dict[str, int]:
        return dict(self.peaks)


async def test_after_a_reload_each_peak_is_stored_under_the_settings_it_ran_with(
    tmp_path: Path,
) -> None:
    node = NodeScheduler("box", 2**30, {}, cast(RoleBackends, object()))
    store = MeasuredPeaks(tmp_path)
    before = _Peaks({"chat": 400, "voice": 100})
    recorder = PeakRecorder(node, before, store, {"chat": "ctx4096", "voice": "v1"})
    await recorder.record()
    # A reload raised chat's ctx_size: new backends, a new fingerprint. Until the new
    # backends start chat, its old run (still going) is stored under the old settings.
    after = _Peaks({})
    recorder.add_source(after, {"chat": "ctx8192", "voice": "v1"})
    before.peaks["chat"] = 450
    await recorder.record()
    assert store.peak_bytes("box", "chat", fingerprint="ctx4096") == 450
    # The old run stopped; the new backends started chat: the newest run counts, under
    # its own settings, even when it is smaller.
    after.peaks["chat"] = 300
    await recorder.record()
    fresh = MeasuredPeaks(tmp_path)
    assert fresh.peak_bytes("box", "chat", fingerprint="ctx8192") == 300
    assert fresh.peak_bytes("box", "chat", fingerprint="ctx4096") is None
    # voice kept its settings: the largest of this up, whichever backends ran it.
    after.peaks["voice"] = 80
    await recorder.record()
    assert MeasuredPeaks(tmp_path).peak_bytes("box", "voice", fingerprint="v1") == 100


class _Node:
    """The node as the recorder tells it (``measured_peak``): what it was told, in order."""

    name = "box"

    def __init__(self) -> None:
        self.told: list[tuple[str, int, int, Mapping[str, int] | None]] = []
        self.listeners: list[object] = []

    def measured_peak(
        self, role: str, peak: int, run_peak: int, device_bytes: Mapping[str, int] | None = None
    ) -> None:
        self.told.append((role, peak, run_peak, device_bytes))


async def test_what_a_backend_holds_on_each_gpu_goes_to_the_node_with_its_peak(
    tmp_path: Path,
) -> None:
    # NVML through a stand-in: this machine has no GPU. chat's backend (pid 401) holds
    # 6 GiB on the first GPU, another process 2 GiB that is nobody's role.
    gib = 2**30
    gpu = StandInGpu("NVIDIA H200", 141 * gib, 8 * gib, "00:1B.0", {401: 6 * gib, 7: 2 * gib})
    nvml = cast(ModuleType, StandInNvml([gpu]))
    held = held_by_roles(read_nvml(nvml), {"chat": 401, "voice": 402})
    assert held == {"chat": {"CUDA0": 6 * gib}}
    node = _Node()

    async def held_now() -> dict[str, dict[str, int]]:
        return held

    recorder = PeakRecorder(
        cast(NodeScheduler, node),
        _Peaks({"chat": 400, "voice": 100}),
        MeasuredPeaks(tmp_path),
        {"chat": "c1", "voice": "v1"},
        device_bytes=held_now,
    )
    await recorder.record()
    assert node.told == [("chat", 400, 400, {"CUDA0": 6 * gib}), ("voice", 100, 100, None)]
