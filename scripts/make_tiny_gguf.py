"""Write a tiny random llama-architecture GGUF that llama-server loads in milliseconds.

    python scripts/make_tiny_gguf.py OUT.gguf [--seed N]

Importable as well: ``write_tiny_gguf(path, seed=0)``. The model has 2 blocks,
n_embd 64, 4 heads, a 128-wide feed-forward and a byte-level
SentencePiece-style vocabulary (``tokenizer.ggml.model = llama``: ``<unk>``,
``<s>``, ``</s>`` and the 256 byte tokens ``<0x00>``..``<0xFF>``), so any text
tokenizes through byte fallback. Weights are random F32 (seeded), so it writes
garbage text, which is all a test of process handling needs. Written with the
``gguf`` package (llama.cpp's own GGUF writer).
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


def write_tiny_gguf(path: Path | str, seed: int = 0) -> Path:
    """Write the tiny model to ``path`` (overwritten) and return it as a ``Path``.

    Different ``seed`` values give different weights (and file contents).
    """
    out = Path(path)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"rosterd-tiny-llama-{seed}")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_BLOCKS)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_vocab_size(n_vocab)
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

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer.add_tensor("token_embd.weight", matrix(n_vocab, N_EMBD))
    for block in range(N_BLOCKS):
        prefix = f"blk.{block}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones.copy())
        writer.add_tensor(f"{prefix}.attn_q.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_k.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_v.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.attn_output.weight", matrix(N_EMBD, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones.copy())
        writer.add_tensor(f"{prefix}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_up.weight", matrix(N_FF, N_EMBD))
        writer.add_tensor(f"{prefix}.ffn_down.weight", matrix(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones.copy())
    writer.add_tensor("output.weight", matrix(n_vocab, N_EMBD))

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
    args = parser.parse_args(argv)
    path = write_tiny_gguf(args.out, seed=args.seed)
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
