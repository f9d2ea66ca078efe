"""What keeping a role's KV cache across a swap buys: the first token after the swap, with
and without it, in one run.

    .venv/bin/python bench/kv_bench.py [--sizes 1000,3000,6000] [--ctx 8192]

On the example's Gemma 3 270M (``scripts/prepare-example`` writes it), for each prompt
size (tokens, about): a backend started as ``rosterd up`` starts it (the local
supervisor and :class:`rosterd.backends.local.SupervisorBackends`, with the machine's
:class:`rosterd.backends.kv_keep.KvKeeper`), a cold request of the prompt, then the
swap: the backend stops (saving its slot when the KV is kept) and starts again
(restoring it), and the same prompt is asked once more, streamed. Printed per size:

- **TTFT after the swap**: from the start of the second load to the first streamed
  token, load (and restore) included, kept vs not, and the ratio;
- **prefill**: llama-server's own ``timings.prompt_ms`` of that request, kept vs not;
- the load, save and restore times and the file's size.

The baseline (``keep_kv: false``) runs in the same process on the same file. Everything
it starts is stopped by its own handle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rosterd.backends.kv_keep import KvKeeper  # noqa: E402
from rosterd.backends.local import SupervisorBackends  # noqa: E402
from rosterd.spec import InferenceSpec, InferFlavor  # noqa: E402
from rosterd.supervisor import Supervisor  # noqa: E402
from rosterd.weights import ResolvedWeights  # noqa: E402

GEMMA = ROOT / "examples" / "models" / "gemma-3-270m-q4_k_m.gguf"


def prompt_of(tokens: int) -> str:
    """About ``tokens`` tokens of varied plain text (deterministic)."""
    words = ["red", "lamp", "river", "stone", "amber", "window", "garden", "engine"]
    notes = [f"Note {i}: the {words[i % 8]} {words[(i // 8) % 8]} is {i}." for i in range(tokens)]
    return " ".join(notes)[: int(tokens * 2.43)]


async def stream_ttft(base_url: str, prompt: str) -> tuple[float, dict[str, float]]:
    """Seconds to the first streamed token of ``prompt``, and the last chunk's timings."""
    body = {"prompt": prompt, "n_predict": 4, "stream": True, "temperature": 0.0}
    began = time.perf_counter()
    first = 0.0
    timings: dict[str, float] = {}
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=600) as client,
        client.stream("POST", "/completion", json=body) as reply,
    ):
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if not first and chunk.get("content"):
                first = time.perf_counter() - began
            if "timings" in chunk:
                timings = chunk["timings"]
    return first or time.perf_counter() - began, timings


async def one_swap(folder: Path, size: int, ctx: int, *, keep: bool) -> dict[str, float]:
    """A cold prompt, a swap (stop, start), the prompt again: the figures (seconds, bytes)."""
    spec = InferenceSpec(role="chat", flavor=InferFlavor.LLAMACPP, model="gemma-3-270m")
    source = ResolvedWeights(path=GEMMA, ctx_size=ctx, parallel=1, keep_kv=keep)
    supervisor = Supervisor(folder / "state", grace_s=10.0)
    kv = KvKeeper(folder / "state" / "kv")
    backends = SupervisorBackends(
        supervisor,
        {"chat": spec},
        host="127.0.0.1",
        resolve_weights=lambda _spec: source,
        auto_ports=True,
        kv=kv,
    )
    prompt = prompt_of(size)
    try:
        endpoint = await backends.start("chat")
        _cold, cold_timings = await stream_ttft(endpoint.base_url, prompt)
        saving = time.perf_counter()
        await backends.stop("chat")
        stop_s = time.perf_counter() - saving
        loading = time.perf_counter()
        endpoint = await backends.start("chat")
        load_s = time.perf_counter() - loading
        ttft, timings = await stream_ttft(endpoint.base_url, prompt)
        kept = kv.kept("chat")
        restore = kv.last_restore.get("chat")
        return {
            "prompt_n_cold": cold_timings.get("prompt_n", 0.0),
            "ttft_after_swap_s": load_s + ttft,
            "load_s": load_s,
            "stop_s": stop_s,
            "restore_s": restore.took_s if restore is not None else 0.0,
            "prefill_s": timings.get("prompt_ms", 0.0) / 1000,
            "prompt_n": timings.get("prompt_n", 0.0),
            "file_bytes": float(kept.file_bytes),
        }
    finally:
        await supervisor.stop_all()


async def main(sizes: list[int], ctx: int) -> None:
    print(f"gemma-3-270m, ctx {ctx}, one slot; the swap: stop, start, the same prompt\n")
    head = (
        f"{'prompt':>7} {'TTFT kept':>10} {'TTFT not':>9} {'ratio':>6} "
        f"{'prefill kept':>13} {'not':>7} {'ratio':>7} {'load':>6} {'save+stop':>9} "
        f"{'restore':>8} {'file':>9}"
    )
    print(head)
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="kv-bench-") as tmp:
            kept = await one_swap(Path(tmp), size, ctx, keep=True)
        with tempfile.TemporaryDirectory(prefix="kv-bench-") as tmp:
            cold = await one_swap(Path(tmp), size, ctx, keep=False)
        tokens = int(kept["prompt_n_cold"])
        prefill_ratio = cold["prefill_s"] / max(kept["prefill_s"], 1e-6)
        print(
            f"{tokens:>7} {kept['ttft_after_swap_s']:>9.2f}s {cold['ttft_after_swap_s']:>8.2f}s "
            f"{kept['ttft_after_swap_s'] / cold['ttft_after_swap_s']:>6.2f} "
            f"{kept['prefill_s'] * 1000:>11.0f}ms {cold['prefill_s']:>6.2f}s "
            f"{prefill_ratio:>6.0f}x {kept['load_s']:>5.2f}s {kept['stop_s']:>8.2f}s "
            f"{kept['restore_s'] * 1000:>6.0f}ms {kept['file_bytes'] / 2**20:>5.1f} MiB"
            f"   (prompt_n after the swap: kept {int(kept['prompt_n'])}, "
            f"not {int(cold['prompt_n'])})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,3000,6000", help="prompt sizes, tokens")
    parser.add_argument("--ctx", type=int, default=8192, help="llama-server's context")
    options = parser.parse_args()
    if not GEMMA.is_file():
        raise SystemExit(f"{GEMMA} is missing: run scripts/prepare-example first")
    asyncio.run(main([int(s) for s in options.sizes.split(",")], options.ctx))
