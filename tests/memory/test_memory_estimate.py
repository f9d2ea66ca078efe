"""The memory estimate on GGUFs of known shapes written by scripts/make_tiny_gguf.py: KV cache
bytes exactly as llama.cpp allocates them (per-slot streams, 256-cell padding, sliding-window
layers, cache types), the extra_args it reads, and properties over settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.adapters import estimate_memory
from rosterd.memory.estimate import (
    LlamaCppSettings,
    estimate_ollama,
    llamacpp_cache_layout,
    llamacpp_checkpoint_bytes,
    llamacpp_checkpoints_per_slot,
    llamacpp_kv_bytes,
    ollama_formula_bytes,
    parse_llamacpp_settings,
)
from rosterd.model_facts import ModelFacts
from rosterd.model_facts.reader import read_model_facts
from rosterd.spec import InferFlavor
from support.gguf import write_gguf

pytest.importorskip("gguf", reason="the gguf package (dev extra) writes and reads GGUFs")


@pytest.fixture(scope="module")
def gqa_facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """llama, 3 layers, 8 heads sharing 2 KV heads of 16 values (n_embd 128)."""
    folder = tmp_path_factory.mktemp("gqa")
    return read_model_facts(
        write_gguf(folder / "gqa.gguf", blocks=3, embd=128, heads=8, kv_heads=2)
    )


@pytest.fixture(scope="module")
def swa_facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """gemma3, 7 layers (6 sliding, layer 5 full), 1 KV head of 32, a 128-token window."""
    folder = tmp_path_factory.mktemp("swa")
    path = write_gguf(
        folder / "swa.gguf",
        arch="gemma3",
        blocks=7,
        heads=4,
        kv_heads=1,
        head_dim=32,
        context_length=4096,
        sliding_window=128,
    )
    return read_model_facts(path)


def kv(facts: ModelFacts, ctx: int, parallel: int, *extra: str) -> int:
    return llamacpp_kv_bytes(facts, parse_llamacpp_settings(ctx, parallel, extra))


def test_tiny_model_kv_matches_llama_server(tiny_gguf: Path) -> None:
    facts = read_model_facts(tiny_gguf)
    # llama-server logs "KV buffer size = 0.25 MiB" for this model at -c 512 -np 1:
    # 512 cells x 2 layers x (K + V) x 4 heads x 16 values x 2 bytes (f16)
    assert kv(facts, 512, 1) == 512 * 2 * 2 * 4 * 16 * 2 == 262_144


def test_per_slot_streams_are_padded_to_256_cells(gqa_facts: ModelFacts) -> None:
    per_cell = 3 * 2 * 2 * 16 * 2  # layers x (K + V) x KV heads x values x f16
    # -c 1000 -np 3: n_ctx pads to 1024; each slot gets pad256(1024 // 3) = 512 cells
    assert kv(gqa_facts, 1000, 3) == 3 * 512 * per_cell
    assert kv(gqa_facts, 4096, 1) == 4096 * per_cell
    assert kv(gqa_facts, 4096, 4) == 4 * 1024 * per_cell
    # --kv-unified: one stream of n_ctx cells, whatever the slots
    assert kv(gqa_facts, 1000, 3, "--kv-unified") == 1024 * per_cell


def test_cache_types_from_extra_args(gqa_facts: ModelFacts) -> None:
    values = 2 * 16  # KV heads x values per head
    q8_row = values // 32 * 34  # ggml q8_0: 34 bytes per block of 32
    q4_row = values // 32 * 18
    assert kv(gqa_facts, 4096, 1, "-ctk", "q8_0", "-ctv", "q8_0") == 4096 * 3 * 2 * q8_row
    assert kv(gqa_facts, 4096, 1, "--cache-type-k=q8_0", "--cache-type-v", "q4_0") == (
        4096 * 3 * (q8_row + q4_row)
    )
    assert kv(gqa_facts, 4096, 1, "-ctk", "f32") == 4096 * 3 * (values * 4 + values * 2)


def test_sliding_window_layers_hold_window_plus_ubatch(swa_facts: ModelFacts) -> None:
    per_layer_cell = 2 * 1 * 32 * 2  # (K + V) x 1 KV head x 32 values x f16
    # -c 4096 -np 2 (llama-server logs 0.50 MiB full + 1.12 MiB SWA for this model):
    # full layer: 2 slots x 2048 cells; sliding layers: pad256(128 + 512) = 768 cells a slot
    full = 2 * 2048 * 1 * per_layer_cell
    sliding = 2 * 768 * 6 * per_layer_cell
    assert kv(swa_facts, 4096, 2) == full + sliding == 524_288 + 1_179_648
    # unified: one stream; the window is per slot, so 128 x 2 + 512 = 768 cells
    assert kv(swa_facts, 4096, 2, "-kvu") == 4096 * per_layer_cell + 768 * 6 * per_layer_cell
    # a context smaller than window + ubatch: the sliding layers hold the whole context
    assert kv(swa_facts, 256, 1) == 256 * 7 * per_layer_cell
    # --swa-full: every layer holds the full context
    assert kv(swa_facts, 4096, 2, "--swa-full") == 2 * 2048 * 7 * per_layer_cell


def test_checkpoints_are_the_sliding_layers_cache(swa_facts: ModelFacts, tiny_gguf: Path) -> None:
    one = llamacpp_checkpoint_bytes(swa_facts, parse_llamacpp_settings(4096, 2))
    assert one == 128 * 6 * 2 * 32 * 2  # the 128-token window of the 6 sliding layers
    assert llamacpp_checkpoints_per_slot(swa_facts, parse_llamacpp_settings(4096, 2)) == 2
    assert llamacpp_checkpoints_per_slot(swa_facts, parse_llamacpp_settings(16384, 1)) == 3
    capped = parse_llamacpp_settings(16384, 1, ["--ctx-checkpoints", "1"])
    assert llamacpp_checkpoints_per_slot(swa_facts, capped) == 1
    assert (
        llamacpp_checkpoint_bytes(swa_facts, parse_llamacpp_settings(4096, 2, ["-ctxcp", "0"])) == 0
    )
    assert (
        llamacpp_checkpoint_bytes(read_model_facts(tiny_gguf), parse_llamacpp_settings(512, 1)) == 0
    )
    estimate = estimate_memory(
        swa_facts, InferFlavor.LLAMACPP, ctx_size=4096, parallel=2, keep_kv=False
    )
    assert any("context checkpoint" in note for note in estimate.notes)
    # With the KV kept the launch passes --swa-full: full-size sliding layers, no checkpoints.
    kept = estimate_memory(swa_facts, InferFlavor.LLAMACPP, ctx_size=4096, parallel=2)
    assert not any("context checkpoint" in note for note in kept.notes)
    assert kept.kv_bytes > estimate.kv_bytes


def test_ubatch_is_capped_by_the_context(gqa_facts: ModelFacts) -> None:
    assert llamacpp_cache_layout(gqa_facts, parse_llamacpp_settings(256, 1)).ubatch == 256
    layout = llamacpp_cache_layout(gqa_facts, parse_llamacpp_settings(4096, 1, ["-ub", "128"]))
    assert layout.ubatch == 128


def test_later_ctx_and_parallel_in_extra_args_win() -> None:
    parsed = parse_llamacpp_settings(4096, 1, ["-c", "8192", "--parallel=4", "-t", "2"])
    assert (parsed.ctx_size, parsed.parallel) == (8192, 4)
    assert parse_llamacpp_settings(4096, 1, ["-fa", "off"]).flash_attn == "off"
    assert parse_llamacpp_settings(4096, 1, ["-ctk", "nonsense"]).cache_type_k == "f16"
    assert parse_llamacpp_settings(4096, 1, []) == LlamaCppSettings(ctx_size=4096, parallel=1)


def test_estimate_parts_and_notes(swa_facts: ModelFacts) -> None:
    estimate = estimate_memory(
        swa_facts, InferFlavor.LLAMACPP, ctx_size=4096, parallel=2, keep_kv=False
    )
    assert estimate.kv_bytes == kv(swa_facts, 4096, 2)
    kept = estimate_memory(swa_facts, InferFlavor.LLAMACPP, ctx_size=4096, parallel=2)
    assert kept.kv_bytes == kv(swa_facts, 4096, 2, "--swa-full")  # the launch's flag
    # the RAM prompt cache's bound (--cache-ram) is counted whole: 64 MiB by default
    assert "prompt cache (--cache-ram) 64.0 MiB" in kept.overhead_note
    bigger = estimate_memory(
        swa_facts, InferFlavor.LLAMACPP, ctx_size=4096, parallel=2, cache_ram_mb=256
    )
    assert bigger.overhead_bytes - kept.overhead_bytes == 192 * 2**20
    assert estimate.weights_bytes >= swa_facts.file_bytes
    assert estimate.overhead_bytes > 0
    assert estimate.total_bytes == (
        estimate.weights_bytes + estimate.kv_bytes + estimate.overhead_bytes
    )
    assert "GGUF file size" in estimate.weights_note
    assert "sliding-window" in estimate.kv_note
    assert "compute buffer" in estimate.overhead_note
    assert estimate.as_memory_spec().resident_bytes == estimate.total_bytes
    no_fa = estimate_memory(
        swa_facts,
        InferFlavor.LLAMACPP,
        ctx_size=4096,
        parallel=2,
        extra_args=["-fa", "off"],
        keep_kv=False,
    )
    assert no_fa.overhead_bytes > estimate.overhead_bytes


def test_flavors_other_than_llamacpp(gqa_facts: ModelFacts) -> None:
    with pytest.raises(ValueError, match="estimate_ollama"):
        estimate_memory(gqa_facts, InferFlavor.OLLAMA, ctx_size=4096, parallel=1)
    with pytest.raises(ValueError, match="at least 1"):
        estimate_memory(gqa_facts, InferFlavor.LLAMACPP, ctx_size=0, parallel=1)
    loaded = estimate_ollama(3_000_000_000, declared_bytes=2_000_000_000)
    assert loaded.total_bytes == 3_000_000_000
    assert "/api/ps" in loaded.weights_note
    before = estimate_ollama(None, declared_bytes=2_000_000_000)
    assert before.total_bytes == 2_000_000_000
    assert "roster" in before.weights_note


def test_ollama_formula(gqa_facts: ModelFacts) -> None:
    # file size + 2 * layers * kv_heads * head_dim * ctx * 2 bytes
    assert ollama_formula_bytes(gqa_facts, 1000) == gqa_facts.file_bytes + 2 * 3 * 2 * 16 * 1000 * 2


@settings(max_examples=60, deadline=None)
@given(
    ctx=st.integers(min_value=1, max_value=200_000),
    more=st.integers(min_value=0, max_value=50_000),
    parallel=st.integers(min_value=1, max_value=8),
    unified=st.booleans(),
)
def test_estimate_grows_with_context(
    swa_facts: ModelFacts, ctx: int, more: int, parallel: int, unified: bool
) -> None:
    extra = ["-kvu"] if unified else []
    small = estimate_memory(
        swa_facts, InferFlavor.LLAMACPP, ctx_size=ctx, parallel=parallel, extra_args=extra
    )
    big = estimate_memory(
        swa_facts, InferFlavor.LLAMACPP, ctx_size=ctx + more, parallel=parallel, extra_args=extra
    )
    assert big.kv_bytes >= small.kv_bytes
    assert big.total_bytes >= small.total_bytes


@settings(max_examples=60, deadline=None)
@given(
    per_slot=st.integers(min_value=256, max_value=32_768),
    parallel=st.integers(min_value=1, max_value=7),
)
def test_estimate_grows_with_slots_at_the_same_context_per_slot(
    swa_facts: ModelFacts, gqa_facts: ModelFacts, per_slot: int, parallel: int
) -> None:
    for facts in (swa_facts, gqa_facts):
        fewer = estimate_memory(
            facts, InferFlavor.LLAMACPP, ctx_size=per_slot * parallel, parallel=parallel
        )
        more = estimate_memory(
            facts, InferFlavor.LLAMACPP, ctx_size=per_slot * (parallel + 1), parallel=parallel + 1
        )
        assert more.kv_bytes >= fewer.kv_bytes
        assert more.total_bytes >= fewer.total_bytes


def test_mlx_estimate_counts_kv_in_steps(tmp_path: Path) -> None:
    from support.safetensors import write_safetensors

    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,'
        ' "num_attention_heads": 4, "num_key_value_heads": 2}'
    )
    write_safetensors(folder / "model.safetensors", {"w": ("F16", [64, 64])})
    facts = read_model_facts(folder)
    estimate = estimate_memory(facts, InferFlavor.MLX_LM, ctx_size=300, parallel=1)
    # 300 tokens round up to 512 (steps of 256): 2 layers x 2 KV heads x (16 + 16) x 2 bytes
    assert estimate.kv_bytes == 512 * 2 * 2 * 32 * 2
    assert estimate.weights_bytes == (folder / "model.safetensors").stat().st_size
