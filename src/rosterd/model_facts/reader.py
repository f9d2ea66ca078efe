"""Read a model's facts from its weights, of either kind (layer 2; reading is the only I/O).

A ``.gguf`` file goes to :mod:`~rosterd.model_facts.gguf_file`, an MLX model folder to
:mod:`~rosterd.model_facts.mlx_folder`.
"""

from __future__ import annotations

from pathlib import Path

from rosterd.errors import ModelFactsError
from rosterd.model_facts.facts import ModelFacts
from rosterd.model_facts.gguf_file import read_gguf_facts
from rosterd.model_facts.mlx_folder import read_mlx_facts


def read_model_facts(path: Path) -> ModelFacts:
    """The facts of the weights at ``path``: a ``.gguf`` file or an MLX model folder.

    Raises:
        ModelFactsError: ``path`` does not exist, is neither a GGUF file nor a
            folder with ``config.json``, or its metadata is unreadable or lacks
            a field the estimate needs (the message names the file and field).
    """
    if path.is_dir():
        return read_mlx_facts(path)
    if path.is_file():
        return read_gguf_facts(path)
    raise ModelFactsError(f"{path}: no such file or folder")
