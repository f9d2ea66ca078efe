"""What the router routes to (DESIGN.md layer 7): the roles it serves, the names that reach
them, and its limits. Plain frozen values, and the two tables the app and the proxy share
(:class:`ModelNames`, :class:`RouteTable`), which a reload swaps whole in one step.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from rosterd.adapters.base import ProgressProbe, rewrite_model_field
from rosterd.errors import RouterError
from rosterd.fleet_scheduler.served import SKIPPED_IN_ROSTER
from rosterd.router.caller import may_use
from rosterd.router.deadlines import FirstByteRule
from rosterd.router.progress import ProgressCheck

#: Where the proxy leaves, in a request's ASGI scope, the role its ``model`` resolved to and
#: that role's node, as soon as it knows them: the access log's ``role`` and ``node`` for an
#: answer without ``X-Rosterd-*`` headers (a request refused before it took a lease).
ROLE_SCOPE = "rosterd.role"
NODE_SCOPE = "rosterd.node"

#: The endpoints routed by ``model`` (path -> metrics label).
PROXIED_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/v1/responses": "responses",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
}

#: The proxied paths of a dialect a backend may not serve natively (path -> dialect, as
#: adapters name them in ``native_dialects``); the others every backend serves.
DIALECT_PATHS = {
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
    "/v1/responses": "responses",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
}

RewriteRequest = Callable[[Mapping[str, object], str], dict[str, object]]


@dataclass(frozen=True, slots=True)
class RoleRoute:
    """How the router reaches one role.

    ``names``: other names that route to it (the roster's model name,
    aliases); ``rewrite``: the adapter's ``rewrite_request(body,
    served_model)`` (default: only ``model`` is set to the served name);
    ``info``: extra JSON for ``/v1/models`` (node, latency class, …);
    ``flavor``: the adapter's flavor (named in errors); ``native``: the dialects of
    :data:`DIALECT_PATHS` its backend serves itself (the adapter's ``dialects_for`` its
    weights; the router translates the others to chat completions where it can);
    ``flavor_dialects``: those its flavor's backend serves when set up for them (the
    adapter's ``native_dialects``: llama-server reranks when started as a reranker), so
    that a refusal can say what to set.
    ``ollama_api``: its backend answers Ollama's own API (``Adapter.serves_ollama_api``),
    so ``/api/chat``, ``/api/generate`` and ``/api/embed`` pass through untranslated;
    ``progress``: how its backend says how far a quiet request has come
    (``Adapter.progress_probe``; ``None``: only the first-byte deadline applies).
    ``load_progress``: what a streamed request waiting for its load gets, when its fleet
    ``models:`` entry says (``None``: :attr:`RouterConfig.load_progress`).
    ``ctx_size``: the context its backend is launched with, tokens (``None``: not known),
    the upper bound of a request's token limits (``rosterd.router.validation``).
    """

    role: str
    names: tuple[str, ...] = ()
    rewrite: RewriteRequest = rewrite_model_field
    info: Mapping[str, object] = field(default_factory=dict)
    flavor: str = ""
    native: frozenset[str] = frozenset()
    flavor_dialects: frozenset[str] = frozenset()
    ollama_api: bool = False
    progress: ProgressProbe | None = None
    load_progress: LoadProgressMode | None = None
    ctx_size: int | None = None


class LoadProgressMode(Enum):
    """What a streamed request waiting for a load is sent (:mod:`rosterd.router.load_progress`,
    ``--load-progress``): ``ping``, SSE comments, or Anthropic's ``ping`` events; ``text``,
    those and the progress as reasoning text on chat completions; ``off``, nothing until the
    answer."""

    PING = "ping"
    TEXT = "text"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router's limits.

    ``api_keys``: accepted ``Authorization: Bearer`` keys (empty: no auth;
    ``/health`` is always open); ``max_body_bytes``: largest request body;
    ``upstream_connect_s`` / ``upstream_read_s``: timeouts towards the
    backend, seconds (read: between two chunks); ``upstream_keepalive_s``: how
    long an idle upstream connection is kept for reuse, seconds. It stays
    below llama-server's keep-alive timeout (5 s, cpp-httplib's default): with
    httpx's default, also 5 s, the router reused connections the backend was
    closing at that very moment, and the request failed unanswered.
    ``cors_origins``: the browser origins (``https://host:port``, or ``*``)
    allowed to call the API from their pages (empty: no CORS headers at all).
    ``first_byte_timeout_s`` / ``chunk_timeout_s``: a request's deadlines for
    its first body byte (at most: a request's own follows from its size by
    ``first_byte_rule``, :mod:`rosterd.router.deadlines`) and between two chunks,
    seconds (then 504 and the role is probed); ``request_read_timeout_s``: how
    long a client may take to send its request headers and its body, seconds
    (then 408).
    ``progress_check``: when a quiet request asks its backend whether it works
    (:mod:`rosterd.router.progress`; roles whose backend can tell only).
    ``history_interval_s``: seconds between two points of the page's charts
    (:mod:`rosterd.router.history`; 360 points are kept).
    ``load_progress``: what a streamed request waiting for a load is sent
    (:mod:`rosterd.router.load_progress`, ``--load-progress``), unless its role says
    otherwise (:attr:`RoleRoute.load_progress`).
    """

    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 2**20
    upstream_connect_s: float = 10.0
    upstream_read_s: float = 600.0
    upstream_keepalive_s: float = 2.0
    first_byte_timeout_s: float = 300.0
    chunk_timeout_s: float = 120.0
    request_read_timeout_s: float = 30.0
    progress_check: ProgressCheck = field(default_factory=ProgressCheck)
    first_byte_rule: FirstByteRule = field(default_factory=FirstByteRule)
    history_interval_s: float = 10.0
    load_progress: LoadProgressMode = LoadProgressMode.PING


