"""Write a tiny random llama-, gemma3- or qwen3-architecture GGUF that llama-server loads in
milliseconds.

    python scripts/make_tiny_gguf.py OUT.gguf [--seed N] [--arch llama|gemma3|qwen3]
        [--blocks N] [--embd N] [--heads N] [--kv-heads N] [--head-dim N]
        [--ff N] [--context-length N] [--sliding-window N] [--rerank] [--hybrid ARCH]

Importable as well: ``write_tiny_gguf(path, seed=0, **shape)``. The default model
has 2 blocks, n_embd 64, 4 heads, a 128-wide feed-forward and a byte-level
SentencePiece-style vocabulary (``tokenizer.ggml.model = llama``: ``<unk>``,
``<s>``, ``</s>`` and the 256 byte tokens ``<0x00>``..``<0xFF>``), so any text
tokenizes through byte fallback. The shape options give models with known KV
cache shapes (grouped-query attention through ``kv_heads``, a head size of its
own through ``head_dim``, gemma3's interleaved sliding-window attention through
``arch="gemma3"`` and ``sliding_window``), which the memory estimator's tests
count exactly. Weights are random F32 (seeded), so it writes garbage text, which
is all a test of process handling or memory needs. Written with the ``gguf``
package (llama.cpp's own GGUF writer).

``rerank=True`` (``--rerank``) writes a reranker as Qwen3-Reranker's GGUFs are
laid out: architecture ``qwen3``, ``qwen3.pooling_type`` = 4 (llama.cpp's
``LLAMA_POOLING_TYPE_RANK``) and the one-label classifier head ``cls.output.weight``
(``[n_embd, 1]``), which llama.cpp's ``src/models/qwen3.cpp`` loads and
``build_pooling`` (``src/llama-graph.cpp``) applies to the last token's state.
``llama-server --reranking`` then answers ``/v1/rerank`` with one random score per
document: the answer's shape, not its quality.

``hybrid="lfm2"`` (``--hybrid ARCH``, one of :data:`HYBRID_ARCHITECTURES`) writes the
same model's header and tensors under a hybrid architecture's name (attention layers
among recurrent ones, as llama.cpp's ``llm_arch_is_hybrid`` lists them): what rosterd
reads from the header (``rosterd.model_facts.slot_reuse``: a restored slot of such a
model cannot serve, so its KV cache is not kept). Its recurrent layers' tensors are not
written, so llama-server refuses to load it; a test serves it with a stand-in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

import gguf
import numpy as np

N_EMBD: Final[int] = 64
N_HEAD: Final[int] = 4
N_FF: Final[int] = 128
N_BLOCKS: Final[int] = 2
CONTEXT_LENGTH: Final[int] = 512
SPECIAL_TOKENS: Final[tuple[str, ...]] = ("<unk>", "<s>", "</s>")
ARCHITECTURES: Final[tuple[str, ...]] = ("llama", "gemma3", "qwen3")
#: Hybrid architectures ``hybrid`` may name (GGUF names, llama.cpp's ``LLM_ARCH_NAMES``).
HYBRID_ARCHITECTURES: Final[tuple[str, ...]] = ("lfm2", "qwen35", "jamba", "granitehybrid")
#: llama.cpp's ``LLAMA_POOLING_TYPE_RANK`` (``include/llama.h``): the GGUF is a reranker.
POOLING_TYPE_RANK: Final[int] = 4
#: Architectures whose attention normalises Q and K per head (``attn_q_norm``/``attn_k_norm``).
_QK_NORM_ARCHITECTURES: Final[tuple[str, ...]] = ("gemma3", "qwen3")


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the byte-level vocabulary."""
    tokens = [*SPECIAL_TOKENS, *(f"<0x{b:02X}>" for b in range(256))]
    scores = [0.0] * len(tokens)
    types = [
        int(gguf.TokenType.UNKNOWN),
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.CONTROL),
        *([int(gguf.TokenType.BYTE)] * 256),
    ]
    return tokens, scores, types


