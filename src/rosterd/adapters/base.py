"""The adapter Protocol and the values adapters build (layer 4, pure).

An adapter turns one role's inference spec plus its resolved weights into a
``Launch``: the argv and environment of the backend server, where it listens,
and how to tell it is ready. It also builds the generation probe (a one-token
completion that tells a wedged server from a healthy one), rewrites a
request's ``model`` field to the name the backend answers to, and picks the
memory estimate of its backend (``rosterd.memory.estimate`` has the arithmetic).
What the layers below adapters need of a flavor is in ``rosterd.flavors``.

Adapters do no I/O: they build values; the supervisor (layer 5) runs them.
Plain frozen dataclasses, because these are our own values with no parsing to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rosterd.memory.estimate import MemoryEstimate
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import WeightsSource

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True, slots=True)
class HttpProbe:
    """One HTTP request whose answer says whether a backend is ready or alive.

    ``method`` is ``GET`` or ``POST``; ``path`` starts with ``/``; ``json`` is
    the request body (``None`` for none); the probe passes when the status is in
    ``ok_status`` and, when ``expect_json_key`` is set, the JSON answer has that
    top-level key (a generation probe expects ``choices``).
    """

    method: str
    path: str
    json: Mapping[str, object] | None = None
    ok_status: frozenset[int] = frozenset({200})
    expect_json_key: str | None = None


@dataclass(frozen=True, slots=True)
class ProgressProbe:
    """How to ask a busy backend whether it is still working: ``GET path`` answers JSON, and
    ``counters(answer)`` reads from it numbers that grow while it works (tokens processed,
    tokens generated, per slot). Two looks with the same counters, spaced wider than the
    backend's own step, mean no progress.

    ``counters`` raises ``ValueError`` when the answer is not what the backend gives.
    """

    path: str
    counters: Callable[[object], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one backend server: everything the supervisor needs.

    ``argv`` is an argument list (never a shell string); ``env`` holds variables
    set on top of rosterd's own environment; the server listens on
    ``host``:``port``; ``readiness`` passes once it can serve; ``served_model``
    is the model name the backend answers to (what requests are rewritten to);
    ``weights_bytes`` (bytes on disk, 0 if unknown) lets the supervisor grow the
    readiness deadline with the weights' size. ``stop_grace_s``: the least time between
    SIGTERM and SIGKILL this backend needs to give its memory back (``None``: the
    supervisor's ``--grace``; the larger of the two applies); ``sigkill_note``: what a
    SIGKILL costs it, said when one is sent.
    """

    argv: tuple[str, ...]
    host: str
    port: int
    readiness: HttpProbe
    served_model: str
    env: Mapping[str, str] = field(default_factory=dict)
    weights_bytes: int = 0
    stop_grace_s: float | None = None
    sigkill_note: str = ""

    @property
    def base_url(self) -> str:
        """``http://host:port`` (IPv6 hosts in brackets), no trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class SharedServer(Protocol):
    """The capability of a flavor whose one server per node serves every role (ollama).

    A role of such a flavor is not a process: the node runs ``server_launch``
    once, a role becomes resident with ``load`` and leaves with ``unload``, and
    ``resident`` says what the server holds. ``client`` is an httpx client whose
    base URL is the server's; ``timeout_s`` in seconds. The three calls raise
    ``AdapterError`` subclasses when the server refuses or does not answer.
    """

    @property
    def default_port(self) -> int:
        """Where the server listens unless the role names a port."""
        ...

    def server_launch(self, *, host: str, port: int) -> Launch:
        """The node's one server, listening on ``host``:``port``."""
        ...

    async def load(self, client: httpx.AsyncClient, model: str, *, timeout_s: float) -> None:
        """Make ``model`` resident until unloaded; returns once the server holds it."""
        ...

    async def unload(self, client: httpx.AsyncClient, model: str, *, timeout_s: float) -> None:
        """Ask the server to drop ``model`` (its memory may be freed later; see ``resident``)."""
        ...

    async def resident(self, client: httpx.AsyncClient, *, timeout_s: float) -> dict[str, int]:
        """The models the server holds now: model name -> size in bytes."""
        ...

    def reported_estimate(
        self, reported_bytes: int | None, declared_bytes: int
    ) -> tuple[MemoryEstimate | None, str]:
        """A role's estimate from the size (bytes) the server reported holding for its model
        when it last held it (``None``: never yet), with the note saying where it came from;
        ``declared_bytes`` is the roster's figure. Pure."""
        ...


