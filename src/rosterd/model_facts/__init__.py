"""Model facts: the shapes a memory estimate needs, read from the weights themselves (layer 2).

Files in, frozen facts out; reading is the only I/O. Two kinds of weights, one
module each:

- a GGUF file (llama.cpp): :mod:`~rosterd.model_facts.gguf_file`, its header
  and tensor index (and which layers use sliding-window attention, as llama.cpp
  decides it);
- an MLX model folder: :mod:`~rosterd.model_facts.mlx_folder`, its
  ``config.json`` and the headers of its ``*.safetensors`` files.

The values (:class:`ModelFacts`, :class:`TensorFacts`) are in
:mod:`~rosterd.model_facts.facts`; :func:`read_model_facts` reads either kind.
"""

from __future__ import annotations

from pathlib import Path

from rosterd.errors import ModelFactsError
from rosterd.model_facts.facts import ModelFacts, ModelFormat, TensorFacts
from rosterd.model_facts.gguf_file import (
    SWA_PATTERNS,
    read_gguf_facts,
    read_gguf_header,
    swa_layers,
)
from rosterd.model_facts.mlx_folder import read_mlx_facts

__all__ = [
    "SWA_PATTERNS",
    "ModelFacts",
    "ModelFormat",
    "TensorFacts",
    "read_gguf_facts",
    "read_gguf_header",
    "read_mlx_facts",
    "read_model_facts",
    "swa_layers",
]


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
