"""Model facts read from weights the project writes itself: GGUFs of known shapes
(scripts/make_tiny_gguf.py) and an MLX folder's config.json and safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rosterd.errors import ModelFactsError, RosterdError
from rosterd.model_facts.gguf_file import swa_layers
from rosterd.model_facts.reader import read_model_facts
from support.gguf import write_gguf
from support.safetensors import write_safetensors

pytest.importorskip("gguf", reason="the gguf package (dev extra) writes and reads GGUFs")


def test_default_tiny_gguf_facts(tiny_gguf: Path) -> None:
    facts = read_model_facts(tiny_gguf)
    assert facts.format == "gguf"
    assert facts.architecture == "llama"
    assert facts.file_type == "F32"
    assert facts.block_count == 2
    assert facts.embedding_length == 64
    assert facts.feed_forward_length == 128
    assert facts.head_count == 4
    assert facts.kv_heads == (4, 4)
    assert facts.key_length == facts.value_length == 16  # n_embd / n_head
    assert facts.sliding_window == 0
    assert facts.swa_layers == (False, False)
    assert facts.context_length == 512
    assert facts.vocab_size == 259
    assert facts.file_bytes == tiny_gguf.stat().st_size
    # 259x64 embeddings and output, 2 blocks of 4 64x64 + 3 64x128 matrices, 2+1 norms of 64
    assert facts.parameter_count == 2 * 259 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert facts.tensor_bytes == facts.parameter_count * 4


def test_gemma3_shape_with_sliding_window(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "g3.gguf",
        arch="gemma3",
        blocks=13,
        heads=4,
        kv_heads=2,
        head_dim=32,
        context_length=8192,
        sliding_window=256,
    )
    facts = read_model_facts(path)
    assert facts.architecture == "gemma3"
    assert facts.kv_heads == (2,) * 13
    assert facts.head_count_kv == 2
    assert facts.key_length == facts.value_length == 32
    assert facts.sliding_window == 256
    # gemma3: five sliding layers, then one full layer (llama.cpp's pattern of 6)
    full = [i for i, swa in enumerate(facts.swa_layers) if not swa]
    assert full == [5, 11]
    assert facts.context_length == 8192


def test_swa_pattern_rules() -> None:
    assert swa_layers("gemma2", 4, 4096) == (True, False, True, False)
    assert swa_layers("cohere2moe", 5, 4096) == (False, True, True, True, False)
    assert swa_layers("llama", 3, 4096) == (False, False, False)  # no pattern known: full
    assert swa_layers("gemma3", 3, 0) == (False, False, False)  # no window: full
    assert swa_layers("gemma3", 3, 512, [True, False, True]) == (True, False, True)
    assert swa_layers("gemma3", 4, 512, 2) == (True, False, True, False)


def test_not_a_gguf_is_a_rosterd_error_naming_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 16)
    with pytest.raises(ModelFactsError) as info:
        read_model_facts(broken)
    assert isinstance(info.value, RosterdError)
    assert str(broken) in str(info.value)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelFactsError, match="no such file"):
        read_model_facts(tmp_path / "nothing.gguf")


def test_mlx_folder_facts(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "hidden_size": 128,
                "num_hidden_layers": 3,
                "intermediate_size": 256,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16",
            }
        )
    )
    write_safetensors(
        folder / "model.safetensors",
        {"embed.weight": ("BF16", [1000, 128]), "norm.weight": ("BF16", [128])},
    )
    facts = read_model_facts(folder)
    assert facts.format == "mlx"
    assert facts.architecture == "qwen2"
    assert facts.block_count == 3
    assert facts.kv_heads == (2, 2, 2)
    assert facts.key_length == facts.value_length == 16  # 128 / 8 heads
    assert facts.parameter_count == 1000 * 128 + 128
    assert facts.dtype_bytes == 2
    assert facts.file_type == "bfloat16"
    assert facts.tensor_bytes == (folder / "model.safetensors").stat().st_size
    assert facts.context_length == 32768


def test_mlx_text_config_and_head_dim(tmp_path: Path) -> None:
    folder = tmp_path / "vlm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gemma3",
                "quantization": {"bits": 4, "group_size": 64},
                "text_config": {
                    "hidden_size": 640,
                    "num_hidden_layers": 18,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 1,
                    "head_dim": 256,
                    "sliding_window": 512,
                },
            }
        )
    )
    write_safetensors(folder / "model.safetensors", {"w": ("U32", [8, 8]), "s": ("F16", [8])})
    facts = read_model_facts(folder)
    assert (facts.block_count, facts.head_count_kv, facts.key_length) == (18, 1, 256)
    assert facts.file_type == "4-bit"
    assert facts.sliding_window == 512
    assert facts.dtype_bytes == 2


def test_mlx_folder_errors_name_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    with pytest.raises(ModelFactsError, match=r"no config\.json"):
        read_model_facts(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ModelFactsError, match=r"config\.json"):
        read_model_facts(folder)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ModelFactsError, match="num_hidden_layers is missing"):
        read_model_facts(folder)
    (folder / "config.json").write_text(
        json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})
    )
    with pytest.raises(ModelFactsError, match=r"no \*\.safetensors"):
        read_model_facts(folder)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"nope!")
    with pytest.raises(ModelFactsError, match=r"model\.safetensors"):
        read_model_facts(folder)