@dataclass(frozen=True, slots=True)
class SlotFile:
    """What one slot save or restore moved: ``slot`` id, ``tokens`` held, ``file_bytes``
    written or read, ``took_s`` the backend's own time for it (seconds)."""

    slot: int
    tokens: int
    file_bytes: int
    took_s: float


class SlotKeeping(Protocol):
    """The capability of a flavor whose server saves and restores its slots' KV cache to
    files (llama-server's ``--slot-save-path`` and ``/slots/{id}?action=save|restore``).

    ``client`` is an httpx client whose base URL is the role's server; ``timeout_s`` in
    seconds. The calls raise ``SlotFileError`` (an ``AdapterError``) when the server
    refuses or does not answer. ``launch_args`` and ``identity`` are pure.
    """

    def launch_args(self, folder: Path) -> tuple[str, ...]:
        """Flags that let the server save to and restore from ``folder`` (and only there)."""
        ...

    def identity(self, launch: Launch) -> dict[str, str]:
        """What must match between the run that saved a slot and the run that restores it,
        read from ``launch`` (field -> value; the weights file, context, slots, cache types,
        ...); the backend's version is added from :meth:`version`."""
        ...

    async def version(self, client: httpx.AsyncClient, *, timeout_s: float) -> str:
        """The running server's build (the save's format follows it)."""
        ...

    async def save(
        self, client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
    ) -> SlotFile:
        """Write slot ``slot``'s cache to ``filename`` (a plain name inside the folder)."""
        ...

    async def restore(
        self, client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
    ) -> SlotFile:
        """Read ``filename`` back into slot ``slot`` (before it serves a request)."""
        ...


class Adapter(Protocol):
    """One flavor's pure builders (DESIGN.md layer 4).

    ``launch`` raises ``AdapterError`` when the spec or weights cannot be
    served by this flavor (wrong kind of file, no port, …).
    """

    @property
    def flavor(self) -> InferFlavor: ...

    @property
    def shared_server(self) -> SharedServer | None:
        """The shared-server capability when one server per node serves every role
        (ollama); ``None`` when each role is its own process."""
        ...

    @property
    def slot_keeping(self) -> SlotKeeping | None:
        """The capability to save and restore the server's KV cache (llama-server);
        ``None`` when the flavor's server cannot (rosterd then keeps nothing across a stop)."""
        ...

    @property
    def native_dialects(self) -> frozenset[str]:
        """The dialects besides OpenAI's chat, completions and embeddings that the backend
        serves itself: ``messages`` (Anthropic's ``/v1/messages``), ``responses``
        (OpenAI's ``/v1/responses``), ``rerank`` (``/v1/rerank``). The router translates
        Messages and Responses to chat completions for a backend without them."""
        ...

    def dialects_for(self, source: WeightsSource | None) -> frozenset[str]:
        """The :attr:`native_dialects` a role served from ``source`` (its resolved weights,
        or its fleet ``models:`` entry when they are not on this machine; ``None``: neither)
        answers: llama-server serves ``rerank`` for a reranker only. Pure."""
        ...

    @property
    def serves_ollama_api(self) -> bool:
        """Whether the backend answers Ollama's own ``/api/chat``, ``/api/generate`` and
        ``/api/embed`` (ollama does): the router passes those requests through rather than
        translating them to the OpenAI routes."""
        ...

    @property
    def progress_probe(self) -> ProgressProbe | None:
        """How a request that has had no byte for a while asks the backend whether it works
        (llama-server's ``/slots``); ``None``: the backend cannot tell, so only the
        first-byte deadline applies."""
        ...

    def launch(self, spec: InferenceSpec, source: WeightsSource, *, host: str, port: int) -> Launch:
        """The argv, environment and readiness probe serving ``spec`` on ``host``:``port``."""
        ...

    def generation_probe(self, served_model: str) -> HttpProbe:
        """A one-token completion: passes only if the backend really generates."""
        ...

    def rewrite_request(self, body: Mapping[str, object], served_model: str) -> dict[str, object]:
        """A copy of an OpenAI request ``body`` whose ``model`` is ``served_model``."""
        ...

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
        """What the backend will hold resident serving weights of ``facts`` with ``ctx_size``
        tokens of context, ``parallel`` slots and the launch's ``extra_args``, with the KV
        cache kept across stops (``keep_kv``) and a RAM prompt cache of ``cache_ram_mb``
        MiB (``None``: the adapter's default), as the fleet's ``models:`` entry says. Pure.

        Raises:
            ValueError: the flavor reads no weights (its server keeps its own; a shared
                server's ``reported_estimate`` says what it holds).
        """
        ...


