"""Model facts: the shapes a memory estimate needs, read from the weights themselves (layer 2).

Files in, frozen facts out; reading is the only I/O. Two kinds of weights, one
module each:

- a GGUF file (llama.cpp): :mod:`~rosterd.model_facts.gguf_file`, its header
  and tensor index (and which layers use sliding-window attention, as llama.cpp
  decides it);
- an MLX model folder: :mod:`~rosterd.model_facts.mlx_folder`, its
  ``config.json`` and the headers of its ``*.safetensors`` files.

The values (:class:`ModelFacts`, :class:`TensorFacts`) are in
:mod:`~rosterd.model_facts.facts`, re-exported here;
:func:`~rosterd.model_facts.reader.read_model_facts` reads either kind. The readers
are not re-exported: the pure memory estimate imports the values, and must not
import the file readers (mmap, gguf) along with them.
"""

from __future__ import annotations

from rosterd.model_facts.facts import POOLING_TYPE_RANK, ModelFacts, ModelFormat, TensorFacts

__all__ = ["POOLING_TYPE_RANK", "ModelFacts", "ModelFormat", "TensorFacts"]
