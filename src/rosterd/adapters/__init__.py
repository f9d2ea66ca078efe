"""Adapters (DESIGN.md layer 4): one module per flavor behind the ``Adapter`` Protocol.

``ADAPTERS`` is the registry (flavor -> the adapter's class, built with its
defaults) and ``adapter_for(flavor)`` looks it up: adding a backend is one
module and one line here, and nothing else asks which flavor it holds. The
values adapters build (``Launch``, ``HttpProbe``) are what the supervisor runs
and probes; a flavor with one server per node declares ``shared_server``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from rosterd.adapters.base import (
    Adapter,
    HttpProbe,
    Launch,
    SharedServer,
    SlotFile,
    SlotKeeping,
    one_token_completion,
)
from rosterd.adapters.llamacpp import LlamaCppAdapter, find_llama_server
from rosterd.adapters.mlx_lm import MlxLmAdapter
from rosterd.adapters.ollama import OllamaAdapter
from rosterd.errors import AdapterError, OllamaError
from rosterd.memory.estimate import MemoryEstimate
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferFlavor
from rosterd.weights import ResolvedWeights, WeightsSource

__all__ = [
    "ADAPTERS",
    "Adapter",
    "AdapterError",
    "HttpProbe",
    "Launch",
    "LlamaCppAdapter",
    "MlxLmAdapter",
    "OllamaAdapter",
    "OllamaError",
    "ResolvedWeights",
    "SharedServer",
    "SlotFile",
    "SlotKeeping",
    "WeightsSource",
    "adapter_for",
    "estimate_memory",
    "find_llama_server",
    "one_token_completion",
]


#: The adapter of each flavor (a class, called with no arguments for its defaults).
ADAPTERS: Mapping[InferFlavor, Callable[[], Adapter]] = MappingProxyType(
    {
        InferFlavor.LLAMACPP: LlamaCppAdapter,
        InferFlavor.MLX_LM: MlxLmAdapter,
        InferFlavor.OLLAMA: OllamaAdapter,
    }
)


def adapter_for(flavor: InferFlavor) -> Adapter:
    """The default adapter for ``flavor`` from ``ADAPTERS``: llama-server, mlx_lm.server, ollama."""
    return ADAPTERS[flavor]()


def estimate_memory(
    facts: ModelFacts,
    flavor: InferFlavor,
    *,
    ctx_size: int,
    parallel: int,
    extra_args: Sequence[str] = (),
    keep_kv: bool = True,
    cache_ram_mb: int | None = None,
) -> MemoryEstimate:
    """The estimate for ``facts`` served by ``flavor``'s adapter (``Adapter.estimate_memory``).

    ``ctx_size`` (tokens) and ``parallel`` (slots) are what the launch uses: the
    fleet's values or the adapter's defaults (``DEFAULT_CTX_SIZE``/
    ``DEFAULT_PARALLEL`` in ``rosterd.adapters.llamacpp``); ``keep_kv`` and
    ``cache_ram_mb`` as the fleet's ``models:`` entry gives them.

    Raises:
        ValueError: ``ctx_size``/``parallel`` is below 1, or ``flavor`` reads no weights
            (ollama: its server's ``reported_estimate`` says what it holds).
    """
    if ctx_size < 1 or parallel < 1:
        raise ValueError(f"ctx_size ({ctx_size}) and parallel ({parallel}) must be at least 1")
    return adapter_for(flavor).estimate_memory(
        facts,
        ctx_size=ctx_size,
        parallel=parallel,
        extra_args=extra_args,
        keep_kv=keep_kv,
        cache_ram_mb=cache_ram_mb,
    )
