"""A role's memory estimate split by pool (device / host), checked against llama.cpp's
offload rules and llama-server's own memory breakdown."""

from __future__ import annotations

from pathlib import Path

import pytest

from rosterd.devices.breakdown import parse_memory_breakdown
from rosterd.memory.estimate import estimate_llamacpp, estimate_mlx, parse_llamacpp_settings
from rosterd.memory.split import DEVICE_RUNTIME_BYTES, layers_that_fit, split_llamacpp, split_mlx
from rosterd.model_facts import ModelFacts
from rosterd.model_facts.reader import read_model_facts

MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data" / "memory_breakdown"


@pytest.fixture(scope="module")
def gemma(gemma_gguf: Path) -> ModelFacts:
    """The example's gemma-3-270m Q4_K_M: 18 layers, tied embeddings (no output.weight)."""
    return read_model_facts(gemma_gguf)


SETTINGS = parse_llamacpp_settings(4096, 1, ["--cache-ram", "64"])


def test_no_offload_puts_everything_on_the_host_as_the_whole_estimate(gemma: ModelFacts) -> None:
    split = split_llamacpp(gemma, SETTINGS, 0)
    assert split.device_bytes == 0
    assert split.host_bytes == estimate_llamacpp(gemma, SETTINGS).total_bytes
    assert (split.layers, split.layers_on_device, split.output_on_device) == (18, 0, False)


def test_ngl_one_offloads_the_output_layer_alone(gemma: ModelFacts) -> None:
    # llama.cpp counts the output layer as layer n_layer and offloads from the top.
    split = split_llamacpp(gemma, SETTINGS, 1)
    assert (split.layers_on_device, split.output_on_device) == (0, True)
    embeddings = next(t.n_bytes for t in gemma.tensors if t.name == "token_embd.weight")
    output_norm = next(t.n_bytes for t in gemma.tensors if t.name == "output_norm.weight")
    # Tied embeddings: the output layer's copy of token_embd goes to the device.
    assert split.device_model_bytes == embeddings + output_norm
    assert split.device_context_bytes == 0


def test_full_offload_keeps_the_input_embeddings_and_the_mapped_file_on_the_host(
    gemma: ModelFacts,
) -> None:
    split = split_llamacpp(gemma, SETTINGS, 999)
    embeddings = next(t.n_bytes for t in gemma.tensors if t.name == "token_embd.weight")
    assert (split.layers_on_device, split.output_on_device) == (18, True)
    assert split.host_model_bytes == embeddings  # the input layer is never offloaded
    assert split.host_context_bytes == 0
    assert split.device_context_bytes == estimate_llamacpp(gemma, SETTINGS).kv_bytes
    assert split.device_runtime_bytes == DEVICE_RUNTIME_BYTES
    # The mapped GGUF is in host RAM whole: its embeddings as the host's model buffer,
    # the rest (the offloaded tensors' pages and the header) as mapped bytes.
    assert split.host_model_bytes + split.host_mapped_bytes == gemma.file_bytes


def test_more_layers_never_hold_less_on_the_device(gemma: ModelFacts) -> None:
    sizes = [split_llamacpp(gemma, SETTINGS, n).device_bytes for n in range(0, 21)]
    assert sizes == sorted(sizes)
    assert sizes[19] == sizes[20]  # 19 = all 18 layers and the output layer


def test_layers_that_fit_is_the_most_the_room_takes(gemma: ModelFacts) -> None:
    full = split_llamacpp(gemma, SETTINGS, 19).device_bytes
    assert layers_that_fit(gemma, SETTINGS, full) == 19
    assert layers_that_fit(gemma, SETTINGS, full - 1) < 19
    assert layers_that_fit(gemma, SETTINGS, 0) == 0
    some = layers_that_fit(gemma, SETTINGS, full - 20 * MiB)
    assert 0 < some < 19
    assert split_llamacpp(gemma, SETTINGS, some).device_bytes <= full - 20 * MiB


def test_an_mlx_role_is_all_in_the_macs_gpu_share(tmp_path: Path) -> None:
    from support.safetensors import write_safetensors

    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,'
        ' "num_attention_heads": 4, "num_key_value_heads": 2}'
    )
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F16", [64, 64])})
    estimate = estimate_mlx(read_model_facts(tmp_path), 4096)
    split = split_mlx(estimate)
    assert split.device_bytes == estimate.total_bytes
    # Unified memory: what the GPU share holds is host RAM too.
    assert split.host_bytes == estimate.total_bytes


def test_the_breakdown_parser_reads_device_and_host_rows() -> None:
    rows = parse_memory_breakdown(
        (DATA / "metal_four_virtual_devices.txt").read_text(encoding="utf-8")
    )
    assert list(rows) == ["MTL0", "MTL1", "MTL2", "MTL3", "Host"]
    mtl0 = rows["MTL0"]
    assert (mtl0.total_bytes, mtl0.free_bytes, mtl0.self_bytes) == (
        165150 * MiB,
        158091 * MiB,
        1916 * MiB,
    )
    assert (mtl0.model_bytes, mtl0.context_bytes, mtl0.compute_bytes) == (
        780 * MiB,
        1024 * MiB,
        112 * MiB,
    )
    assert mtl0.unaccounted_bytes == 5143 * MiB
    host = rows["Host"]
    assert (host.self_bytes, host.model_bytes, host.context_bytes, host.compute_bytes) == (
        364 * MiB,
        296 * MiB,
        0,
        68 * MiB,
    )
    assert host.total_bytes is None
    assert parse_memory_breakdown("no table here") == {}