def write_tiny_gguf(
    path: Path | str,
    seed: int = 0,
    *,
    arch: str = "llama",
    blocks: int = N_BLOCKS,
    embd: int = N_EMBD,
    heads: int = N_HEAD,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    ff: int = N_FF,
    context_length: int = CONTEXT_LENGTH,
    sliding_window: int = 0,
    rerank: bool = False,
    hybrid: str | None = None,
) -> Path:
    """Write the tiny model to ``path`` (overwritten) and return it as a ``Path``.

    Different ``seed`` values give different weights (and file contents). The
    defaults write the same file as ever. ``kv_heads`` defaults to ``heads``;
    ``head_dim`` (key and value length) to ``embd // heads`` and, when given,
    is written as ``key_length``/``value_length``; ``sliding_window`` (tokens,
    gemma3 only, 0 for none) makes every layer but each sixth one a sliding-window
    layer, as llama.cpp reads gemma3. ``rerank`` writes a qwen3 reranker (see the
    module docstring); ``arch`` must then be ``qwen3`` or left at its default.
    ``hybrid``: the header's architecture, one of :data:`HYBRID_ARCHITECTURES` (see the
    module docstring; the model is ``arch``'s otherwise).

    Raises:
        ValueError: an unknown ``arch`` or ``hybrid``, a reranker of another architecture
            than qwen3, or a shape that does not divide.
    """
    if hybrid is not None and hybrid not in HYBRID_ARCHITECTURES:
        raise ValueError(f"hybrid must be one of {', '.join(HYBRID_ARCHITECTURES)}, not {hybrid!r}")
    if rerank:
        if arch not in ("llama", "qwen3"):
            raise ValueError(f"a reranker is written as qwen3, not {arch!r}")
        arch = "qwen3"
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, not {arch!r}")
    n_kv_heads = heads if kv_heads is None else kv_heads
    if heads % n_kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({n_kv_heads})")
    n_head_dim = embd // heads if head_dim is None else head_dim
    out = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(out), hybrid or arch)
    writer.add_name(f"rosterd-tiny-{hybrid or arch}{'-rerank' if rerank else ''}-{seed}")
    writer.add_context_length(context_length)
    writer.add_embedding_length(embd)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(n_kv_heads)
    if head_dim is not None:
        writer.add_key_length(n_head_dim)
        writer.add_value_length(n_head_dim)
    if arch == "gemma3" and sliding_window > 0:
        writer.add_sliding_window(sliding_window)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_head_dim)
    writer.add_vocab_size(n_vocab)
    if rerank:
        writer.add_pooling_type(gguf.PoolingType(POOLING_TYPE_RANK))
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    q_width = n_head_dim * heads
    kv_width = n_head_dim * n_kv_heads
    writer.add_tensor("token_embd.weight", matrix(n_vocab, embd))
    for block in range(blocks):
        prefix = f"blk.{block}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones(embd))
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(q_width, embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", matrix(kv_width, embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", matrix(kv_width, embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", matrix(embd, q_width))
        if arch in _QK_NORM_ARCHITECTURES:
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", ones(n_head_dim))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", ones(n_head_dim))
        if arch == "gemma3":
            writer.add_tensor(f"{prefix}.post_attention_norm.weight", ones(embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones(embd))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", matrix(ff, embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(ff, embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", matrix(embd, ff))
        if arch == "gemma3":
            writer.add_tensor(f"{prefix}.post_ffw_norm.weight", ones(embd))
    writer.add_tensor("output_norm.weight", ones(embd))
    writer.add_tensor("output.weight", matrix(n_vocab, embd))
    if rerank:
        writer.add_tensor("cls.output.weight", matrix(1, embd))  # one label: the score

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: write ``OUT`` and print its path and size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--arch", choices=ARCHITECTURES, default="llama")
    parser.add_argument("--blocks", type=int, default=N_BLOCKS, help="layers")
    parser.add_argument("--embd", type=int, default=N_EMBD, help="embedding length")
    parser.add_argument("--heads", type=int, default=N_HEAD, help="attention heads")
    parser.add_argument("--kv-heads", type=int, default=None, help="KV heads (default: heads)")
    parser.add_argument("--head-dim", type=int, default=None, help="key/value length per head")
    parser.add_argument("--ff", type=int, default=N_FF, help="feed-forward length")
    parser.add_argument("--context-length", type=int, default=CONTEXT_LENGTH)
    parser.add_argument(
        "--sliding-window", type=int, default=0, help="gemma3 sliding window (tokens, 0: none)"
    )
    parser.add_argument(
        "--rerank", action="store_true", help="a qwen3 reranker (pooling type rank, cls head)"
    )
    parser.add_argument(
        "--hybrid",
        choices=HYBRID_ARCHITECTURES,
        default=None,
        help="write the header under this hybrid architecture (llama-server cannot load it)",
    )
    args = parser.parse_args(argv)
    path = write_tiny_gguf(
        args.out,
        seed=args.seed,
        arch=args.arch,
        blocks=args.blocks,
        embd=args.embd,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        ff=args.ff,
        context_length=args.context_length,
        sliding_window=args.sliding_window,
        rerank=args.rerank,
        hybrid=args.hybrid,
    )
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
