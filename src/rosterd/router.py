"""The router (DESIGN.md layer 7): one OpenAI-compatible HTTP endpoint in front of every role.

Starlette for routing and plain endpoints, uvicorn to serve it (``rosterd up``),
httpx for the upstream side: all three are well kept, asyncio-native and
stream without buffering. The proxy routes themselves are raw ASGI apps, because
they race the request against the client's ``http.disconnect``: a client that
leaves cancels the handler at once, which closes the upstream connection (so
llama-server stops generating and frees its slot) and gives the lease back.

Endpoints:

- ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``: routed by
  the body's ``model`` (a role id, the roster's model name, or an alias), which
  is rewritten to what the backend answers to; ``"stream": true`` answers are
  passed through chunk by chunk (``X-Accel-Buffering: no``).
- ``GET /v1/models``: every role served here (``id`` = role, ``aliases`` = other
  names that route to it); ``GET /v1/models/{model}``: one of them, by any
  name (OpenAI's retrieve).
- ``GET /health``, ``GET /status`` (JSON: nodes, resident roles, memory, queue),
  ``GET /metrics`` (Prometheus).
- ``GET /rosterd/ps``, ``GET /rosterd/events``, ``POST /rosterd/load/{role}``,
  ``POST /rosterd/unload/{role}``: what ``rosterd ps/load/unload`` talk to;
  ``{role}`` must be a plain token of at most 64 bytes (else 400 ``invalid_role``).

Every error is OpenAI-shaped: ``{"error": {"message", "type", "code"}}``, with
400 for a body that is not strict JSON (``NaN`` and ``Infinity`` included),
404 for an unknown model (naming the known ones, and why a known role is not
served here), 413 for a body over the
limit, 401 for a missing or wrong API key, 429 (queue full) and 503 (queue
timeout, shutting down) with ``Retry-After``, 502 when the backend fails. A
stream cut after it started (the backend stopped or failed, or the drain time
at shutdown ran out) ends with an SSE error event, ``data: {"error": {...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rosterd.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from rosterd.metrics import RosterdMetrics
from rosterd.scheduler import (
    Lease,
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    RoleUnavailableError,
    Scheduler,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.tokens import valid_token

log = logging.getLogger("rosterd.router")

#: The OpenAI endpoints routed by ``model`` (path -> metrics label).
PROXIED_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}

RewriteRequest = Callable[[Mapping[str, object], str], dict[str, object]]


def _rewrite_model(body: Mapping[str, object], served_model: str) -> dict[str, object]:
    out = dict(body)
    out["model"] = served_model
    return out


@dataclass(frozen=True, slots=True)
class RoleRoute:
    """How the router reaches one role.

    ``names``: other names that route to it (the roster's model name,
    aliases); ``rewrite``: the adapter's ``rewrite_request(body,
    served_model)``; ``info``: extra JSON for ``/v1/models`` (node, latency
    class, …).
    """

    role: str
    names: tuple[str, ...] = ()
    rewrite: RewriteRequest = _rewrite_model
    info: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router's limits.

    ``api_keys``: accepted ``Authorization: Bearer`` keys (empty: no auth;
    ``/health`` is always open); ``max_body_bytes``: largest request body;
    ``upstream_connect_s`` / ``upstream_read_s``: httpx timeouts towards the
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


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        err_type: str,
        code: str,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.code = code
        self.retry_after_s = retry_after_s


def error_body(message: str, err_type: str, code: str) -> dict[str, object]:
    """The OpenAI error shape: ``{"error": {"message", "type", "code", "param": None}}``."""
    return {"error": {"message": message, "type": err_type, "code": code, "param": None}}


def _error_response(err: _HttpError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    return JSONResponse(
        error_body(err.message, err.err_type, err.code), status_code=err.status, headers=headers
    )


def _scheduler_http_error(exc: SchedulerError) -> _HttpError:
    """Map a scheduler refusal to its HTTP status and OpenAI error type."""
    if isinstance(exc, QueueFullError):
        return _HttpError(429, str(exc), "rate_limit_error", "queue_full", exc.retry_after_s)
    if isinstance(exc, QueueTimeoutError):
        return _HttpError(503, str(exc), "server_error", "queue_timeout", exc.retry_after_s)
    if isinstance(exc, ShuttingDownError):
        return _HttpError(503, str(exc), "server_error", "shutting_down", 5.0)
    if isinstance(exc, RoleRefusedError):
        return _HttpError(503, str(exc), "server_error", "role_refused")
    if isinstance(exc, RoleUnavailableError):
        return _HttpError(503, str(exc), "server_error", "model_unavailable")
    if isinstance(exc, LoadFailedError):
        return _HttpError(502, str(exc), "upstream_error", "backend_load_failed", 5.0)
    if isinstance(exc, UnknownRoleError):
        return _HttpError(404, str(exc), "invalid_request_error", "model_not_found")
    return _HttpError(503, str(exc), "server_error", "unavailable")


class _ModelNames:
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
        """The role serving ``model``; raises :class:`_HttpError` 404 ``model_not_found``."""
        try:
            return self.by_name[model]
        except KeyError:
            known = ", ".join(sorted(set(self.by_name.values())))
            why = self.unserved.get(model)
            detail = f" ({why})" if why else ""
            shown = repr(model) if len(model) <= 200 else f"{model[:200]!r}…"
            raise _HttpError(
                404,
                f"model {shown} is not served here{detail}; known models: {known}",
                "invalid_request_error",
                "model_not_found",
            ) from None


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes (413) before reading it all."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise _HttpError(
                    400, "invalid Content-Length", "invalid_request_error", "bad_request"
                ) from None
            if declared > limit:
                raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGoneError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> _HttpError:
    return _HttpError(
        413,
        f"request body is larger than the limit of {limit} bytes",
        "invalid_request_error",
        "body_too_large",
    )


class _ClientGoneError(Exception):
    """The client disconnected."""


async def _send_json(send: Send, status: int, data: object, headers: Mapping[str, str]) -> None:
    body = json.dumps(data).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Proxy:
    """The raw ASGI app behind one proxied OpenAI path."""

    def __init__(self, state: _RouterState, path: str) -> None:
        self.state = state
        self.path = path
        self.label = PROXIED_PATHS[path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        role = "-"
        status = {"code": 0}
        sse = {"open": False}  # an event stream has started and not ended

        async def tracked_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                sse["open"] = any(
                    k == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", [])
                )
            elif not message.get("more_body", False):
                sse["open"] = False
            await send(message)

        try:
            body = await _read_body(scope, receive, self.state.config.max_body_bytes)
            payload = _parse_json_object(body)
            model = payload.get("model")
            if not isinstance(model, str) or not model:
                raise _HttpError(
                    400,
                    "the request body needs a 'model' string naming a role",
                    "invalid_request_error",
                    "model_missing",
                )
            role = self.state.names.resolve(model)
            await self._race_disconnect(role, payload, receive, tracked_send)
        except _ClientGoneError:
            status["code"] = 499  # nginx's "client closed request"
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when the drain time at
            # shutdown is over. End the response so the client can tell it was cut
            # (a 503, or an SSE error event if a stream had started); not re-raised,
            # since the response is then complete and uvicorn has nothing left to do.
            with contextlib.suppress(Exception):
                if status["code"] == 0:
                    err = _scheduler_http_error(ShuttingDownError("rosterd is shutting down"))
                    await _send_json(
                        tracked_send,
                        err.status,
                        error_body(err.message, err.err_type, err.code),
                        {"Retry-After": "5"},
                    )
                elif sse["open"]:
                    await tracked_send(
                        _sse_error(
                            f"the stream from role {role!r} was cut: rosterd is shutting down "
                            "and the drain time is over",
                            "server_error",
                            "shutting_down",
                        )
                    )
        except _HttpError as err:
            await _send_json(
                tracked_send,
                err.status,
                error_body(err.message, err.err_type, err.code),
                {"Retry-After": str(max(1, math.ceil(err.retry_after_s)))}
                if err.retry_after_s is not None
                else {},
            )
        finally:
            metrics = self.state.metrics
            metrics.requests.labels(role=role, endpoint=self.label, code=str(status["code"])).inc()
            metrics.request_duration.labels(role=role, endpoint=self.label).observe(
                time.perf_counter() - started
            )

    async def _race_disconnect(
        self, role: str, payload: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        """Serve the request unless the client leaves first; then cancel it at once."""
        handler = asyncio.ensure_future(self._serve(role, payload, send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not handler.done():
                handler.cancel()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(asyncio.CancelledError):
                await handler
        if handler in done:
            handler.result()
        else:
            log.info("client left a %s request to %s; upstream closed", self.label, role)
            raise _ClientGoneError

    async def _serve(self, role: str, payload: dict[str, Any], send: Send) -> None:
        state = self.state
        try:
            lease = await state.scheduler.acquire(role)
        except SchedulerError as exc:
            raise _scheduler_http_error(exc) from None
        try:
            await self._forward_unless_revoked(lease, payload, send)
        finally:
            state.scheduler.release(lease)

    async def _forward_unless_revoked(
        self, lease: Lease, payload: dict[str, Any], send: Send
    ) -> None:
        """Forward the request, but end it at once if the scheduler revokes the lease.

        The scheduler revokes the leases of a role it stops with requests still in
        flight (evicted after ``--drain``, unloaded, shutdown): the upstream
        request is closed here (llama-server keeps an open stream going through
        SIGTERM), and the client gets the reason: an SSE error event if its
        stream had started, else 503 with the revocation's code (``evicted``).
        """
        response: dict[str, bool] = {"started": False, "stream": False}

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["started"] = True
                response["stream"] = any(
                    k == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", [])
                )
            await send(message)

        forward = asyncio.ensure_future(self._forward(lease, payload, tracked))
        if lease.revoked is None:
            await forward
            return
        try:
            racing: set[asyncio.Future[Any]] = {forward, lease.revoked}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not forward.done():
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await forward
        if not forward.cancelled():
            forward.result()
            return
        revocation = lease.revoked.result()
        log.info("ended a %s request to %s: %s", self.label, lease.role, revocation.message)
        if not response["started"]:
            raise _HttpError(503, revocation.message, "server_error", revocation.code, 1.0)
        if response["stream"]:
            await send(_sse_error(revocation.message, "server_error", revocation.code))
        else:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_upstream(self, request: httpx.Request, role: str) -> httpx.Response:
        """Send ``request`` upstream (streamed), retrying once on a fresh connection when the
        backend closed the pooled connection without answering.

        Idle connections expire before the backend's keep-alive timeout
        (``RouterConfig.upstream_keepalive_s``), but a backend may still close
        one as the pool hands it out: the request then fails with "Server
        disconnected without sending a response" before any response byte, so
        the backend never took it and sending it again (on a new connection,
        never a pooled one) is safe. Raises
        ``httpx.HTTPError`` when the retry fails too, or for any other error.
        """
        try:
            return await self.state.client.send(request, stream=True)
        except _RETRYABLE_UPSTREAM_ERRORS as exc:
            log.info("backend of %s closed a pooled connection (%s); retrying once", role, exc)
        return await self.state.fresh_client.send(request, stream=True)

    async def _forward(self, lease: Lease, payload: dict[str, Any], send: Send) -> None:
        route = self.state.routes[lease.role]
        upstream_body = route.rewrite(payload, lease.endpoint.served_model)
        request = self.state.client.build_request(
            "POST",
            lease.endpoint.base_url + self.path,
            json=upstream_body,
            headers={
                "accept": "text/event-stream" if payload.get("stream") else "application/json"
            },
        )
        try:
            upstream = await self._send_upstream(request, lease.role)
        except httpx.HTTPError as exc:
            raise _HttpError(
                502,
                f"backend of role {lease.role!r} failed: {type(exc).__name__}: {exc}",
                "upstream_error",
                "backend_error",
            ) from None
        started = False
        try:
            content_type = upstream.headers.get("content-type", "application/json")
            if upstream.status_code >= 500:
                text = (await upstream.aread()).decode(errors="replace")[:500]
                raise _HttpError(
                    502,
                    f"backend of role {lease.role!r} answered {upstream.status_code}: {text}",
                    "upstream_error",
                    "backend_error",
                )
            headers = [(b"content-type", content_type.encode())]
            if content_type.startswith("text/event-stream"):
                headers += [
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ]
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": headers}
            )
            started = True
            stream = content_type.startswith("text/event-stream")
            tail = b""
            async for chunk in upstream.aiter_raw():
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    tail = (tail + chunk)[-64:]
            if stream and b"data: [DONE]" not in tail:
                # The backend closed the stream without its final [DONE]: it was
                # stopped (evicted after the drain time, or it died) mid-generation.
                await send(
                    _sse_error(
                        f"the stream from role {lease.role!r} ended before it finished: "
                        "its backend stopped (evicted after the drain time, or it exited)",
                        "upstream_error",
                        "backend_error",
                    )
                )
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:
            if not started:
                raise _HttpError(
                    502,
                    f"backend of role {lease.role!r} failed: {type(exc).__name__}: {exc}",
                    "upstream_error",
                    "backend_error",
                ) from None
            # Headers are out: end the stream with an SSE error event the client can see.
            with contextlib.suppress(Exception):
                await send(
                    _sse_error(
                        f"backend of role {lease.role!r} failed mid-stream: {exc}",
                        "upstream_error",
                        "backend_error",
                    )
                )
        finally:
            await upstream.aclose()


#: Upstream errors raised before any response byte on a reused connection: the backend
#: closed it without reading the request, so it is sent again on a fresh connection.
_RETRYABLE_UPSTREAM_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _sse_error(message: str, err_type: str, code: str) -> Message:
    """The last body message of a cut stream: ``data: {"error": {...}}\\n\\n`` (OpenAI's shape)."""
    event = json.dumps(error_body(message, err_type, code))
    return {"type": "http.response.body", "body": f"data: {event}\n\n".encode(), "more_body": False}


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, parsed strictly (RFC 8259).

    ``NaN``, ``Infinity`` and ``-Infinity``, numbers that overflow a float,
    invalid UTF-8 or lone surrogates, and nesting deeper than Python's
    recursion limit are refused, because the body could not be forwarded as
    valid JSON. Raises :class:`_HttpError` 400 ``invalid_json``.
    """
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
        # What the upstream request will be: UTF-8 without escapes, so a lone
        # surrogate ("\ud800") fails here rather than while forwarding.
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode()
    except RecursionError:
        raise _HttpError(
            400, "the request body is nested too deeply", "invalid_request_error", "invalid_json"
        ) from None
    except ValueError as exc:
        raise _HttpError(
            400, f"the request body is not JSON: {exc}", "invalid_request_error", "invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise _HttpError(
            400, "the request body must be a JSON object", "invalid_request_error", "invalid_json"
        )
    return data


@dataclass
class _RouterState:
    scheduler: Scheduler
    routes: Mapping[str, RoleRoute]
    names: _ModelNames
    config: RouterConfig
    metrics: RosterdMetrics
    client: httpx.AsyncClient
    # No keep-alive: every request it sends goes on a new connection (the one retry).
    fresh_client: httpx.AsyncClient
    status_extra: Callable[[], Mapping[str, object]]
    started_at: float


class _ApiKeyGate:
    """ASGI middleware: every path but ``/health`` needs ``Authorization: Bearer <key>``.

    Keys are compared with ``hmac.compare_digest`` against every configured key
    (no early exit), so timing does not reveal a key.
    """

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope.get("path") == "/health":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(given, key)
        if not ok:
            message = (
                "missing API key: send 'Authorization: Bearer <key>'"
                if not given
                else "invalid API key"
            )
            await _send_json(
                send,
                401,
                error_body(message, "authentication_error", "invalid_api_key"),
                {"WWW-Authenticate": "Bearer"},
            )
            return
        await self.app(scope, receive, send)


def _rss_bytes(pid: object) -> int | None:
    if not isinstance(pid, int):
        return None
    try:
        proc = psutil.Process(pid)
        return int(proc.memory_info().rss) + sum(
            int(c.memory_info().rss) for c in proc.children(recursive=True)
        )
    except psutil.Error:
        return None


def create_app(
    scheduler: Scheduler,
    routes: Mapping[str, RoleRoute],
    *,
    config: RouterConfig | None = None,
    metrics: RosterdMetrics | None = None,
    status_extra: Callable[[], Mapping[str, object]] | None = None,
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    unserved: Mapping[str, str] | None = None,
) -> ASGIApp:
    """The router as an ASGI app (serve it with uvicorn, bound to 127.0.0.1 unless asked).

    ``routes``: role -> :class:`RoleRoute` for every role ``scheduler`` serves;
    ``status_extra()`` adds keys to ``/status`` (e.g. ``unplaced``, remote
    nodes); ``on_shutdown`` coroutines run when the app's lifespan ends (after
    the upstream client is closed); ``unserved``: names (role ids, model
    names) known but not served by this process -> why (unplaced, or planned
    on another node), given in their 404. The scheduler's tasks are started
    with the app's lifespan.
    """
    config = config or RouterConfig()
    metrics = metrics or RosterdMetrics()
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(
            connect=config.upstream_connect_s,
            read=config.upstream_read_s,
            write=config.upstream_connect_s,
            pool=None,
        ),
        limits=httpx.Limits(
            max_connections=None,
            max_keepalive_connections=64,
            keepalive_expiry=config.upstream_keepalive_s,
        ),
        trust_env=False,  # backends are local: never route them through a proxy
    )
    fresh_client = httpx.AsyncClient(
        timeout=client.timeout,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        trust_env=False,
    )
    state = _RouterState(
        scheduler=scheduler,
        routes=routes,
        names=_ModelNames(routes, unserved),
        config=config,
        metrics=metrics,
        client=client,
        fresh_client=fresh_client,
        status_extra=status_extra or dict,
        started_at=time.time(),
    )

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def model_entry(role: str) -> dict[str, object]:
        route = routes.get(role, RoleRoute(role))
        entry: dict[str, object] = {
            "id": role,
            "object": "model",
            "created": int(state.started_at),
            "owned_by": "rosterd",
            "aliases": sorted(set(route.names)),
        }
        entry.update(route.info)
        return entry

    async def models(_: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [model_entry(role) for role in scheduler.roles]}
        )

    async def model(request: Request) -> Response:
        """OpenAI's retrieve: one model by role id, model name or alias (404 if unknown)."""
        try:
            role = state.names.resolve(request.path_params["model"])
        except _HttpError as err:
            return _error_response(err)
        return JSONResponse(model_entry(role))

    def ps_data() -> dict[str, object]:
        snap = scheduler.snapshot()
        nodes = snap["nodes"]
        assert isinstance(nodes, dict)
        for node in nodes.values():
            for info in node["roles"].values():
                info["measured_rss_bytes"] = _rss_bytes(info.get("pid"))
        return snap

    async def status(_: Request) -> Response:
        data: dict[str, object] = dict(ps_data())
        data["uptime_s"] = round(time.time() - state.started_at, 3)
        data.update(state.status_extra())
        return JSONResponse(data)

    async def ps(_: Request) -> Response:
        return JSONResponse(ps_data())

    async def events(_: Request) -> Response:
        return JSONResponse({"events": [e.as_json() for e in scheduler.events()]})

    async def metrics_endpoint(_: Request) -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    def admin_role(request: Request) -> str:
        """The role ``{role}`` names; raises :class:`_HttpError` 400 ``invalid_role`` for a
        name that is not a plain token (at most 64 bytes), 404 for an unknown one."""
        name = request.path_params["role"]
        if not valid_token(name, 64):
            shown = repr(name) if len(name) <= 200 else f"{name[:200]!r}…"
            raise _HttpError(
                400,
                f"role {shown} is not a plain token (1 to 64 ASCII letters, digits, '.', '_' "
                "or '-', starting with a letter or digit); give a role id, an alias id or a "
                "model name that is one",
                "invalid_request_error",
                "invalid_role",
            )
        return state.names.resolve(name)

    async def load(request: Request) -> Response:
        try:
            role = admin_role(request)
            lease = await scheduler.load(role)
        except _HttpError as err:
            return _error_response(err)
        except SchedulerError as exc:
            return _error_response(_scheduler_http_error(exc))
        return JSONResponse(
            {"role": role, "node": lease.node, "base_url": lease.endpoint.base_url, "ready": True}
        )

    async def unload(request: Request) -> Response:
        try:
            role = admin_role(request)
            await scheduler.unload(role)
        except _HttpError as err:
            return _error_response(err)
        except SchedulerError as exc:
            return _error_response(_scheduler_http_error(exc))
        return JSONResponse({"role": role, "resident": False})

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            error_body(
                f"no route {request.method} {request.url.path}",
                "invalid_request_error",
                "not_found",
            ),
            status_code=404,
        )

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            error_body(
                f"method {request.method} is not allowed on {request.url.path}",
                "invalid_request_error",
                "method_not_allowed",
            ),
            status_code=405,
        )

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return JSONResponse(
            error_body(f"internal error: {exc}", "server_error", "internal_error"), status_code=500
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> Any:
        scheduler.start()
        try:
            yield
        finally:
            await client.aclose()
            await fresh_client.aclose()
            for hook in on_shutdown:
                await hook()

    route_list = [
        Route("/health", health, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/rosterd/ps", ps, methods=["GET"]),
        Route("/rosterd/events", events, methods=["GET"]),
        Route("/rosterd/load/{role}", load, methods=["POST"]),
        Route("/rosterd/unload/{role}", unload, methods=["POST"]),
    ]
    route_list += [Route(path, _Proxy(state, path), methods=["POST"]) for path in PROXIED_PATHS]
    app = Starlette(
        routes=route_list,
        exception_handlers={404: not_found, 405: method_not_allowed, 500: server_error},
        lifespan=lifespan,
    )
    return _ApiKeyGate(app, config.api_keys)
