"""Model facts, the values (layer 2): the shapes a memory estimate needs, as read from the
weights themselves by :mod:`~rosterd.model_facts.gguf_file` and
:mod:`~rosterd.model_facts.mlx_folder`. Frozen values; no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

ModelFormat = Literal["gguf", "mlx"]

#: llama.cpp's ``LLAMA_POOLING_TYPE_RANK`` (``include/llama.h``): a GGUF written with it is a
#: reranker (Qwen3-Reranker's, bge-reranker's), which llama-server serves with ``--reranking``.
POOLING_TYPE_RANK: Final[int] = 4


@dataclass(frozen=True, slots=True)
class TensorFacts:
    """One tensor of a GGUF: ``name``, ggml ``type_name`` (``Q4_K``, ``F32``, …), ``shape``
    (ggml order, fastest dimension first) and ``n_bytes`` of data in the file."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a model's own files say about its shape.

    ``path`` is the file (GGUF) or folder (MLX) read; ``file_bytes`` its size on
    disk (every file in the folder for MLX); ``tensor_bytes`` the bytes of tensor
    data. ``architecture`` is GGUF's ``general.architecture`` or the config's
    ``model_type``; ``file_type`` the quantization (``Q4_K_M``, ``F32``, or for
    MLX ``4-bit`` / the dtype). ``kv_heads`` and ``swa_layers`` hold one entry
    per layer (``block_count`` of them); ``sliding_window`` is in tokens (0:
    none). ``key_length``/``value_length`` are per head. ``context_length`` is
    the trained context (tokens). ``dtype_bytes`` is the element size mlx_lm
    keeps its KV cache in (0 for GGUF, whose cache type is a serving setting).
    ``tensors`` lists a GGUF's tensors (empty for MLX).
    """

    path: Path
    format: ModelFormat
    architecture: str
    name: str
    parameter_count: int
    file_type: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    kv_heads: tuple[int, ...]
    key_length: int
    value_length: int
    sliding_window: int
    swa_layers: tuple[bool, ...]
    context_length: int
    vocab_size: int
    file_bytes: int
    tensor_bytes: int
    dtype_bytes: int = 0
    tensors: tuple[TensorFacts, ...] = ()

    @property
    def head_count_kv(self) -> int:
        """The largest per-layer KV head count (what a one-number view shows)."""
        return max(self.kv_heads, default=0)
