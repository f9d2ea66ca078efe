"""What the router routes to (DESIGN.md layer 7): the roles it serves, the names that reach
them, and its limits. Plain frozen values; the app and the proxy share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rosterd.adapters.base import rewrite_model_field
from rosterd.router.openai_errors import RouterError

#: The OpenAI endpoints routed by ``model`` (path -> metrics label).
PROXIED_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}

RewriteRequest = Callable[[Mapping[str, object], str], dict[str, object]]


@dataclass(frozen=True, slots=True)
class RoleRoute:
    """How the router reaches one role.

    ``names``: other names that route to it (the roster's model name,
    aliases); ``rewrite``: the adapter's ``rewrite_request(body,
    served_model)`` (default: only ``model`` is set to the served name);
    ``info``: extra JSON for ``/v1/models`` (node, latency class, …).
    """

    role: str
    names: tuple[str, ...] = ()
    rewrite: RewriteRequest = rewrite_model_field
    info: Mapping[str, object] = field(default_factory=dict)


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
    """

    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 8 * 2**20
    upstream_connect_s: float = 10.0
    upstream_read_s: float = 600.0
    upstream_keepalive_s: float = 2.0


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
        for role in sorted(routes):
            self.by_name[role] = role
        for role in sorted(routes):
            for name in routes[role].names:
                self.by_name.setdefault(name, role)
        self.unserved = dict(unserved or {})

    def resolve(self, model: str) -> str:
        """The role serving ``model``; raises :class:`RouterError` 404 ``model_not_found``
        naming the known models (and why ``model`` is not served here, when known)."""
        try:
            return self.by_name[model]
        except KeyError:
            known = ", ".join(sorted(set(self.by_name.values())))
            why = self.unserved.get(model)
            detail = f" ({why})" if why else ""
            raise RouterError(
                "model_not_found",
                f"model {shown_name(model)} is not served here{detail}; known models: {known}",
            ) from None
