"""The ``llamacpp`` flavor: llama.cpp's ``llama-server`` or llama-cpp-python's server.

Two modes, one adapter:

- ``llama-server`` (default): ``llama-server -m FILE --host H --port P -c CTX
  -np N --alias NAME``. Its port opens before the model is loaded and answers
  ``503`` meanwhile, so readiness is ``GET /health`` returning ``200``.
- ``llama-cpp-python``: ``python -m llama_cpp.server --model FILE --host H
  --port P --n_ctx CTX --model_alias NAME``. It has no ``/health`` and opens its
  port only after the load, so readiness is ``GET /v1/models`` returning 200.

Every llama-server launch passes ``--cache-ram`` (the fleet's ``cache_ram_mb``, else
``DEFAULT_CACHE_RAM_MB``): llama-server's own default keeps up to 8192 MiB of idle
prompts in RAM, which grew one role's RSS 1.85x over twelve conversations here while
rosterd counted none of it; the small bound is counted in the estimate, and the disk
keeps the KV instead. With the KV kept (the default; ``keep_kv: false`` turns it off)
the launch also passes ``--swa-full``: a sliding-window model (gemma 2 and 3) saved
without it restores "successfully" and changes nothing (measured: ``prompt_n`` 3,713 of
3,710 after the restore, 18 with it); on a model without sliding-window layers the flag
changes nothing. ``--slot-save-path`` comes from the backends boundary, which owns the
folder (:class:`LlamaServerSlots`, llama.cpp's ``tools/server`` slot API).

A reranker role (the weights' ``reranking``: the fleet's ``reranking: true``, or a GGUF
whose pooling type is rank; ``rosterd.weights.serves_rerank``) is launched with
``--reranking``, once even when ``extra_args`` has it too: without it llama-server
answers ``/v1/rerank`` with 501 "This server does not support reranking", whatever the
GGUF says (``tools/server/server-context.cpp``). Only such a role serves the ``rerank``
dialect (:meth:`LlamaCppAdapter.dialects_for`); the router refuses the others' rerank
requests before loading them.

Flags are chosen from the built binary's ``--help``; memory-locking flags
changed between llama.cpp versions, so none are passed (operators add theirs
through ``extra_args``). The binary comes from ``scripts/build-llama-server``
(llama.cpp vendored in the llama-cpp-python sdist, cached per version) and is
found by ``find_llama_server``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal

from rosterd.adapters.base import (
    HttpProbe,
    Launch,
    OpenAICompatible,
    ProgressProbe,
    weights_size_hint,
)
from rosterd.adapters.llamacpp_slots import LlamaServerSlots
from rosterd.errors import AdapterError
from rosterd.fleet.model import RERANKING_FLAGS
from rosterd.memory.estimate import (
    LlamaCppSettings,
    MemoryEstimate,
    estimate_llamacpp,
    parse_llamacpp_settings,
)
from rosterd.memory.split import ALL_LAYERS, PoolEstimate, split_llamacpp
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import WeightsSource

#: The llama-cpp-python release whose vendored llama.cpp ``scripts/build-llama-server`` builds.
LLAMA_CPP_PYTHON_VERSION: Final[str] = "0.3.36"

#: Context size (tokens) when neither the fleet file nor the operator gives one.
DEFAULT_CTX_SIZE: Final[int] = 4096

#: Parallel slots when neither the fleet file nor the operator gives a number.
DEFAULT_PARALLEL: Final[int] = 1

#: llama-server's RAM prompt cache (``--cache-ram``, MiB) unless the fleet sets ``cache_ram_mb``:
#: a few conversations' worth (gemma-3 270M: about 30 MiB per 2,300-token prompt), since
#: the disk keeps the KV across stops.
DEFAULT_CACHE_RAM_MB: Final[int] = 64

LlamaCppMode = Literal["llama-server", "llama-cpp-python"]

#: The dialects llama-server serves itself (its routes ``/v1/messages``,
#: ``/v1/messages/count_tokens``, ``/v1/responses``, ``/v1/rerank``, checked on the
#: build ``scripts/build-llama-server`` makes).
LLAMA_SERVER_DIALECTS: Final[frozenset[str]] = frozenset({"messages", "responses", "rerank"})


def reranking_args(*, reranking: bool, extra_args: Sequence[str]) -> tuple[str, ...]:
    """``("--reranking",)`` for a reranker role whose ``extra_args`` do not pass it (or its
    alias ``--rerank``) already, else nothing."""
    return ("--reranking",) if reranking and not RERANKING_FLAGS & set(extra_args) else ()


def kept_kv_args(*, keep_kv: bool, cache_ram_mb: int | None) -> tuple[str, ...]:
    """The llama-server flags that bound its RAM prompt cache and, with the KV kept, make
    a sliding-window model's cache restorable (see the module docstring)."""
    ram = DEFAULT_CACHE_RAM_MB if cache_ram_mb is None else cache_ram_mb
    return ("--cache-ram", str(ram)) + (("--swa-full",) if keep_kv else ())


#: llama-server's flag that sizes itself against the free VRAM at load (``--fit on``, its
#: default; llama.cpp ``common/fit.cpp``): rosterd turns it off where it decided the offload.
FIT_FLAG: Final[str] = "--fit"


#: The log verbosity at which llama-server logs what it allocates on each device as it loads
#: (libllama's information lines: builds with ``--fit`` show them at trace level, 4, through
#: ``common_log_default_callback``; every such build knows ``-lv``). rosterd reads them to
#: count a role's device memory (``rosterd.devices.load_buffers``); it costs about three
#: times the log lines per request (2.8 KB against 0.9 KB, gemma-3-270m on this build).
LOAD_REPORT_ARGS: Final[tuple[str, ...]] = ("-lv", "4")


def pinned_args(device: str | None, gpu_layers: int | None, *, fit_flag: bool) -> tuple[str, ...]:
    """The flags that pin what rosterd decided for a role on a node with devices: its device
    (``--device CUDA0``; ``none``: the CPU alone), its offload (``-ngl``; ``None``: every
    layer) and, where the build has it (``fit_flag``: ``--fit`` in its ``--help``),
    ``--fit off``, so llama-server never resizes itself to the free VRAM and spills to the
    CPU behind rosterd's back (issue 29), and for a role on a device
    :data:`LOAD_REPORT_ARGS`, so that its log says what it allocated there. Empty pins are
    never given: on a node without devices rosterd passes none of these, and llama-server
    runs as before.
    """
    layers = 0 if device is None else (ALL_LAYERS if gpu_layers is None else gpu_layers)
    args = ("--device", device or "none", "-ngl", str(layers))
    if not fit_flag:
        return args
    return (*args, FIT_FLAG, "off", *(LOAD_REPORT_ARGS if device is not None else ()))


def help_lists_fit(help_text: str) -> bool:
    """Whether ``llama-server --help`` output lists ``--fit`` (builds before it have not)."""
    return any(
        token.strip(",") == FIT_FLAG for line in help_text.splitlines() for token in line.split()
    )


def slot_counters(answer: object) -> tuple[int, ...]:
    """What grows while llama-server works, from its ``GET /slots`` answer (a JSON list, one
    object per slot): per slot its task id, ``n_prompt_tokens_processed`` and
    ``next_token``'s ``n_decoded`` (tokens generated; ``next_token`` is a list of them on
    this llama-server, one object on older ones), in slot order.

    llama-server answers ``/slots`` from its main loop (``SERVER_TASK_TYPE_METRICS``),
    between two batches, so an answer at all says the loop turns; measured on the
    cached llama-server (gemma-3-270m, one slot, a 6,000-token prompt): ``/slots``
    answered in 27-192 ms throughout the 39 s prefill, and ``n_prompt_tokens_processed``
    moved once per 2,048-token batch (about 13 s apart there).

    Raises:
        ValueError: ``answer`` is not a list of slot objects.
    """
    if not isinstance(answer, list):
        raise ValueError(f"/slots answered {type(answer).__name__}, not a list of slots")
    counters: list[int] = []
    for slot in answer:
        if not isinstance(slot, dict):
            raise ValueError("/slots answered a list holding something other than slots")
        next_token = slot.get("next_token")
        # This llama-server answers a list (one entry per sequence); older ones an object.
        # Read only the object, generation never counted as progress here and a healthy
        # answer longer than the progress window was cut as wedged.
        entries = next_token if isinstance(next_token, list) else [next_token]
        decoded = sum(
            e["n_decoded"]
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("n_decoded"), int)
        )
        for value in (slot.get("id_task", -1), slot.get("n_prompt_tokens_processed", 0), decoded):
            counters.append(value if isinstance(value, int) else 0)
    return tuple(counters)


def llama_server_cache_path(env: Mapping[str, str] | None = None) -> Path:
    """Where ``scripts/build-llama-server`` installs the binary.

    ``${XDG_CACHE_HOME:-$HOME/.cache}/rosterd/llama.cpp-<version>/bin/llama-server``;
    ``env`` defaults to ``os.environ``.
    """
    env = os.environ if env is None else env
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return (
        Path(cache) / "rosterd" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"
    )


def find_llama_server(env: Mapping[str, str] | None = None) -> Path:
    """The ``llama-server`` binary to run.

    Looks at ``$ROSTERD_LLAMA_SERVER``, then the build cache
    (``llama_server_cache_path``), then ``llama-server`` on ``PATH``.

    Raises:
        AdapterError: none found (or ``$ROSTERD_LLAMA_SERVER`` is not an
            executable file); the message says to run ``scripts/build-llama-server``.
    """
    env = os.environ if env is None else env
    override = env.get("ROSTERD_LLAMA_SERVER")
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise AdapterError(
            f"ROSTERD_LLAMA_SERVER={override} is not an executable file; "
            "point it at a llama-server binary or unset it"
        )
    cached = llama_server_cache_path(env)
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path:
        return Path(on_path)
    raise AdapterError(
        f"llama-server not found (looked at $ROSTERD_LLAMA_SERVER, {cached} and PATH); "
        "run scripts/build-llama-server to build it"
    )


@dataclass(frozen=True, slots=True)
class LlamaCppAdapter(OpenAICompatible):
    """Builds launches for the ``llamacpp`` flavor.

    ``mode`` picks the server (see the module docstring); ``server_binary`` is
    the ``llama-server`` to run (``None``: ``find_llama_server()`` at launch
    time); ``python`` is the interpreter for the llama-cpp-python mode.
    """

    mode: LlamaCppMode = "llama-server"
    server_binary: Path | None = None
    python: str = sys.executable

    @property
    def flavor(self) -> InferFlavor:
        """Always ``InferFlavor.LLAMACPP``."""
        return InferFlavor.LLAMACPP

    @property
    def shared_server(self) -> None:
        """``None``: one server process per role."""
        return None

    @property
    def slot_keeping(self) -> LlamaServerSlots | None:
        """llama-server's slot API; ``None`` for llama-cpp-python's server, which has none."""
        return LlamaServerSlots() if self.mode == "llama-server" else None

    @property
    def native_dialects(self) -> frozenset[str]:
        """llama-server's own routes: ``/v1/messages`` (and ``count_tokens``),
        ``/v1/responses`` and ``/v1/rerank`` (this build's binary serves all three; rerank
        only when started with ``--reranking``, see :meth:`dialects_for`);
        llama-cpp-python's server has chat completions only."""
        if self.mode == "llama-server":
            return LLAMA_SERVER_DIALECTS
        return frozenset()

    def dialects_for(self, source: WeightsSource | None) -> frozenset[str]:
        """The dialects a role served from ``source`` answers: :attr:`native_dialects`,
        less ``rerank`` unless it is a reranker: its ``reranking`` is true (resolved weights
        settle it, ``rosterd.weights.serves_rerank``; a fleet entry says so or not) or its
        ``extra_args`` pass ``--reranking``. ``None`` (nothing known here): no rerank."""
        if source is not None and (
            getattr(source, "reranking", None) is True or RERANKING_FLAGS & set(source.extra_args)
        ):
            return self.native_dialects
        return self.native_dialects - {"rerank"}

    @property
    def progress_probe(self) -> ProgressProbe | None:
        """llama-server's ``GET /slots`` read by :func:`slot_counters`; ``None`` for
        llama-cpp-python's server, which has no ``/slots``."""
        if self.mode != "llama-server":
            return None
        return ProgressProbe(path="/slots", counters=slot_counters)

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
        """llama-server's own sizing for the GGUF's ``facts`` (``estimate_llamacpp``), with the
        flags the launch adds (``kept_kv_args``: the prompt cache's bound, counted whole, and
        ``--swa-full``'s full-size cache when the KV is kept) and the cache types, batch
        sizes and flags that ``extra_args`` set (which win, coming later)."""
        return estimate_llamacpp(
            facts, self._settings(ctx_size, parallel, extra_args, keep_kv, cache_ram_mb)
        )

    def split_memory(
        self,
        facts: ModelFacts,
        *,
        ctx_size: int,
        parallel: int,
        extra_args: Sequence[str],
        keep_kv: bool = True,
        cache_ram_mb: int | None = None,
        gpu_layers: int = ALL_LAYERS,
    ) -> PoolEstimate:
        """:meth:`estimate_memory` split between a device and the host for ``-ngl gpu_layers``
        (``split_llamacpp``), with the same settings."""
        settings = self._settings(ctx_size, parallel, extra_args, keep_kv, cache_ram_mb)
        return split_llamacpp(facts, settings, gpu_layers)

    def _settings(
        self,
        ctx_size: int,
        parallel: int,
        extra_args: Sequence[str],
        keep_kv: bool,
        cache_ram_mb: int | None,
    ) -> LlamaCppSettings:
        args: tuple[str, ...] = ()
        if self.mode == "llama-server":
            args = kept_kv_args(keep_kv=keep_kv, cache_ram_mb=cache_ram_mb)
        settings = parse_llamacpp_settings(ctx_size, parallel, (*args, *extra_args))
        if self.mode != "llama-server":
            settings = replace(settings, cache_ram_mib=0)  # llama-cpp-python keeps none
        return settings

    def launch(
        self,
        spec: InferenceSpec,
        source: WeightsSource,
        *,
        host: str,
        port: int,
        pins: Sequence[str] = (),
    ) -> Launch:
        """The launch serving ``source.path`` (a ``.gguf`` file) under the role's model name.

        ``pins``: :func:`pinned_args` for a role placed on a node with devices (empty
        otherwise, and llama-server's argv is as it always was); they come last, so the
        device and offload rosterd decided win over ``extra_args``.

        The served name (``--alias`` / ``--model_alias``) is ``spec.model`` or,
        without one, the role id. ``ctx_size``/``parallel`` default to
        ``DEFAULT_CTX_SIZE``/``DEFAULT_PARALLEL``.

        Raises:
            AdapterError: the weights are not a ``.gguf`` file path, the served
                name has a comma (llama-server splits aliases on commas), or the
                llama-server binary cannot be found.
        """
        if spec.flavor is not InferFlavor.LLAMACPP:
            raise AdapterError(f"role {spec.role} is {spec.flavor.id}, not llamacpp")
        weights = source.path
        if weights.suffix.lower() != ".gguf":
            raise AdapterError(
                f"role {spec.role}: llama.cpp needs a .gguf file, got {weights}; "
                "set its path in the fleet file's models: map"
            )
        served = spec.model or spec.role
        if "," in served:
            # llama-server splits --alias on commas into several names.
            raise AdapterError(f"role {spec.role}: model name {served!r} contains a comma")
        ctx = source.ctx_size or DEFAULT_CTX_SIZE
        parallel = source.parallel or DEFAULT_PARALLEL
        if self.mode == "llama-server":
            binary = self.server_binary or find_llama_server()
            argv: tuple[str, ...] = (
                str(binary),
                "-m",
                str(weights),
                "--host",
                host,
                "--port",
                str(port),
                "-c",
                str(ctx),
                "-np",
                str(parallel),
                "--alias",
                served,
                *kept_kv_args(
                    keep_kv=bool(getattr(source, "keep_kv", True)),
                    cache_ram_mb=getattr(source, "cache_ram_mb", None),
                ),
                *reranking_args(
                    reranking=bool(getattr(source, "reranking", False)),
                    extra_args=source.extra_args,
                ),
                *source.extra_args,
                *pins,
            )
            readiness = HttpProbe(method="GET", path="/health")
        else:
            argv = (
                self.python,
                "-m",
                "llama_cpp.server",
                "--model",
                str(weights),
                "--host",
                host,
                "--port",
                str(port),
                "--n_ctx",
                str(ctx),
                "--model_alias",
                served,
                *source.extra_args,
            )
            readiness = HttpProbe(method="GET", path="/v1/models")
        return Launch(
            argv=argv,
            host=host,
            port=port,
            readiness=readiness,
            served_model=served,
            weights_bytes=weights_size_hint(spec, source),
        )
