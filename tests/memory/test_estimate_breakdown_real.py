"""The per-pool estimate against llama-server's own memory breakdown, for the example's gemma
on this machine's CPU (the host is its only pool): each part within 5 %."""

from __future__ import annotations

from pathlib import Path

import httpx

from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.devices.breakdown import parse_memory_breakdown
from rosterd.memory.estimate import MiB
from rosterd.model_facts.reader import read_model_facts
from rosterd.supervisor import Supervisor
from rosterd.weights import ResolvedWeights
from support.specs import GEMMA_CHAT_SMALL

THREADS = ("-t", "2")
#: llama-server logs its memory breakdown at trace level (``LOG_TRC``, ``common/fit.cpp``).
TRACE = ("-lv", "4")


async def test_gemma_host_split_matches_llama_servers_breakdown(
    tmp_path: Path, gemma_gguf: Path, llama_server_binary: Path, free_port: int
) -> None:
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    spec = GEMMA_CHAT_SMALL
    weights = ResolvedWeights(
        path=gemma_gguf, ctx_size=4096, parallel=1, extra_args=(*THREADS, *TRACE)
    )
    launch = adapter.launch(spec, weights, host="127.0.0.1", port=free_port)
    state = tmp_path / "state"
    sup = Supervisor(state, grace_s=20.0)
    try:
        backend = await sup.start("chat-small", launch, ready_timeout_s=120)
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.post(
                backend.base_url + "/v1/completions",
                json={"model": "gemma-3-270m", "prompt": "The sea is", "max_tokens": 8},
            )
            answer.raise_for_status()
        await sup.stop("chat-small")  # SIGTERM: llama-server prints its breakdown on the way out
    finally:
        await sup.stop_all()
    log = "\n".join(p.read_text(errors="replace") for p in (state / "logs").glob("chat-small*"))
    rows = parse_memory_breakdown(log)
    assert "Host" in rows, log[-2000:]
    # The host's buffers: the Host row and the other host-side buffer types llama-server
    # lists apart (the CPU backend's repacked weights, CPU_REPACK), none with a total.
    host_rows = [r for r in rows.values() if r.total_bytes is None]
    print(
        "llama-server's breakdown:",
        {r.name: (r.model_bytes, r.context_bytes, r.compute_bytes) for r in host_rows},
    )
    split = adapter.split_memory(
        read_model_facts(gemma_gguf),
        ctx_size=4096,
        parallel=1,
        extra_args=THREADS,
        gpu_layers=0,
    )
    assert split.device_bytes == 0
    pairs = {
        "model": (split.host_model_bytes, sum(r.model_bytes for r in host_rows)),
        "context": (split.host_context_bytes, sum(r.context_bytes for r in host_rows)),
        "compute": (split.host_compute_bytes, sum(r.compute_bytes for r in host_rows)),
        "self": (
            split.host_model_bytes + split.host_context_bytes + split.host_compute_bytes,
            sum(r.self_bytes for r in host_rows),
        ),
    }
    shown = {k: f"{e / MiB:.1f} vs {m / MiB:.0f} MiB" for k, (e, m) in pairs.items()}
    print(f"gemma-3-270m on the CPU, estimate vs llama-server's breakdown: {shown}")
    for part, (estimated, reported) in pairs.items():
        # The breakdown prints whole MiB (floored) per row: allow a MiB a row on top of 5 %.
        assert abs(estimated - reported) <= 0.05 * reported + MiB * len(host_rows), (part, shown)
