"""Every route of Ollama's API as rosterd serves it (DESIGN.md layer 7), for ``create_app``.

The catalog (:mod:`.catalog`) and the generation paths (:mod:`.generation`); all of
them sit behind the same API-key gate as the OpenAI paths (the ``ollama`` client
sends the key with ``Client(host=..., headers={"Authorization": "Bearer KEY"})``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from starlette.routing import BaseRoute, Route

from rosterd.router.ollama.catalog import catalog_routes
from rosterd.router.ollama.generation import OLLAMA_PATHS, OllamaGeneration
from rosterd.router.proxy import ProxyContext
from rosterd.router.routing import ModelNames, RoleRoute

#: Where Ollama's API lives: every path under it answers errors in Ollama's envelope.
OLLAMA_PREFIX: Final[str] = "/api/"


def ollama_routes(
    ctx: ProxyContext, routes: Mapping[str, RoleRoute], names: ModelNames, started_at_s: float
) -> list[BaseRoute]:
    """Starlette routes for ``/api/*``: ``ctx`` is the OpenAI proxies' (the same scheduler,
    limits, metrics and upstream client), ``routes`` and ``names`` the router's tables,
    ``started_at_s`` (Unix seconds) when the router started."""
    out = catalog_routes(ctx.scheduler, routes, names, started_at_s)
    out += [Route(path, OllamaGeneration(ctx, path), methods=["POST"]) for path in OLLAMA_PATHS]
    return out
