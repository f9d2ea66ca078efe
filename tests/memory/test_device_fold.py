"""What each llama.cpp backend's log says it allocated per device is folded into its node's
count per pool at run time, beside NVML's per-process figure (issue 29, item 4): the pool
counts the larger of the two, and a figure past the count by more than 10 % is counted from
then on, with the host's warning.

This machine has no GPU, so the node's devices are declared (a declared device no probe sees
is used as declared), NVML is its stand-in module (``support.nvml_stand_in``, put where
``pynvml`` is imported), and each backend's log is a stand-in: a file written as the
supervisor writes one (a header line, then the backend's output) holding the load lines a
CUDA and a ROCm build logged (``tests/data/load_buffers/``), read by the same functions as a
real backend's. The node scheduler, the recorder and its wiring (``follow_peaks``) are real.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rosterd.backends.values import Endpoint
from rosterd.devices.load_buffers import parse_load_report
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import follow_peaks
from rosterd.scheduler.values import DevicePool
from rosterd.supervisor import latest_run_output
from support.node_loop import MIB, GatedBackends, make_node, spec, use
from support.nvml_stand_in import StandInGpu, StandInNvml
from support.polling import eventually

DATA = Path(__file__).resolve().parents[1] / "data" / "load_buffers"
GiB = 1 << 30
#: The pids the stand-in backends' processes have (NVML's stand-in attributes memory by pid).
PIDS = {"chat": 4242, "code": 4343}


class LoggedBackends(GatedBackends):
    """Backends of this machine whose processes are stand-ins: each role's log is a file
    under ``logs`` written as the supervisor writes one, each peak RSS 100 MiB."""

    pids_are_local = True

    def __init__(self, logs: Path, outputs: dict[str, str]) -> None:
        super().__init__()
        self.logs = logs
        for role, output in outputs.items():
            older = f"--- rosterd: starting {role} at 2026-01-01T00:00:00+0000: old run\n"
            header = f"--- rosterd: starting {role} at 2026-01-02T00:00:00+0000: llama-server\n"
            # an earlier run of the role, which allocated less: only the latest run counts
            earlier = "llama_kv_cache:      CUDA0 KV buffer size =  9999.00 MiB\n"
            (logs / f"{role}.log").write_text(older + earlier + header + output)

    async def start(self, role: str) -> Endpoint:
        await super().start(role)
        return Endpoint(f"http://127.0.0.1:1/{role}", role, PIDS[role])

    async def peak_rss_bytes(self) -> dict[str, int]:
        return {role: 100 * MIB for role in self.starts}

    async def reported_device_bytes(self) -> dict[str, dict[str, int]]:
        reports = {
            role: parse_load_report(latest_run_output(self.logs / f"{role}.log", role))
            for role in self.starts
        }
        return {role: r.device_bytes() for role, r in reports.items() if r.device_bytes()}


@pytest.fixture
def gpu_of_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's stand-in: one GPU on which chat's process holds 500 MiB."""
    gpu = StandInGpu("NVIDIA H200", 141 * GiB, GiB, "00:1B.0", {PIDS["chat"]: 500 * MIB})
    monkeypatch.setitem(sys.modules, "pynvml", StandInNvml([gpu]))


async def test_the_logs_figure_per_device_is_counted_with_one_warning_past_the_count(
    tmp_path: Path, gpu_of_chat: None, caplog: pytest.LogCaptureFixture
) -> None:
    # chat: CUDA0, counted 400 MiB; NVML reads 500 MiB of its process, its log 700 MiB.
    # code: ROCm0 (no NVML there), counted 4 GiB; its log (recorded on ROCm) 4659 MiB.
    chat_log = "load_tensors:        CUDA0 model buffer size =   700.00 MiB\n"
    code_log = (DATA / "rocm_issue11337.txt").read_text(encoding="utf-8")
    backends = LoggedBackends(tmp_path, {"chat": chat_log, "code": code_log})
    devices = {
        "CUDA0": DevicePool(GiB, {"chat": 400 * MIB}),
        "ROCm0": DevicePool(24 * GiB, {"code": 4 * GiB}),
    }
    node, _ = make_node(
        [spec("chat", 100), spec("code", 100)], 10_240, backends=backends, devices=devices
    )
    await use(node, "chat")
    await use(node, "code")
    caplog.set_level(logging.WARNING, logger="rosterd")
    (recorder,) = follow_peaks(
        {"n1": node}, {"n1": backends}, [], {}, MeasuredPeaks(tmp_path / "state")
    )
    try:
        await recorder.record()

        def counted() -> dict[str, object]:
            pools = node.snapshot().pools
            return {device: pools[device]["roles"] for device in ("CUDA0", "ROCm0")}

        expected = {"CUDA0": {"chat": 700 * MIB}, "ROCm0": {"code": (4352 + 307) * MIB}}
        await eventually(lambda: counted() == expected, what="the logs' figures", timeout_s=5)
        await recorder.record()  # read again: the same figures, no second warning
    finally:
        await recorder.finish()
        await node.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "on device" in r.getMessage()]
    assert warnings == [
        "node n1: role chat holds 700 MiB on device CUDA0, 75% more than the 400 MiB counted "
        "for it there; counting what it holds from now on",
        "node n1: role code holds 4659 MiB on device ROCm0, 14% more than the 4096 MiB "
        "counted for it there; counting what it holds from now on",
    ]


async def test_nvmls_figure_counts_where_it_is_the_larger(
    tmp_path: Path, gpu_of_chat: None
) -> None:
    # The log does not count the GPU runtime's context, which NVML does: NVML's 500 MiB
    # wins over the log's 300 MiB.
    chat_log = "load_tensors:        CUDA0 model buffer size =   300.00 MiB\n"
    backends = LoggedBackends(tmp_path, {"chat": chat_log})
    devices = {"CUDA0": DevicePool(GiB, {"chat": 400 * MIB})}
    node, _ = make_node([spec("chat", 100)], 10_240, backends=backends, devices=devices)
    await use(node, "chat")
    (recorder,) = follow_peaks(
        {"n1": node}, {"n1": backends}, [], {}, MeasuredPeaks(tmp_path / "state")
    )
    try:
        await recorder.record()
        await eventually(
            lambda: node.snapshot().pools["CUDA0"]["roles"] == {"chat": 500 * MIB},
            what="NVML's figure counted",
            timeout_s=5,
        )
    finally:
        await recorder.finish()
        await node.shutdown()