def shown_name(name: str) -> str:
    """``name`` quoted for an error message, cut at 200 characters (it comes from the client)."""
    return repr(name) if len(name) <= 200 else f"{name[:200]!r}…"


class ModelNames:
    """``model`` field -> role: role ids first, then roster model names and aliases (sorted).

    ``unserved``: names this process knows but does not serve (a role left
    unplaced, or planned on a node this process does not run) -> why; a
    request for one gets a 404 that gives that reason.
    """

    def __init__(
        self, routes: Mapping[str, RoleRoute], unserved: Mapping[str, str] | None = None
    ) -> None:
        self.by_name: dict[str, str] = {}
        self.unserved: dict[str, str] = {}
        self.replace(routes, unserved)

    def replace(
        self, routes: Mapping[str, RoleRoute], unserved: Mapping[str, str] | None = None
    ) -> None:
        """Resolve names by ``routes`` and ``unserved`` from now on (a reload); both
        tables change in one step, so no request resolves against half of them."""
        by_name: dict[str, str] = {}
        for role in sorted(routes):
            by_name[role] = role
        for role in sorted(routes):
            for name in routes[role].names:
                by_name.setdefault(name, role)
        names_of = {role: (role, *routes[role].names) for role in routes}
        self.by_name, self.unserved = by_name, dict(unserved or {})
        self.names_of: dict[str, tuple[str, ...]] = names_of

    def visible(self, role: str) -> bool:
        """Whether the request's key may use ``role`` (``rosterd.router.caller``): a role it
        may not use is answered as an unknown one, everywhere."""
        return may_use(self.names_of.get(role, (role,)))

    def knows(self, model: str) -> bool:
        """Whether ``model`` names a role the request's key may use."""
        role = self.by_name.get(model)
        return role is not None and self.visible(role)

    def resolve(self, model: str) -> str:
        """The role serving ``model``; raises :class:`RouterError` 503 ``model_unplaced``
        with the plan's reason for a role the plan left unplaced or put on a node this
        process does not run, else 404 ``model_not_found`` naming the known models (and why
        ``model`` is not served, for a roster entry the import skipped, else the closest
        served name, as ``difflib`` finds it: a typo such as ``chat-smal``).

        Only the roles the request's key may use are known to it: another is refused as
        a name never heard of, with the same message (no reason, no hint beyond its own)."""
        role = self.by_name.get(model)
        if role is not None and self.visible(role):
            return role
        seen = {name: r for name, r in self.by_name.items() if self.visible(r)}
        known = ", ".join(sorted(set(seen.values())))
        if len(seen) > len(set(seen.values())):  # roster names and aliases answer too
            known += " (other names: GET /v1/models)"
        why = self.unserved.get(model) if may_use((model,)) else None
        if why and not why.startswith(SKIPPED_IN_ROSTER):
            raise RouterError(
                "model_unplaced",
                f"model {shown_name(model)} is a role of the roster that is not served now: "
                f"{why}; known models: {known}",
            )
        detail = f" ({why})" if why else ""
        close = [] if why else difflib.get_close_matches(model[:200], seen, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RouterError(
            "model_not_found",
            f"model {shown_name(model)} is not served here{detail}{hint}; known models: {known}",
        )


class RouteTable(Mapping[str, RoleRoute]):
    """The router's routes: role -> :class:`RoleRoute` for the roles served, and their
    :attr:`names`; :meth:`replace` swaps both at once (a reload).

    A role a reload removed is no longer iterated nor resolved by name, but its
    route is still found by ``table[role]``: a request granted before the reload
    forwards to its backend with the rewrite it was routed with.
    """

    def __init__(
        self, routes: Mapping[str, RoleRoute], unserved: Mapping[str, str] | None = None
    ) -> None:
        self._routes = dict(routes)
        self._removed: dict[str, RoleRoute] = {}
        self.names = ModelNames(self._routes, unserved)

    def replace(
        self, routes: Mapping[str, RoleRoute], unserved: Mapping[str, str] | None = None
    ) -> None:
        """Route by ``routes`` and ``unserved`` from now on, in one step."""
        for role, route in self._routes.items():
            if role not in routes:
                self._removed[role] = route
        for role in routes:
            self._removed.pop(role, None)
        self._routes = dict(routes)
        self.names.replace(self._routes, unserved)

    def __getitem__(self, role: str) -> RoleRoute:
        route = self._routes.get(role)
        return route if route is not None else self._removed[role]

    def __contains__(self, role: object) -> bool:
        return role in self._routes

    def __iter__(self) -> Iterator[str]:
        return iter(self._routes)

    def __len__(self) -> int:
        return len(self._routes)
