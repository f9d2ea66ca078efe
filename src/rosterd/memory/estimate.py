"""The memory estimate: what a role's backend will hold resident, from its weights' facts (layer 3).

Pure: ``ModelFacts`` (read by ``rosterd.model_facts``) and the serving settings
in, a ``MemoryEstimate`` (weights, KV cache, overhead, each with where it came
from) out. No I/O, no clock, no logging.

llama.cpp (``llama-server``), modelled on llama.cpp's own sizing in the version
rosterd builds (``src/llama-context.cpp``, ``llama-kv-cache.cpp``,
``llama-kv-cache-iswa.cpp``, ``tools/server/server.cpp``):

- **weights**: the GGUF file is memory-mapped and every page is touched once the
  model has answered (the output layer reads the whole tied embedding), so the
  file's size counts; the CPU backend also keeps a repacked copy of ``Q4_0``,
  ``Q4_K`` and ``IQ4_NL`` matrices (seen as ``CPU_REPACK`` in its log on x86-64).
- **KV cache**: ``n_ctx = pad256(ctx_size)``. With ``-np N`` given (rosterd always
  gives it) the cache is per slot: N streams of ``pad256(n_ctx / N)`` cells; with
  ``--kv-unified`` one stream of ``n_ctx`` cells. Sliding-window layers (gemma-style
  interleaved SWA) hold only ``pad256(min(cells, window · (N if unified else 1) +
  n_ubatch))`` cells per stream (``--swa-full`` gives them the full size). A cell of
  one layer holds ``kv_heads · key_length`` K values and ``kv_heads · value_length``
  V values of the cache types (``--cache-type-k/-v``, ``-ctk/-ctv``, f16 by default),
  in ggml's block sizes. This part is exact: it is llama.cpp's own arithmetic.
- **overhead**: the compute buffer (its attention masks, ``pad`` cells x ``n_ubatch`` f16
  each for the full and the sliding-window cache, plus ``n_ubatch`` rows of the
  feed-forward, embedding and query activations, plus one row of logits; without
  flash attention also the f32 score matrix of every head), the output buffer
  (``n_vocab`` f32 logits per slot), the vocabulary (about 170 bytes a token) and
  llama-server's own resident size (about 16.5 MiB), and for models with sliding-window
  layers the context checkpoints one prompt filling each slot leaves (copies of
  those layers' window, two near the prompt's end and one more every
  ``--checkpoint-min-step`` tokens, 8192 by default); up to ``--ctx-checkpoints`` (32) per slot
  accumulate over many prompts, which the estimate notes but does not count.
  The vocabulary and base figures and the activation multipliers are calibrated
  against measured peak RSS (``bench/memory_bench.py``).
- **prompt cache**: llama-server keeps idle prompts' state in RAM up to ``--cache-ram``
  MiB (8192 by default; rosterd passes a small figure, the disk keeps the rest), which
  grows with use: measured here, twelve distinct 2,300-token conversations on gemma-3
  270M grew its RSS by about 30 MiB each. The bound is counted whole; ``-1`` (no
  limit) cannot be counted and says so.

mlx_lm (``mlx_lm.server``): the safetensors are loaded whole (file size); the KV
cache grows in steps of 256 tokens of ``2 · layers · kv_heads · head_dim`` values in
the model's float dtype, counted for ``ctx_size`` tokens per slot; overhead is the
Python process with mlx, mlx_lm and transformers loaded (calibrated).

ollama: ``/api/ps`` reports the loaded size (weights, cache and buffers together);
before it is loaded, the roster's figure is all there is.

By pool: :mod:`rosterd.memory.split` splits these estimates between a device and the host.

Which of these a role gets is its flavor adapter's choice (``Adapter.estimate_memory``,
``SharedServer.reported_estimate``; ``rosterd.adapters.estimate_memory`` by flavor):
this module holds the arithmetic and names no flavor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rosterd.model_facts import ModelFacts
from rosterd.spec import MemorySpec

MiB: Final[int] = 1 << 20

#: llama.cpp pads context and cache sizes to this many cells (``GGML_PAD(n, 256)``).
KV_PAD_CELLS: Final[int] = 256

#: llama.cpp's default logical and physical batch sizes (``common/common.h``).
DEFAULT_BATCH: Final[int] = 2048
DEFAULT_UBATCH: Final[int] = 512

#: llama-server's default ``--ctx-checkpoints``: copies of the sliding-window cache kept per slot.
DEFAULT_CTX_CHECKPOINTS: Final[int] = 32

#: llama-server's default ``--checkpoint-min-step``: tokens between checkpoints of one prompt.
DEFAULT_CHECKPOINT_MIN_STEP: Final[int] = 8192

#: llama-server's default ``--cache-ram``: MiB of idle prompts' state kept in RAM.
DEFAULT_CACHE_RAM_MIB: Final[int] = 8192

#: llama-server's resident size with a model of no size (measured with the tiny GGUF after a
#: prompt filling its context: 16.5 MiB, x86-64).
LLAMA_SERVER_BASE_BYTES: Final[int] = 16 * MiB + MiB // 2

#: Resident bytes per vocabulary entry, from gemma-3's 262144 tokens: its llama-server holds
#: 43 MiB more when idle after loading than the weights, cache, buffers and base explain.
LLAMA_VOCAB_BYTES_PER_TOKEN: Final[int] = 170

#: mlx_lm.server's resident size before its model (Python, mlx, mlx_lm, transformers),
#: measured on Linux with mlx's CPU backend after a short completion: 131 MiB.
MLX_SERVER_BASE_BYTES: Final[int] = 131 * MiB

#: mlx_lm's KV cache grows in steps of this many tokens (``mlx_lm.models.cache.KVCache``).
MLX_KV_STEP_TOKENS: Final[int] = 256

#: ggml's (block size, bytes per block) of the KV cache types llama-server accepts.
GGML_TYPE_BLOCKS: Final[dict[str, tuple[int, int]]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}

#: Tensor types the x86-64 CPU backend repacks into a second, interleaved copy.
REPACKED_TENSOR_TYPES: Final[frozenset[str]] = frozenset({"Q4_0", "Q4_K", "IQ4_NL"})


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """A role's expected resident memory in bytes, in three parts, each with its source.

    ``weights_note``, ``kv_note`` and ``overhead_note`` say where each part came
    from (a person reads them in ``rosterd models``); ``notes`` holds anything
    else worth knowing (what is not counted, settings that were guessed).
    """

    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    weights_note: str
    kv_note: str
    overhead_note: str
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """``weights_bytes + kv_bytes + overhead_bytes``."""
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    def as_memory_spec(self) -> MemorySpec:
        """The estimate as the spec's ``MemorySpec`` (same three parts)."""
        return MemorySpec(
            weights_bytes=self.weights_bytes,
            kv_bytes=self.kv_bytes,
            overhead_bytes=self.overhead_bytes,
        )


