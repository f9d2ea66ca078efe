"""The router's plain endpoints (DESIGN.md layer 7): JSON in, JSON out, one method each.

:class:`Endpoints` holds what they read (the scheduler, the route table, the history,
the metrics, the hooks ``rosterd up`` gives) and serves ``/health``, ``/status``,
``/metrics``, ``/v1/models``, the ``/rosterd/*`` admin paths and Starlette's error
answers, each in the OpenAI error envelope (``openai_errors``). :func:`create_app`
(``rosterd.router.app``) wires them to their paths; the proxied paths are
:mod:`~rosterd.router.proxy`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rosterd.errors import RosterdError, RouterError
from rosterd.fleet_scheduler.views import FleetNodeView
from rosterd.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rosterd.metrics import RosterdMetrics
from rosterd.router.history import History, sample_forever
from rosterd.router.logs import CopyLogs, LogPath, log_response
from rosterd.router.openai_errors import error_response, scheduler_errors
from rosterd.router.restore_check import RestoreChecks
from rosterd.router.routing import RoleRoute, RouteTable, shown_name
from rosterd.router.status_view import StatusInputs, nodes_json
from rosterd.router.streams import LiveStreams
from rosterd.router.ui import shown_events
from rosterd.router.upstream import Upstream
from rosterd.router.wait_report import evicted_for
from rosterd.scheduler.directory import NodeDirectory
from rosterd.tokens import valid_token

log = logging.getLogger("rosterd.router")

#: The longest ``{role}`` of the ``/rosterd/*`` admin paths, bytes.
ADMIN_ROLE_MAX_BYTES = 64


@dataclass
class Endpoints:
    """The plain endpoints of one app; see :func:`rosterd.router.app.create_app` for what
    each hook means (``status_extra``, ``on_shutdown``, ``log_path``, ``copy_logs``, ``reload``,
    ``node_views``). ``started_at``: seconds since the epoch (``created`` of every model,
    the base of ``uptime_s``); ``restores``: the proxy's checks of restored KV caches."""

    scheduler: NodeDirectory
    routes: RouteTable
    metrics: RosterdMetrics
    history: History
    live: LiveStreams
    upstream: Upstream
    restores: RestoreChecks
    started_at: float
    status_extra: Callable[[], Mapping[str, object]] = dict
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = ()
    log_path: LogPath | None = None
    copy_logs: CopyLogs | None = None
    reload: Callable[[bool], Awaitable[Mapping[str, object]]] | None = None
    node_views: Callable[[], Mapping[str, FleetNodeView]] | None = None

    # ---- the app's lifespan ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, _: Starlette) -> AsyncIterator[None]:
        """Start the scheduler and the history's sampler; at the end, stop the sampler,
        end the endless responses, close the upstream client, run ``on_shutdown``."""
        self.scheduler.start()
        sampler = asyncio.create_task(sample_forever(self.history, self.scheduler, time.time))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.live.close()
            await self.upstream.close()
            for hook in self.on_shutdown:
                await hook()

    # ---- what is served ---------------------------------------------------------------

    async def health(self, _: Request) -> Response:
        """``GET /health``: ``{"status": "ok"}`` while the app serves."""
        return JSONResponse({"status": "ok"})

    def model_entry(self, role: str) -> dict[str, object]:
        """One role as OpenAI's model object, with its ``aliases`` and the route's info."""
        route = self.routes.get(role, RoleRoute(role))
        entry: dict[str, object] = {
            "id": role,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": "rosterd",
            "aliases": sorted(set(route.names)),
        }
        entry.update(route.info)
        return entry

    async def models(self, _: Request) -> Response:
        """``GET /v1/models``: every role served here that the caller's key may use."""
        names = self.routes.names
        data = [self.model_entry(role) for role in self.scheduler.roles if names.visible(role)]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        """OpenAI's retrieve: one model by role id, model name or alias (404 if unknown)."""
        try:
            role = self.routes.names.resolve(request.path_params["model"])
        except RouterError as err:
            return error_response(err)
        return JSONResponse(self.model_entry(role))

    async def ps_data(self) -> dict[str, object]:
        """What ``/rosterd/ps`` shows: ``{"nodes": ...}`` (``rosterd.router.status_view``)
        from the scheduler's snapshot, each role's measured RSS, the restore checks, the
        roles the caller's key may see and ``node_views()`` (in fleet order)."""
        snap = self.scheduler.snapshot()
        measured = await self.scheduler.measured_bytes()
        fleet = self.node_views() if self.node_views is not None else None
        inputs = StatusInputs(measured, self.restores, self.routes.names.visible, fleet)
        return {"nodes": nodes_json(snap, inputs)}

    async def status_data(self) -> dict[str, object]:
        """What ``/status`` shows: :meth:`ps_data`, ``uptime_s`` and ``status_extra()``."""
        data: dict[str, object] = dict(await self.ps_data())
        data["uptime_s"] = round(time.time() - self.started_at, 3)
        data.update(self.status_extra())
        return data

    async def status(self, _: Request) -> Response:
        """``GET /status``."""
        return JSONResponse(await self.status_data())

    async def ps(self, _: Request) -> Response:
        """``GET /rosterd/ps``."""
        return JSONResponse(await self.ps_data())

    async def history_points(self, _: Request) -> Response:
        """``GET /rosterd/history``: the charts' bounded history."""
        return JSONResponse(self.history.as_json())

    async def events(self, _: Request) -> Response:
        """``GET /rosterd/events``: the scheduler's event log, as the request's key may see
        it (``rosterd.router.ui.shown_event``)."""
        events = shown_events(self.scheduler.events(), self.routes.names)
        return JSONResponse({"events": events})

    async def metrics_text(self, _: Request) -> Response:
        """``GET /metrics``: Prometheus' text, the node gauges observed first."""
        fleet = self.node_views() if self.node_views is not None else {}
        measured = await self.scheduler.measured_bytes()
        self.metrics.observe_nodes(self.scheduler.snapshot(), measured, fleet)
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    # ---- the admin paths --------------------------------------------------------------

    def admin_role(self, request: Request) -> str:
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
        return self.routes.names.resolve(name)

    async def load(self, request: Request) -> Response:
        """``POST /rosterd/load/{role}``: load it; what it evicted, and why."""
        scheduler = self.scheduler
        try:
            with scheduler_errors():
                role = self.admin_role(request)
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

    async def unload(self, request: Request) -> Response:
        """``POST /rosterd/unload/{role}``."""
        try:
            with scheduler_errors():
                role = self.admin_role(request)
                await self.scheduler.unload(role)
        except RouterError as err:
            return error_response(err)
        return JSONResponse({"role": role, "resident": False})

    async def logs(self, request: Request) -> Response:
        """``GET /rosterd/logs/{role}``: the role's backend log, tailed or followed."""
        try:
            role = self.admin_role(request)
            log_path = self.log_path or (lambda _: None)
            return await log_response(request, role, log_path, self.live, self.copy_logs)
        except RouterError as err:
            return error_response(err)

    async def reload_config(self, request: Request) -> Response:
        """``POST /rosterd/reload`` (``?force=true``); 422 ``invalid_config`` when refused."""
        assert self.reload is not None
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        try:
            changed = await self.reload(force)
        except RosterdError as exc:
            return error_response(RouterError("invalid_config", str(exc)))
        return JSONResponse(dict(changed))

    # ---- Starlette's own errors, in the OpenAI envelope -------------------------------

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """404 ``not_found`` for a path no route serves."""
        return error_response(
            RouterError("not_found", f"no route {request.method} {request.url.path}")
        )

    async def method_not_allowed(self, request: Request, exc: Exception) -> Response:
        """405 ``method_not_allowed``."""
        return error_response(
            RouterError(
                "method_not_allowed",
                f"method {request.method} is not allowed on {request.url.path}",
            )
        )

    async def server_error(self, request: Request, exc: Exception) -> Response:
        """500 ``internal_error``, logged with its traceback."""
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(RouterError("internal_error", f"internal error: {exc}"))
