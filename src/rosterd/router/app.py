"""The router's ASGI app (DESIGN.md layer 7): the wiring of every route and its lifespan.

Starlette routes the plain endpoints (JSON in, JSON out: ``endpoints.Endpoints``, which
also holds the lifespan); the OpenAI paths
routed by ``model`` are :class:`~rosterd.router.proxy.Proxy` apps, and a
``POST`` to one goes straight to its proxy, past Starlette's router
(:class:`ProxyFirst`); the whole app sits behind the API-key gate, and, with
``--cors-origin``, Starlette's ``CORSMiddleware`` in front of that (it answers
preflight requests). uvicorn serves it (``rosterd up``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rosterd.fleet_scheduler.views import FleetNodeView
from rosterd.keys import KeyRing
from rosterd.metrics import RosterdMetrics
from rosterd.router.access_log import AccessLog
from rosterd.router.auth import KeyGate, Keys
from rosterd.router.endpoints import Endpoints
from rosterd.router.history import History
from rosterd.router.key_limits import KeyLimiter
from rosterd.router.logs import CopyLogs, LogPath
from rosterd.router.ollama.generation import send_ollama_error
from rosterd.router.ollama.routes import OLLAMA_PREFIX, ollama_routes
from rosterd.router.openapi import openapi_endpoint
from rosterd.router.proxy import Proxy, ProxyContext
from rosterd.router.routing import PROXIED_PATHS, RoleRoute, RouterConfig, RouteTable
from rosterd.router.streams import LiveStreams
from rosterd.router.ui import PAGE_PATHS, STATIC_PREFIX, page_routes
from rosterd.router.upstream import Upstream
from rosterd.router.usage_hook import KeyUsage, tokens_today
from rosterd.router.wait_report import WAIT_HEADERS
from rosterd.scheduler.directory import NodeDirectory
from rosterd.usage import UsageStore


def create_app(
    scheduler: NodeDirectory,
    routes: Mapping[str, RoleRoute],
    *,
    config: RouterConfig | None = None,
    metrics: RosterdMetrics | None = None,
    status_extra: Callable[[], Mapping[str, object]] | None = None,
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    unserved: Mapping[str, str] | None = None,
    log_path: LogPath | None = None,
    copy_logs: CopyLogs | None = None,
    streams: LiveStreams | None = None,
    reload: Callable[[bool], Awaitable[Mapping[str, object]]] | None = None,
    node_views: Callable[[], Mapping[str, FleetNodeView]] | None = None,
    history: History | None = None,
    keys: Keys | None = None,
    usage: UsageStore | None = None,
) -> ASGIApp:
    """The router as an ASGI app (serve it with uvicorn, bound to 127.0.0.1 unless asked).

    ``routes``: role -> :class:`RoleRoute` for every role ``scheduler`` serves;
    ``status_extra()`` adds keys to ``/status`` (e.g. ``unplaced``, remote
    nodes); ``on_shutdown`` coroutines run when the app's lifespan ends (after
    the upstream client is closed); ``unserved``: names (role ids, model
    names) known but not served by this process -> why (unplaced, or planned
    on another node), given in their 404; ``log_path(role)``: where the role's
    backend log is (``None``: not kept here; no ``log_path``: no log is);
    ``copy_logs(role)``: node -> the log of the role's copy there, for the copies of this
    machine that run under their copy's name (empty: ``log_path`` alone);
    ``streams``: ends the endless responses (followed logs, the event stream)
    when its ``close()`` is called, as serving stops (default: at the end of
    the lifespan). The scheduler's tasks are started with the app's lifespan.
    A :class:`RouteTable` given as ``routes`` is used as
    it is: its owner swaps it on a reload (``unserved`` is then its own).
    ``reload(force)`` serves ``POST /rosterd/reload`` (``?force=true``: apply a
    configuration that serves no role too): it returns what changed, or raises a
    ``RosterdError`` (answered 422 ``invalid_config``) when the new configuration is
    refused and the running one stays.
    ``node_views()``: per fleet node (in fleet order), what the fleet knows of it, shown
    in its entry of ``/status`` and ``/rosterd/ps`` (``connected``, ``address``, ...; a
    node the scheduler does not run gets an entry of these alone; see
    ``rosterd.router.status_view``). Measured RSS comes
    through the backends boundary (``NodeDirectory.measured_bytes``); each role's ``kv`` gets
    what the first answer after its last restore showed, and each role a one-line
    ``kv_summary`` (``rosterd.router.restore_check``).
    ``history``: the charts' bounded history, served as ``GET /rosterd/history`` and
    sampled every ``history.interval_s`` seconds while the app runs (default: a new one
    at ``config.history_interval_s``).
    ``keys``: the keys in force and what each may do (``rosterd.router.auth``; its owner
    swaps them on a reload); default: ``config.api_keys``, each holding every scope.
    ``usage``: where each key's use is kept (open; its owner closes it), served as
    ``GET /rosterd/usage`` (``None``: only counted in the metrics).
    """
    config = config or RouterConfig()
    metrics = metrics or RosterdMetrics()
    upstream = Upstream(
        connect_s=config.upstream_connect_s,
        # The deadlines (first byte, between chunks) come first; the client's
        # read timeout is only the backstop above them.
        read_s=max(config.upstream_read_s, config.first_byte_timeout_s, config.chunk_timeout_s)
        + 1.0,
        keepalive_s=config.upstream_keepalive_s,
    )
    if not isinstance(routes, RouteTable):
        routes = RouteTable(routes, unserved)
    live = streams or LiveStreams()
    history = history or History(config.history_interval_s)
    started_at = time.time()
    limiter = KeyLimiter()
    limiter.start_day(tokens_today(usage, time.time()))
    ctx = ProxyContext(
        scheduler=scheduler,
        routes=routes,
        names=routes.names,
        config=config,
        metrics=metrics,
        upstream=upstream,
        history=history,
        usage=(key_usage := KeyUsage(usage, metrics, limiter)),
    )
    served = Endpoints(
        scheduler=scheduler,
        routes=routes,
        metrics=metrics,
        history=history,
        live=live,
        upstream=upstream,
        restores=ctx.restores,
        started_at=started_at,
        status_extra=status_extra or dict,
        on_shutdown=on_shutdown,
        log_path=log_path,
        copy_logs=copy_logs,
        reload=reload,
        node_views=node_views,
    )
    route_list: list[BaseRoute] = [
        Route("/health", served.health, methods=["GET"]),
        Route("/status", served.status, methods=["GET"]),
        Route("/metrics", served.metrics_text, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint, methods=["GET"]),
        Route("/v1/models", served.models, methods=["GET"]),
        Route("/v1/models/{model:path}", served.model, methods=["GET"]),
        Route("/rosterd/ps", served.ps, methods=["GET"]),
        Route("/rosterd/events", served.events, methods=["GET"]),
        Route("/rosterd/history", served.history_points, methods=["GET"]),
        Route("/rosterd/usage", key_usage.endpoint, methods=["GET"]),
        Route("/rosterd/load/{role}", served.load, methods=["POST"]),
        Route("/rosterd/unload/{role}", served.unload, methods=["POST"]),
        Route("/rosterd/logs/{role}", served.logs, methods=["GET"]),
    ]
    route_list += page_routes(scheduler, served.status_data, live, history, routes.names)
    if reload is not None:
        route_list.append(Route("/rosterd/reload", served.reload_config, methods=["POST"]))
    proxies = {path: Proxy(ctx, path) for path in PROXIED_PATHS}
    route_list += [Route(path, proxy, methods=["POST"]) for path, proxy in proxies.items()]
    route_list += ollama_routes(ctx, routes, routes.names, started_at)  # Ollama's /api/*
    app = Starlette(
        routes=route_list,
        exception_handlers={
            404: served.not_found,
            405: served.method_not_allowed,
            500: served.server_error,
        },
        lifespan=served.lifespan,
    )
    gated: ASGIApp = KeyGate(
        ProxyFirst(app, proxies),
        keys or Keys(KeyRing.of((), config.api_keys)),
        open_paths=PAGE_PATHS,
        open_prefixes=[STATIC_PREFIX],
        dialect_errors={OLLAMA_PREFIX: send_ollama_error},
        limiter=limiter,
    )
    gated = AccessLog(gated)  # outermost but CORS: a refused key leaves its line too
    if not config.cors_origins:
        return gated
    # Outside the key gate: a browser's preflight (OPTIONS) never carries the key, and an
    # error answer (401, 429) must carry the CORS headers for the page to read it.
    return CORSMiddleware(
        gated,
        allow_origins=list(config.cors_origins),
        allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        expose_headers=["Retry-After", *WAIT_HEADERS],
        max_age=600,
    )


class ProxyFirst:
    """ASGI: a ``POST`` to a proxied path goes straight to its :class:`Proxy`; the rest, and
    every path under a ``root_path``, to Starlette (which routes the same paths the same way).

    Starlette's router and its two exception middlewares wrap every ``send``, and on the
    request path that is a tenth of what a request costs; the proxy answers its own errors
    (an unexpected one as 500 ``internal_error``), so they add nothing there.
    """

    def __init__(self, app: ASGIApp, proxies: Mapping[str, Proxy]) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            proxy = self.proxies.get(scope["path"])
            if proxy is not None:
                await proxy(scope, receive, send)
                return
        await self.app(scope, receive, send)
