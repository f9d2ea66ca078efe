"""The ``mlx_lm`` flavor: ``mlx_lm.server`` serving one MLX model folder.

``python -m mlx_lm server --model PATH --host H --port P``. On Linux it runs on
the CPU through the ``mlx-lm[cpu]`` extra (plain ``mlx-lm`` installs no mlx
there). Its ``/health`` answers 200 before the model is loaded, so readiness is
a one-token completion. The server would download any other model a request
names, so requests are rewritten to the path it was launched with, and it runs
with ``HF_HUB_OFFLINE=1`` (and the operator's ``HF_HUB_CACHE`` when given):
nothing is downloaded at serve time.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rosterd.adapters.base import Launch, OpenAICompatible, one_token_completion, weights_size_hint
from rosterd.errors import AdapterError
from rosterd.memory.estimate import MemoryEstimate, estimate_mlx
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import WeightsSource

#: The least SIGTERM-to-SIGKILL time of an ``mlx_lm.server``, seconds: on SIGTERM it gives
#: back the GPU memory Metal wired for it within seconds; a SIGKILL can leave that memory
#: wired until a reboot (omlx#2184), so the grace is long.
MLX_STOP_GRACE_S = 30.0
MLX_SIGKILL_NOTE = (
    "an mlx_lm.server SIGKILLed can leave the GPU memory Metal wired for it held until "
    "a reboot; raise the role's grace_s in the fleet file if it needs longer to exit"
)


@dataclass(frozen=True, slots=True)
class MlxLmAdapter(OpenAICompatible):
    """Builds launches for the ``mlx_lm`` flavor.

    ``python`` is the interpreter that has ``mlx_lm`` installed; ``hf_hub_cache``
    (a folder, or ``None``) is passed to the server as ``HF_HUB_CACHE``.
    """

    python: str = sys.executable
    hf_hub_cache: str | None = None

    @property
    def flavor(self) -> InferFlavor:
        """Always ``InferFlavor.MLX_LM``."""
        return InferFlavor.MLX_LM

    @property
    def shared_server(self) -> None:
        """``None``: one ``mlx_lm.server`` process per role."""
        return None

    @property
    def slot_keeping(self) -> None:
        """``None``: mlx_lm.server has no API to save or restore its prompt cache, which
        lives only in its process's memory and goes with it."""
        return None

    def estimate_memory(
        self,
        facts: ModelFacts,
        *,
        ctx_size: int,
        parallel: int,
        extra_args: Sequence[str],
        keep_kv: bool = True,
        cache_ram_mb: int | None = None,
    ) -> MemoryEstimate:
        """mlx_lm.server's figure for the MLX folder's ``facts`` (``estimate_mlx``): the
        safetensors, a KV cache of ``ctx_size`` tokens per slot, the Python process.
        ``extra_args`` change none of it."""
        return estimate_mlx(facts, ctx_size, parallel)

    def launch(self, spec: InferenceSpec, source: WeightsSource, *, host: str, port: int) -> Launch:
        """The launch serving the model folder ``source.path``; served name is that path.

        ``ctx_size``/``parallel`` do not apply to mlx_lm.server and are ignored;
        ``extra_args`` are appended.

        Raises:
            AdapterError: the spec is not ``mlx_lm``, or the weights path is a
                single file (mlx_lm needs a model folder with ``config.json``).
        """
        if spec.flavor is not InferFlavor.MLX_LM:
            raise AdapterError(f"role {spec.role} is {spec.flavor.id}, not mlx_lm")
        if source.path.suffix.lower() in {".gguf", ".bin", ".safetensors"}:
            raise AdapterError(
                f"role {spec.role}: mlx_lm needs a model folder, got the file {source.path}"
            )
        served = str(source.path)
        env = {"HF_HUB_OFFLINE": "1"}
        if self.hf_hub_cache:
            env["HF_HUB_CACHE"] = self.hf_hub_cache
        argv = (
            self.python,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            served,
            "--host",
            host,
            "--port",
            str(port),
            *source.extra_args,
        )
        return Launch(
            argv=argv,
            host=host,
            port=port,
            readiness=one_token_completion(served),
            served_model=served,
            env=env,
            weights_bytes=weights_size_hint(spec, source),
            stop_grace_s=MLX_STOP_GRACE_S,
            sigkill_note=MLX_SIGKILL_NOTE,
        )