def one_token_completion(served_model: str) -> HttpProbe:
    """A ``POST /v1/completions`` for one token at temperature 0, expecting ``choices``.

    Shared by every OpenAI-compatible backend: it passes only if the server
    really runs the model, so it tells a wedged server (HTTP up, generation
    dead) from a healthy one.
    """
    return HttpProbe(
        method="POST",
        path="/v1/completions",
        json={"model": served_model, "prompt": "Hi", "max_tokens": 1, "temperature": 0.0},
        ok_status=frozenset({200}),
        expect_json_key="choices",
    )


def rewrite_model_field(body: Mapping[str, object], served_model: str) -> dict[str, object]:
    """A shallow copy of ``body`` with ``model`` set to ``served_model``."""
    out = dict(body)
    out["model"] = served_model
    return out


class OpenAICompatible:
    """``generation_probe`` and ``rewrite_request`` for a backend that speaks the OpenAI API.

    Mixed into the adapters of servers with ``/v1/completions`` (llama-server,
    llama-cpp-python's server, mlx_lm.server): the probe is
    ``one_token_completion`` and a request's ``model`` becomes the served name.
    """

    __slots__ = ()

    @property
    def native_dialects(self) -> frozenset[str]:
        """None by default: chat completions only (mlx_lm.server's API, for one)."""
        return frozenset()

    def dialects_for(self, source: WeightsSource | None) -> frozenset[str]:
        """:attr:`native_dialects`, whatever the weights."""
        return self.native_dialects

    @property
    def serves_ollama_api(self) -> bool:
        """``False``: an OpenAI-compatible server gets Ollama's requests translated."""
        return False

    @property
    def progress_probe(self) -> ProgressProbe | None:
        """``None``: the OpenAI API has no way to ask how far a request has come."""
        return None

    def generation_probe(self, served_model: str) -> HttpProbe:
        """A one-token ``/v1/completions`` against ``served_model``."""
        return one_token_completion(served_model)

    def rewrite_request(self, body: Mapping[str, object], served_model: str) -> dict[str, object]:
        """``body`` with ``model`` set to the name the server was launched with."""
        return rewrite_model_field(body, served_model)


def weights_size_hint(spec: InferenceSpec, source: WeightsSource) -> int:
    """The weights' size in bytes for the readiness deadline, without touching the disk.

    ``source.size_bytes`` when the source carries it (``ResolvedWeights``), else
    the spec's ``memory.weights_bytes`` (from the roster's ``ram_gb``).
    """
    size = getattr(source, "size_bytes", 0)
    if isinstance(size, int) and size > 0:
        return size
    return spec.memory.weights_bytes
