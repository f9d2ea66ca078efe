"""The router's ASGI app (DESIGN.md layer 7): every route, and its lifespan.

Starlette routes the plain endpoints (JSON in, JSON out); the OpenAI paths
routed by ``model`` are :class:`~rosterd.router.proxy.Proxy` apps, and a
``POST`` to one goes straight to its proxy, past Starlette's router
(:class:`ProxyFirst`); the whole app sits behind the API-key gate, and, with
``--cors-origin``, Starlette's ``CORSMiddleware`` in front of that (it answers
preflight requests). uvicorn serves it (``rosterd up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rosterd.errors import RosterdError, RouterError
from rosterd.keys import KeyRing
from rosterd.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rosterd.metrics import RosterdMetrics
from rosterd.router.auth import KeyGate, Keys
from rosterd.router.history import History, sample_forever
from rosterd.router.key_limits import KeyLimiter
from rosterd.router.logs import LogPath, log_response
from rosterd.router.ollama.generation import send_ollama_error
from rosterd.router.ollama.routes import OLLAMA_PREFIX, ollama_routes
from rosterd.router.openai_errors import error_response, scheduler_errors
from rosterd.router.openapi import openapi_endpoint
from rosterd.router.proxy import Proxy, ProxyContext
from rosterd.router.routing import (
    PROXIED_PATHS,
    RoleRoute,
    RouterConfig,
    RouteTable,
    shown_name,
)
from rosterd.router.streams import LiveStreams
from rosterd.router.ui import PAGE_PATHS, STATIC_PREFIX, page_routes
from rosterd.router.upstream import Upstream
from rosterd.router.usage_hook import KeyUsage, tokens_today
from rosterd.router.wait_report import WAIT_HEADERS, evicted_for
from rosterd.scheduler.fleet import Scheduler
from rosterd.tokens import valid_token
from rosterd.usage import UsageStore

log = logging.getLogger("rosterd.router")

#: The longest ``{role}`` of the ``/rosterd/*`` admin paths, bytes.
ADMIN_ROLE_MAX_BYTES = 64


def create_app(
    scheduler: Scheduler,
    routes: Mapping[str, RoleRoute],
    *,
    config: RouterConfig | None = None,
    metrics: RosterdMetrics | None = None,
    status_extra: Callable[[], Mapping[str, object]] | None = None,
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    unserved: Mapping[str, str] | None = None,
    log_path: LogPath | None = None,
    streams: LiveStreams | None = None,
    reload: Callable[[bool], Awaitable[Mapping[str, object]]] | None = None,
    node_views: Callable[[], Mapping[str, Mapping[str, object]]] | None = None,
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
    ``streams``: ends the endless responses (followed logs, the event stream)
    when its ``close()`` is called, as serving stops (default: at the end of
    the lifespan). The scheduler's tasks are started with the app's lifespan.
    A :class:`RouteTable` given as ``routes`` is used as
    it is: its owner swaps it on a reload (``unserved`` is then its own).
    ``reload(force)`` serves ``POST /rosterd/reload`` (``?force=true``: apply a
    configuration that serves no role too): it returns what changed, or raises a
    ``RosterdError`` (answered 422 ``invalid_config``) when the new configuration is
    refused and the running one stays.
    ``node_views()``: per fleet node (in fleet order), keys added to its entry of
    ``/status`` and ``/rosterd/ps`` (``connected``, ``address``, ...; a node the
    scheduler does not run gets an entry of these keys alone). Measured RSS comes
    through the backends boundary (``Scheduler.measured_bytes``); each role's ``kv`` gets
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
        # The liveness deadlines (first byte, between chunks) come first; the client's
        # read timeout is only the backstop above them.
        read_s=max(config.upstream_read_s, config.first_byte_timeout_s, config.chunk_timeout_s)
        + 1.0,
        keepalive_s=config.upstream_keepalive_s,
    )
    if not isinstance(routes, RouteTable):
        routes = RouteTable(routes, unserved)
    names = routes.names
    extra = status_extra or dict
    live = streams or LiveStreams()
    history = history or History(config.history_interval_s)
    started_at = time.time()
    limiter = KeyLimiter()
    limiter.start_day(tokens_today(usage, time.time()))
    ctx = ProxyContext(
        scheduler=scheduler,
        routes=routes,
        names=names,
        config=config,
        metrics=metrics,
        upstream=upstream,
        history=history,
        usage=(key_usage := KeyUsage(usage, metrics.registry, limiter)),
    )

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def model_entry(role: str) -> dict[str, object]:
        route = routes.get(role, RoleRoute(role))
        entry: dict[str, object] = {
            "id": role,
            "object": "model",
            "created": int(started_at),
            "owned_by": "rosterd",
            "aliases": sorted(set(route.names)),
        }
        entry.update(route.info)
        return entry

    async def models(_: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [model_entry(role) for role in scheduler.roles if names.visible(role)],
            }
        )

    async def model(request: Request) -> Response:
        """OpenAI's retrieve: one model by role id, model name or alias (404 if unknown)."""
        try:
            role = names.resolve(request.path_params["model"])
        except RouterError as err:
            return error_response(err)
        return JSONResponse(model_entry(role))

    async def ps_data() -> dict[str, object]:
        snap = scheduler.snapshot()
        nodes = snap["nodes"]
        assert isinstance(nodes, dict)
        measured = await scheduler.measured_bytes()
        for name, node in nodes.items():
            for role, info in node["roles"].items():
                info["measured_rss_bytes"] = measured.get(name, {}).get(role)
                ctx.restores.annotate(name, role, info)
            # A key's model list holds here too: its page lists the roles it may use.
            node["roles"] = {r: i for r, i in node["roles"].items() if names.visible(r)}
            node["resident"] = [r for r in node["resident"] if names.visible(r)]
        if node_views is not None:
            views = node_views()
            ordered = {name: {**nodes.get(name, {}), **view} for name, view in views.items()}
            snap["nodes"] = ordered | {n: v for n, v in nodes.items() if n not in ordered}
        return snap

    async def status_data() -> dict[str, object]:
        data: dict[str, object] = dict(await ps_data())
        data["uptime_s"] = round(time.time() - started_at, 3)
        data.update(extra())
        return data

    async def status(_: Request) -> Response:
        return JSONResponse(await status_data())

    async def ps(_: Request) -> Response:
        return JSONResponse(await ps_data())

    async def history_endpoint(_: Request) -> Response:
        return JSONResponse(history.as_json())

    async def events(_: Request) -> Response:
        return JSONResponse({"events": [e.as_json() for e in scheduler.events()]})

    async def metrics_endpoint(_: Request) -> Response:
        nodes = (await ps_data())["nodes"]
        assert isinstance(nodes, dict)
        metrics.observe_nodes(nodes)
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    def admin_role(request: Request) -> str:
        """The role ``{role}`` names; raises :class:`RouterError` 400 ``invalid_role`` for a
        name that is not a plain token (at most 64 bytes), 404 for an unknown one."""
        name = request.path_params["role"]
        if not valid_token(name, ADMIN_ROLE_MAX_BYTES):
            raise RouterError(
                "invalid_role",
                f"role {shown_name(name)} is not a plain token (1 to 64 ASCII letters, digits, "
                "'.', '_' or '-', starting with a letter or digit); give a role id, an alias id "
                "or a model name that is one",
            )
        return names.resolve(name)

    async def load(request: Request) -> Response:
        try:
            with scheduler_errors():
                role = admin_role(request)
                before = scheduler.events()
                lease = await scheduler.load(role)
                specs = scheduler.node_of(role).specs
        except RouterError as err:
            return error_response(err)
        evictions = evicted_for(role, lease.node, specs, before, scheduler.events())
        return JSONResponse(
            {
                "role": role,
                "node": lease.node,
                "base_url": lease.endpoint.base_url,
                "ready": True,
                "evicted": [name for name, _ in evictions],
                "evictions": [{"role": name, "cause": cause} for name, cause in evictions],
            }
        )

    async def unload(request: Request) -> Response:
        try:
            with scheduler_errors():
                role = admin_role(request)
                await scheduler.unload(role)
        except RouterError as err:
            return error_response(err)
        return JSONResponse({"role": role, "resident": False})

    async def logs(request: Request) -> Response:
        try:
            role = admin_role(request)
            return await log_response(request, role, log_path or (lambda _: None), live)
        except RouterError as err:
            return error_response(err)

    async def reload_config(request: Request) -> Response:
        assert reload is not None
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        try:
            changed = await reload(force)
        except RosterdError as exc:
            return error_response(RouterError("invalid_config", str(exc)))
        return JSONResponse(dict(changed))

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(
            RouterError("not_found", f"no route {request.method} {request.url.path}")
        )

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(
            RouterError(
                "method_not_allowed",
                f"method {request.method} is not allowed on {request.url.path}",
            )
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(RouterError("internal_error", f"internal error: {exc}"))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        scheduler.start()
        sampler = asyncio.create_task(sample_forever(history, scheduler, time.time))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            live.close()
            await upstream.close()
            for hook in on_shutdown:
                await hook()

    route_list: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/rosterd/ps", ps, methods=["GET"]),
        Route("/rosterd/events", events, methods=["GET"]),
        Route("/rosterd/history", history_endpoint, methods=["GET"]),
        Route("/rosterd/usage", key_usage.endpoint, methods=["GET"]),
        Route("/rosterd/load/{role}", load, methods=["POST"]),
        Route("/rosterd/unload/{role}", unload, methods=["POST"]),
        Route("/rosterd/logs/{role}", logs, methods=["GET"]),
    ]
    route_list += page_routes(scheduler, status_data, live, history)
    if reload is not None:
        route_list.append(Route("/rosterd/reload", reload_config, methods=["POST"]))
    proxies = {path: Proxy(ctx, path) for path in PROXIED_PATHS}
    route_list += [Route(path, proxy, methods=["POST"]) for path, proxy in proxies.items()]
    route_list += ollama_routes(ctx, routes, names, started_at)  # Ollama's /api/*
    app = Starlette(
        routes=route_list,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
        lifespan=lifespan,
    )
    gated = KeyGate(
        ProxyFirst(app, proxies),
        keys or Keys(KeyRing.of((), config.api_keys)),
        open_paths=PAGE_PATHS,
        open_prefixes=[STATIC_PREFIX],
        dialect_errors={OLLAMA_PREFIX: send_ollama_error},
        limiter=limiter,
    )
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
