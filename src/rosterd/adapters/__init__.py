"""Adapters (DESIGN.md layer 4): one module per flavor behind the ``Adapter`` Protocol.

``adapter_for(flavor)`` gives the default adapter of a flavor; the values they
build (``Launch``, ``HttpProbe``) are what the supervisor runs and probes.
"""

from __future__ import annotations

from rosterd.adapters.base import (
    Adapter,
    AdapterError,
    HttpProbe,
    Launch,
    ResolvedWeights,
    WeightsSource,
    one_token_completion,
)
from rosterd.adapters.llamacpp import LlamaCppAdapter, find_llama_server
from rosterd.adapters.mlx_lm import MlxLmAdapter
from rosterd.adapters.ollama import OllamaAdapter, OllamaError
from rosterd.spec import InferFlavor

__all__ = [
    "Adapter",
    "AdapterError",
    "HttpProbe",
    "Launch",
    "LlamaCppAdapter",
    "MlxLmAdapter",
    "OllamaAdapter",
    "OllamaError",
    "ResolvedWeights",
    "WeightsSource",
    "adapter_for",
    "find_llama_server",
    "one_token_completion",
]


def adapter_for(flavor: InferFlavor) -> Adapter:
    """The default adapter for ``flavor``: llama-server, mlx_lm.server or ollama."""
    if flavor is InferFlavor.LLAMACPP:
        return LlamaCppAdapter()
    if flavor is InferFlavor.MLX_LM:
        return MlxLmAdapter()
    return OllamaAdapter()
