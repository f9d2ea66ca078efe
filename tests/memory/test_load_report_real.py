"""What a running llama-server logged allocating as it loaded, read from its log by the local
backends (``SupervisorBackends.load_reports``), for the example's gemma on this machine's CPU:
its host buffers match the per-pool estimate's host parts within 5 %, and nothing is on a
device (this machine has none), so nothing is folded into a device's pool.

This build logs these lines at trace level only: the role runs with ``-lv 4``, as rosterd
runs a role pinned to a device (``LOAD_REPORT_ARGS``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rosterd.adapters.llamacpp import LOAD_REPORT_ARGS, LlamaCppAdapter
from rosterd.backends.local import SupervisorBackends
from rosterd.memory.estimate import MiB
from rosterd.model_facts.reader import read_model_facts
from rosterd.supervisor import Supervisor
from rosterd.weights import ResolvedWeights
from support.specs import GEMMA_CHAT_SMALL

THREADS = ("-t", "2")


@pytest.mark.parametrize("copy", [False, True], ids=["role", "copy"])
async def test_gemmas_logged_host_buffers_match_the_estimates_host_parts(
    tmp_path: Path, gemma_gguf: Path, llama_server_binary: Path, copy: bool
) -> None:
    # copy: the role's copy on node "box" of a role with replicas, whose process and log
    # are named chat-small@box: its load lines are read from that log.
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    spec = GEMMA_CHAT_SMALL
    weights = ResolvedWeights(
        path=gemma_gguf, ctx_size=4096, parallel=1, extra_args=(*THREADS, *LOAD_REPORT_ARGS)
    )
    sup = Supervisor(tmp_path / "state", grace_s=20.0)
    backends = SupervisorBackends(
        sup,
        {"chat-small": spec},
        host="127.0.0.1",
        resolve_weights=lambda _: weights,
        auto_ports=True,
        ready_timeout_s=120,
        adapters=lambda _: adapter,
        node="box",
        names_copies=(lambda _: True) if copy else None,
    )
    try:
        await backends.start("chat-small")
        reports = await backends.load_reports()
        on_devices = await backends.reported_device_bytes()
        name = backends.backend_name("chat-small")
        assert name == ("chat-small@box" if copy else "chat-small")
        pid = sup.backend(name).pid  # type: ignore[union-attr]
        assert await backends.load_reports() == reports  # read once per process
    finally:
        await sup.stop_all()
    assert on_devices == {}  # a CPU-only machine: host buffers alone
    report = reports["chat-small"]
    assert report.buffers, f"no load lines in the log of pid {pid}"
    split = adapter.split_memory(
        read_model_facts(gemma_gguf), ctx_size=4096, parallel=1, extra_args=THREADS, gpu_layers=0
    )
    pairs = {
        "model": (split.host_model_bytes, report.host_bytes("model")),
        "context": (split.host_context_bytes, report.host_bytes("KV", "RS")),
        "compute": (split.host_compute_bytes, report.host_bytes("compute")),
    }
    shown = {k: f"{e / MiB:.1f} vs {r / MiB:.2f} MiB" for k, (e, r) in pairs.items()}
    print(f"gemma-3-270m on the CPU, estimate vs llama-server's load lines: {shown}")
    for part, (estimated, reported) in pairs.items():
        assert abs(estimated - reported) <= 0.05 * reported, (part, shown)