@dataclass(frozen=True, slots=True)
class LlamaCppSettings:
    """The llama-server settings that size its memory, after ``extra_args`` are applied.

    ``ctx_size`` tokens in all and ``parallel`` slots, as the launch passes them
    (``-c``/``-np``; a later ``-c``/``-np`` in ``extra_args`` wins, as in
    llama.cpp's parser); ``cache_type_k``/``cache_type_v`` are ggml type names;
    ``flash_attn`` is ``on``, ``off`` or ``auto`` (auto is on for the CPU);
    ``cache_ram_mib`` bounds the RAM prompt cache (MiB; 0 none, -1 no limit).
    """

    ctx_size: int
    parallel: int
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    batch: int = DEFAULT_BATCH
    ubatch: int = DEFAULT_UBATCH
    kv_unified: bool = False
    swa_full: bool = False
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    checkpoint_min_step: int = DEFAULT_CHECKPOINT_MIN_STEP
    cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB


def parse_llamacpp_settings(
    ctx_size: int, parallel: int, extra_args: Sequence[str] = ()
) -> LlamaCppSettings:
    """``LlamaCppSettings`` from the launch's ``-c``/``-np`` and the operator's ``extra_args``.

    Reads ``-c/--ctx-size``, ``-np/--parallel``, ``-ctk/--cache-type-k``,
    ``-ctv/--cache-type-v``, ``-fa/--flash-attn``, ``-b/--batch-size``,
    ``-ub/--ubatch-size``, ``-kvu/--kv-unified``, ``-no-kvu/--no-kv-unified``,
    ``--swa-full``, ``-ctxcp/--ctx-checkpoints``, ``-cms/--checkpoint-min-step``,
    ``-cram/--cache-ram``, each also as ``--flag=value``; other arguments are ignored.
    A value that does not parse keeps the default (llama-server itself would
    refuse to start; the estimate need not).
    """
    values: dict[str, str] = {}
    flags: dict[str, bool] = {}
    takes_value = {
        "-c": "ctx",
        "--ctx-size": "ctx",
        "-np": "parallel",
        "--parallel": "parallel",
        "-ctk": "ctk",
        "--cache-type-k": "ctk",
        "-ctv": "ctv",
        "--cache-type-v": "ctv",
        "-fa": "fa",
        "--flash-attn": "fa",
        "-b": "batch",
        "--batch-size": "batch",
        "-ub": "ubatch",
        "--ubatch-size": "ubatch",
        "-ctxcp": "ctxcp",
        "--ctx-checkpoints": "ctxcp",
        "--swa-checkpoints": "ctxcp",
        "-cms": "cms",
        "--checkpoint-min-step": "cms",
        "-cram": "cram",
        "--cache-ram": "cram",
    }
    switches = {
        "-kvu": ("unified", True),
        "--kv-unified": ("unified", True),
        "-no-kvu": ("unified", False),
        "--no-kv-unified": ("unified", False),
        "--swa-full": ("swa_full", True),
    }
    args = list(extra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name in takes_value:
            if eq:
                values[takes_value[name]] = inline
            elif i + 1 < len(args):
                values[takes_value[name]] = args[i + 1]
                i += 1
        elif arg in switches:
            key, on = switches[arg]
            flags[key] = on
        i += 1

    def count(key: str, default: int, least: int = 1) -> int:
        try:
            found = int(values[key])
        except (KeyError, ValueError):
            return default
        return found if found >= least else default

    def cache_type(key: str) -> str:
        found = values.get(key, "f16").lower()
        return found if found in GGML_TYPE_BLOCKS else "f16"

    fa = values.get("fa", "auto").lower()
    return LlamaCppSettings(
        ctx_size=count("ctx", ctx_size),
        parallel=count("parallel", parallel),
        cache_type_k=cache_type("ctk"),
        cache_type_v=cache_type("ctv"),
        flash_attn={"1": "on", "true": "on", "0": "off", "false": "off"}.get(fa, fa),
        batch=count("batch", DEFAULT_BATCH),
        ubatch=count("ubatch", DEFAULT_UBATCH),
        kv_unified=flags.get("unified", False),
        swa_full=flags.get("swa_full", False),
        ctx_checkpoints=count("ctxcp", DEFAULT_CTX_CHECKPOINTS, least=0),
        checkpoint_min_step=count("cms", DEFAULT_CHECKPOINT_MIN_STEP, least=0),
        cache_ram_mib=count("cram", DEFAULT_CACHE_RAM_MIB, least=-1),
    )


def pad_cells(n: int) -> int:
    """``n`` rounded up to llama.cpp's 256-cell padding (``GGML_PAD(n, 256)``)."""
    return -(-n // KV_PAD_CELLS) * KV_PAD_CELLS


def ggml_row_bytes(type_name: str, n: int) -> int:
    """Bytes of ``n`` values of ggml type ``type_name`` (``ggml_row_size``).

    Raises:
        KeyError: ``type_name`` is not one of ``GGML_TYPE_BLOCKS``.
    """
    block, size = GGML_TYPE_BLOCKS[type_name]
    return n // block * size


@dataclass(frozen=True, slots=True)
class LlamaCppCache:
    """llama.cpp's KV cache layout: ``streams`` streams of ``cells`` cells on full layers and
    ``swa_cells`` cells on sliding-window layers; ``ubatch`` is the physical batch."""

    streams: int
    cells: int
    swa_cells: int
    ubatch: int


def llamacpp_cache_layout(facts: ModelFacts, settings: LlamaCppSettings) -> LlamaCppCache:
    """The cache llama.cpp allocates for ``facts`` served with ``settings`` (see module doc)."""
    n_ctx = pad_cells(settings.ctx_size)
    slots = settings.parallel
    if settings.kv_unified:
        cells, streams = n_ctx, 1
    else:
        cells, streams = pad_cells(max(n_ctx // slots, 1)), slots
    batch = min(settings.ctx_size, settings.batch)
    ubatch = min(batch, settings.ubatch)
    swa_cells = cells
    if facts.sliding_window > 0 and not settings.swa_full:
        windows = facts.sliding_window * (slots if settings.kv_unified else 1)
        swa_cells = pad_cells(min(cells, windows + ubatch))
    return LlamaCppCache(streams=streams, cells=cells, swa_cells=swa_cells, ubatch=ubatch)


def llamacpp_kv_bytes(facts: ModelFacts, settings: LlamaCppSettings) -> int:
    """The KV cache's bytes, exactly as llama.cpp allocates them (see the module docstring)."""
    layout = llamacpp_cache_layout(facts, settings)
    total = 0
    for layer in range(facts.block_count):
        cells = layout.swa_cells if facts.swa_layers[layer] else layout.cells
        total += layout.streams * cells * llamacpp_cell_bytes(facts, settings, layer)
    return total


def llamacpp_checkpoint_bytes(facts: ModelFacts, settings: LlamaCppSettings) -> int:
    """Bytes of one context checkpoint of one slot: the window of its sliding-window layers.

    llama-server copies the part of the cache it cannot roll back (the cells of
    the sliding-window layers still inside the window) near the end of each
    prompt, keeping up to ``ctx_checkpoints`` per slot
    (``tools/server/server-context.cpp``; gemma-3 270M at ``-c 4096`` logs 7.5 MiB
    each: 15 layers x 512 cells x 1 KiB). 0 without sliding layers, with
    ``--swa-full`` or with ``--ctx-checkpoints 0``.
    """
    if settings.swa_full or settings.ctx_checkpoints == 0:
        return 0
    layout = llamacpp_cache_layout(facts, settings)
    cells = min(facts.sliding_window, layout.swa_cells)
    return sum(
        cells * llamacpp_cell_bytes(facts, settings, layer)
        for layer in range(facts.block_count)
        if facts.swa_layers[layer]
    )


def llamacpp_checkpoints_per_slot(facts: ModelFacts, settings: LlamaCppSettings) -> int:
    """Context checkpoints one prompt filling a slot leaves: two near its end (seen in
    llama-server's log) and one more every ``checkpoint_min_step`` tokens before, at
    most ``ctx_checkpoints``."""
    if llamacpp_checkpoint_bytes(facts, settings) == 0:
        return 0
    cells = llamacpp_cache_layout(facts, settings).cells
    step = settings.checkpoint_min_step
    per_prompt = 2 + (cells - 1) // step if step > 0 else settings.ctx_checkpoints
    return min(settings.ctx_checkpoints, per_prompt)


def llamacpp_cell_bytes(facts: ModelFacts, settings: LlamaCppSettings, layer: int) -> int:
    """Bytes of one cache cell of ``layer``: its K and V rows in the cache types."""
    heads = facts.kv_heads[layer]
    return ggml_row_bytes(settings.cache_type_k, heads * facts.key_length) + ggml_row_bytes(
        settings.cache_type_v, heads * facts.value_length
    )


def estimate_llamacpp(facts: ModelFacts, settings: LlamaCppSettings) -> MemoryEstimate:
    """What llama-server holds resident serving ``facts`` with ``settings``, in bytes."""
    layout = llamacpp_cache_layout(facts, settings)
    kv = llamacpp_kv_bytes(facts, settings)
    repacked = sum(
        t.n_bytes
        for t in facts.tensors
        if t.type_name in REPACKED_TENSOR_TYPES and len(t.shape) >= 2 and t.shape[1] % 8 == 0
    )
    weights = facts.file_bytes + repacked
    ub = layout.ubatch
    q_width = facts.head_count * facts.key_length
    activations = ub * 4 * (3 * facts.feed_forward_length + 2 * facts.embedding_length + q_width)
    masks = layout.cells * ub * 2
    if any(facts.swa_layers):
        masks += layout.swa_cells * ub * 2
    scores = 0
    if settings.flash_attn == "off":
        scores = layout.cells * ub * facts.head_count * 4
    compute = activations + masks + scores + facts.vocab_size * 4
    output = facts.vocab_size * 4 * settings.parallel
    vocab = facts.vocab_size * LLAMA_VOCAB_BYTES_PER_TOKEN
    checkpoint = llamacpp_checkpoint_bytes(facts, settings)
    per_slot = llamacpp_checkpoints_per_slot(facts, settings)
    checkpoints = checkpoint * per_slot * settings.parallel
    prompt_cache = max(settings.cache_ram_mib, 0) * MiB
    overhead = compute + output + vocab + checkpoints + prompt_cache + LLAMA_SERVER_BASE_BYTES
    notes = []
    if settings.cache_ram_mib < 0:
        notes.append(
            "not counted: llama-server's prompt cache (--cache-ram -1, no limit), which "
            "grows with use; the measured peak covers it"
        )
    if checkpoint:
        most = checkpoint * settings.parallel * settings.ctx_checkpoints
        notes.append(
            f"counted: {per_slot} context checkpoint(s) per slot ({_mib(checkpoint)} each), "
            f"what one prompt filling the slot leaves; up to "
            f"{settings.ctx_checkpoints} per slot ({_mib(most)} in all) accumulate with use "
            "(--ctx-checkpoints N bounds them); the measured peak covers it"
        )
    swa = sum(facts.swa_layers)
    kv_note = (
        f"{layout.streams} x {layout.cells} cells on {facts.block_count - swa} full layers"
        + (f", {layout.swa_cells} cells on {swa} sliding-window layers" if swa else "")
        + f"; K {settings.cache_type_k}, V {settings.cache_type_v}"
        + f", {facts.head_count_kv} KV heads x {facts.key_length}/{facts.value_length}"
    )
    weights_note = f"GGUF file size ({facts.file_type})"
    if repacked:
        weights_note += f" + {_mib(repacked)} repacked {'/'.join(sorted(REPACKED_TENSOR_TYPES))}"
    return MemoryEstimate(
        weights_bytes=weights,
        kv_bytes=kv,
        overhead_bytes=overhead,
        weights_note=weights_note,
        kv_note=kv_note,
        overhead_note=(
            f"compute buffer {_mib(compute)} (ubatch {ub}, flash attention "
            f"{settings.flash_attn}), output {_mib(output)}, vocabulary {_mib(vocab)}, "
            + (f"context checkpoints {_mib(checkpoints)}, " if checkpoints else "")
            + (f"prompt cache (--cache-ram) {_mib(prompt_cache)}, " if prompt_cache else "")
            + f"llama-server {_mib(LLAMA_SERVER_BASE_BYTES)}"
        ),
        notes=tuple(notes),
    )


def estimate_mlx(facts: ModelFacts, ctx_size: int, parallel: int = 1) -> MemoryEstimate:
    """What mlx_lm.server holds resident serving ``facts`` for ``ctx_size`` tokens per slot."""
    tokens = -(-ctx_size // MLX_KV_STEP_TOKENS) * MLX_KV_STEP_TOKENS
    dtype = facts.dtype_bytes or 2
    per_token = sum(h * (facts.key_length + facts.value_length) * dtype for h in facts.kv_heads)
    kv = per_token * tokens * parallel
    return MemoryEstimate(
        weights_bytes=facts.tensor_bytes,
        kv_bytes=kv,
        overhead_bytes=MLX_SERVER_BASE_BYTES,
        weights_note=f"safetensors sizes ({facts.file_type})",
        kv_note=(
            f"{parallel} x {tokens} tokens x {facts.block_count} layers, "
            f"{facts.head_count_kv} KV heads x {facts.key_length}, {dtype}-byte values"
        ),
        overhead_note=f"mlx_lm.server process {_mib(MLX_SERVER_BASE_BYTES)}",
    )


def estimate_ollama(loaded_size_bytes: int | None, declared_bytes: int) -> MemoryEstimate:
    """ollama's own figure once the model is loaded (``/api/ps`` ``size``), else the roster's.

    ``/api/ps`` reports weights, cache and buffers as one number, so it all
    lands in ``weights_bytes``.
    """
    if loaded_size_bytes is not None:
        return MemoryEstimate(
            weights_bytes=loaded_size_bytes,
            kv_bytes=0,
            overhead_bytes=0,
            weights_note="ollama /api/ps size (weights, KV cache and buffers together)",
            kv_note="included in ollama's size",
            overhead_note="included in ollama's size",
        )
    return MemoryEstimate(
        weights_bytes=declared_bytes,
        kv_bytes=0,
        overhead_bytes=0,
        weights_note="roster ram_gb (ollama reports its size only once loaded)",
        kv_note="unknown until loaded",
        overhead_note="unknown until loaded",
    )


def ollama_formula_bytes(facts: ModelFacts, ctx_size: int) -> int:
    """Ollama's published estimate: file size + 2 · layers · kv_heads · head_dim · ctx · 2 bytes.

    The comparison the memory bench prints next to ours (f16 K and V on every
    layer for the whole context, no sliding window, no buffers).
    """
    return (
        facts.file_bytes
        + 2 * facts.block_count * facts.head_count_kv * (facts.key_length) * ctx_size * 2
    )


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"
