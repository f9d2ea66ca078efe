"""Write a tiny random MLX llama model folder that mlx_lm.server loads in about a second.

Built with mlx_lm's own ``llama`` model class (2 layers, hidden size 64, 4 heads), random
weights saved as ``model.safetensors``, and a small byte-level BPE vocabulary trained with
``tokenizers`` on one sentence, so ``transformers`` loads it offline. It writes garbage,
which is all a process-handling test needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast


def write_tiny_mlx_model(folder: Path, seed: int = 0) -> Path:
    """Write ``config.json``, ``model.safetensors`` and a tokenizer into ``folder``; return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["hello world, the capital of france is paris"] * 8, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "model_max_length": 512,
            }
        )
    )
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-5,
        "vocab_size": tokenizer.get_vocab_size(),
        "tie_word_embeddings": True,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    # mlx_lm has no type hints; its from_dict keeps only ModelArgs' fields.
    model_args = cast(Callable[[dict[str, Any]], Any], llama.ModelArgs.from_dict)(config)
    model = llama.Model(model_args)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder
