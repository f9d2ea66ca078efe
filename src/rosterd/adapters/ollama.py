"""The ``ollama`` flavor: one shared ``ollama serve`` per node, models made resident by API.

Unlike the other flavors a role is not a process. The node runs one
``ollama serve`` (``server_launch``); a role becomes resident through a
generate call with ``keep_alive: -1`` (``load``), is evicted with
``keep_alive: 0`` (``unload``), and residency is read from ``GET /api/ps``
(``resident``), as Ollama's API documentation describes. The launch builders
are pure; the three helpers are small async httpx calls (httpx, the project's
HTTP client, async so the scheduler's event loop never blocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import httpx

from rosterd.adapters.base import HttpProbe, Launch, rewrite_model_field, weights_size_hint
from rosterd.errors import AdapterError, OllamaError
from rosterd.memory.estimate import MemoryEstimate, estimate_ollama
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import WeightsSource

#: Ollama's own default port.
DEFAULT_OLLAMA_PORT: Final[int] = 11434


@dataclass(frozen=True, slots=True)
class OllamaAdapter:
    """Builds the shared ``ollama serve`` launch and talks to it.

    ``binary`` is the ``ollama`` executable (name on ``PATH`` or a path).
    """

    binary: str = "ollama"

    @property
    def flavor(self) -> InferFlavor:
        """Always ``InferFlavor.OLLAMA``."""
        return InferFlavor.OLLAMA

    @property
    def shared_server(self) -> OllamaAdapter:
        """Itself: ``server_launch`` once per node, then ``load``/``unload`` roles into it."""
        return self

    @property
    def slot_keeping(self) -> None:
        """``None``: ollama has no API to save or restore a model's KV cache; its runner
        keeps the cache only while the model stays loaded."""
        return None

    @property
    def serves_ollama_api(self) -> bool:
        """``True``: ``ollama serve`` answers Ollama's API itself, so it is passed through."""
        return True

    @property
    def progress_probe(self) -> None:
        """``None``: ollama's API says nothing of a request under way (``/api/ps`` lists the
        loaded models only), so its requests keep the first-byte deadline."""
        return None

    @property
    def default_port(self) -> int:
        """``DEFAULT_OLLAMA_PORT``, where ``ollama serve`` listens unless told otherwise."""
        return DEFAULT_OLLAMA_PORT

    def server_launch(self, *, host: str, port: int = DEFAULT_OLLAMA_PORT) -> Launch:
        """The node's one ``ollama serve``, listening on ``host``:``port`` (``OLLAMA_HOST``).

        Readiness is ``GET /api/version`` 200. ``served_model`` is empty: the
        server itself serves no model until one is loaded.
        """
        return Launch(
            argv=(self.binary, "serve"),
            host=host,
            port=port,
            readiness=HttpProbe(method="GET", path="/api/version"),
            served_model="",
            env={"OLLAMA_HOST": f"{host}:{port}"},
        )

    def launch(
        self, spec: InferenceSpec, source: WeightsSource | None, *, host: str, port: int
    ) -> Launch:
        """The shared server's launch, naming the role's model as ``served_model``.

        ``source`` is ignored (ollama keeps its own model store); starting this
        launch twice on a node would fail on the port, so the scheduler starts
        it once and then calls ``load``.

        Raises:
            AdapterError: the spec is not ``ollama`` or names no model.
        """
        if spec.flavor is not InferFlavor.OLLAMA:
            raise AdapterError(f"role {spec.role} is {spec.flavor.id}, not ollama")
        if not spec.model:
            raise AdapterError(f"role {spec.role}: an ollama role needs a model name (tag)")
        base = self.server_launch(host=host, port=port)
        return Launch(
            argv=base.argv,
            host=host,
            port=port,
            readiness=base.readiness,
            served_model=spec.model,
            env=base.env,
            weights_bytes=weights_size_hint(spec, source) if source is not None else 0,
        )

    @property
    def native_dialects(self) -> frozenset[str]:
        """``messages``: Ollama serves Anthropic's ``/v1/messages`` itself since 0.14."""
        return frozenset({"messages"})

    def dialects_for(self, source: WeightsSource | None) -> frozenset[str]:
        """:attr:`native_dialects`: ollama's routes do not depend on the model."""
        return self.native_dialects

    def generation_probe(self, served_model: str) -> HttpProbe:
        """``POST /api/generate`` for one token (``num_predict: 1``), expecting ``response``."""
        return HttpProbe(
            method="POST",
            path="/api/generate",
            json={
                "model": served_model,
                "prompt": "Hi",
                "stream": False,
                "options": {"num_predict": 1, "temperature": 0.0},
            },
            ok_status=frozenset({200}),
            expect_json_key="response",
        )

    def rewrite_request(self, body: Mapping[str, object], served_model: str) -> dict[str, object]:
        """``body`` with ``model`` set to the role's ollama tag."""
        return rewrite_model_field(body, served_model)

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
        """Never: ollama keeps its own weights, so there are no facts to read.

        Raises:
            ValueError: always; :meth:`reported_estimate` says what ollama holds.
        """
        raise ValueError("ollama roles are estimated with estimate_ollama, not from model facts")

    def reported_estimate(
        self, reported_bytes: int | None, declared_bytes: int
    ) -> tuple[MemoryEstimate | None, str]:
        """Ollama reports its size only once it loaded a model (``/api/ps``: weights, KV cache
        and buffers together): that size as the estimate (``estimate_ollama``), or none
        before its first load (the roster's figure stands)."""
        if reported_bytes is None:
            return None, (
                "ollama reports its size only once loaded; the roster's figure stands until then"
            )
        estimate = estimate_ollama(reported_bytes, declared_bytes)
        return estimate, "the size ollama reported (/api/ps) when it last held the model"

    async def load(self, client: httpx.AsyncClient, model: str, *, timeout_s: float) -> None:
        """Make ``model`` resident until unloaded: ``POST /api/generate`` with ``keep_alive: -1``.

        ``client`` has the server's base URL. Returns once ollama has loaded it.

        Raises:
            OllamaError: ollama answered an error (the message is ollama's) or
                did not answer within ``timeout_s`` seconds.
        """
        await self._generate(client, model, keep_alive=-1, timeout_s=timeout_s)

    async def unload(self, client: httpx.AsyncClient, model: str, *, timeout_s: float) -> None:
        """Evict ``model`` now: ``POST /api/generate`` with ``keep_alive: 0``.

        Ollama frees the memory asynchronously; poll ``resident`` until the
        model is gone before counting its memory as free.

        Raises:
            OllamaError: as ``load``.
        """
        await self._generate(client, model, keep_alive=0, timeout_s=timeout_s)

    async def resident(self, client: httpx.AsyncClient, *, timeout_s: float) -> dict[str, int]:
        """The models ollama holds now, from ``GET /api/ps``: model name -> size in bytes.

        Raises:
            OllamaError: ollama did not answer, answered an error, or sent a
                body that is not the documented shape.
        """
        try:
            response = await client.get("/api/ps", timeout=timeout_s)
        except httpx.HTTPError as err:
            raise OllamaError(f"ollama /api/ps failed: {err!r}") from err
        if response.status_code != 200:
            raise OllamaError(f"ollama /api/ps answered {response.status_code}: {response.text}")
        try:
            models = response.json()["models"]
            return {str(m["name"]): int(m.get("size", 0)) for m in models}
        except (ValueError, KeyError, TypeError) as err:
            raise OllamaError(f"ollama /api/ps sent an unexpected body: {response.text}") from err

    async def _generate(
        self, client: httpx.AsyncClient, model: str, *, keep_alive: int, timeout_s: float
    ) -> None:
        body = {"model": model, "keep_alive": keep_alive, "stream": False}
        try:
            response = await client.post("/api/generate", json=body, timeout=timeout_s)
        except httpx.HTTPError as err:
            raise OllamaError(f"ollama generate for {model} failed: {err!r}") from err
        if response.status_code != 200:
            raise OllamaError(
                f"ollama refused {model} (keep_alive {keep_alive}): "
                f"{response.status_code} {response.text}"
            )
