"""The proxy (DESIGN.md layer 7): one raw ASGI app per OpenAI path, forwarding to a backend.

httpx sends the upstream request and streams the answer back unbuffered. The
proxy is a raw ASGI app rather than a Starlette endpoint because it races the
request against the client's ``http.disconnect``: a client that leaves cancels
the handler at once, which closes the upstream connection (so llama-server
stops generating and frees its slot) and gives the lease back. It also ends a
request at once when the scheduler revokes its lease, and sends a request once
more on a fresh connection when the backend closed the pooled one unanswered.
A backend that stalls (no byte within a deadline) or cannot be reached is
handled by :mod:`~rosterd.router.liveness`: the request ends with 504 and the
role is probed, or the request waits for the restarted backend.

Errors are :class:`RouterError` values from ``openai_errors``; the scheduler's
and httpx's errors are mapped there, at the ``with`` blocks around their calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.types import Message, Receive, Scope, Send

from rosterd.errors import ClientGoneError
from rosterd.metrics import RosterdMetrics
from rosterd.router.body import parse_json_object, read_body, requested_model
from rosterd.router.liveness import (
    MAX_RESTART_WAITS,
    Deadlines,
    StalledError,
    backend_unreachable,
    end_stalled,
    forward_within_deadlines,
)
from rosterd.router.openai_errors import (
    RouterError,
    revoked_error,
    scheduler_errors,
    send_error,
    sse_error_event,
    upstream_errors,
    upstream_status_error,
)
from rosterd.router.routing import PROXIED_PATHS, ModelNames, RoleRoute, RouterConfig
from rosterd.scheduler import Lease, Scheduler

log = logging.getLogger("rosterd.router")

#: Upstream errors raised before any response byte on a reused connection: the backend
#: closed it without reading the request, so it is sent again on a fresh connection.
_RETRYABLE_UPSTREAM_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)

#: nginx's "client closed request": the status counted in metrics for a client that left.
CLIENT_CLOSED_STATUS = 499


def upstream_clients(config: RouterConfig) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """The two httpx clients towards backends: ``(pooled, fresh)``.

    ``pooled`` keeps idle connections ``config.upstream_keepalive_s`` seconds;
    ``fresh`` keeps none, so every request it sends goes on a new connection
    (the one retry of :meth:`Proxy._send_upstream`). Neither reads proxy
    settings from the environment: backends are local or on the lab's nodes.
    """
    # Our own deadlines (first byte, between chunks) come first; httpx's read timeout
    # is only the backstop.
    read_s = max(config.upstream_read_s, config.first_byte_timeout_s, config.chunk_timeout_s)
    pooled = httpx.AsyncClient(
        timeout=httpx.Timeout(
            connect=config.upstream_connect_s,
            read=read_s + 1.0,
            write=config.upstream_connect_s,
            pool=None,
        ),
        limits=httpx.Limits(
            max_connections=None,
            max_keepalive_connections=64,
            keepalive_expiry=config.upstream_keepalive_s,
        ),
        trust_env=False,
    )
    fresh = httpx.AsyncClient(
        timeout=pooled.timeout,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        trust_env=False,
    )
    return pooled, fresh


@dataclass(frozen=True)
class ProxyContext:
    """What every proxied path shares: the scheduler that grants leases, the routes and
    names, the limits, the metrics and the two upstream clients (see :func:`upstream_clients`)."""

    scheduler: Scheduler
    routes: Mapping[str, RoleRoute]
    names: ModelNames
    config: RouterConfig
    metrics: RosterdMetrics
    client: httpx.AsyncClient
    fresh_client: httpx.AsyncClient


def _is_event_stream(message: Message) -> bool:
    return any(
        k == b"content-type" and v.startswith(b"text/event-stream")
        for k, v in message.get("headers", [])
    )


class Proxy:
    """The raw ASGI app behind one proxied OpenAI path (a key of ``PROXIED_PATHS``).

    Counts every request in ``rosterd_requests_total`` (by role, endpoint and
    status; 499 for a client that left) and its duration.
    """

    def __init__(self, ctx: ProxyContext, path: str) -> None:
        self.ctx = ctx
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
                sse["open"] = _is_event_stream(message)
            elif not message.get("more_body", False):
                sse["open"] = False
            await send(message)

        try:
            config = self.ctx.config
            body = await read_body(
                scope, receive, config.max_body_bytes, timeout_s=config.request_read_timeout_s
            )
            payload = parse_json_object(body)
            role = self.ctx.names.resolve(requested_model(payload))
            await self._race_disconnect(role, payload, receive, tracked_send)
        except ClientGoneError:
            status["code"] = CLIENT_CLOSED_STATUS
        except asyncio.CancelledError:
            # uvicorn cancels the requests still running when the drain time at
            # shutdown is over. End the response so the client can tell it was cut
            # (a 503, or an SSE error event if a stream had started); not re-raised,
            # since the response is then complete and uvicorn has nothing left to do.
            with contextlib.suppress(Exception):
                if status["code"] == 0:
                    err = RouterError("shutting_down", "rosterd is shutting down")
                    await send_error(scope, receive, tracked_send, err)
                elif sse["open"]:
                    err = RouterError(
                        "shutting_down",
                        f"the stream from role {role!r} was cut: rosterd is shutting down "
                        "and the drain time is over",
                    )
                    await tracked_send(sse_error_event(err))
        except RouterError as err:
            await send_error(scope, receive, tracked_send, err)
        finally:
            metrics = self.ctx.metrics
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
            raise ClientGoneError(f"the client left its {self.label} request to {role}")

    async def _serve(self, role: str, payload: dict[str, Any], send: Send) -> None:
        scheduler = self.ctx.scheduler
        with scheduler_errors():
            lease = await scheduler.acquire(role)
        waits = 0
        while True:
            try:
                await self._forward_unless_revoked(lease, payload, send)
                return
            except RouterError as err:
                if waits >= MAX_RESTART_WAITS or not backend_unreachable(err):
                    raise
                # Nothing was sent to the client and the backend never answered: wait for
                # the supervisor's restart (a newer generation) rather than a dead port.
                waits += 1
                log.info("backend of %s unreachable (%s); waiting for its restart", role, err)
            finally:
                scheduler.release(lease)
            with scheduler_errors():
                lease = await scheduler.acquire(role, newer_than=lease.generation)

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
                response["stream"] = _is_event_stream(message)
            await send(message)

        deadlines = Deadlines(self.ctx.config.first_byte_timeout_s, self.ctx.config.chunk_timeout_s)
        forward = asyncio.ensure_future(
            forward_within_deadlines(
                lambda out: self._forward(lease, payload, out), tracked, deadlines, lease.role
            )
        )
        try:
            await self._race_revocation(lease, forward, response, send)
        except StalledError as stall:
            log.warning("ended a %s request to %s: %s", self.label, lease.role, stall)
            self.ctx.scheduler.suspect(lease, str(stall))
            await end_stalled(
                stall, started=response["started"], stream=response["stream"], send=send
            )

    async def _race_revocation(
        self,
        lease: Lease,
        forward: asyncio.Future[None],
        response: dict[str, bool],
        send: Send,
    ) -> None:
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
        err = revoked_error(lease.revoked.result())
        log.info("ended a %s request to %s: %s", self.label, lease.role, err.message)
        if not response["started"]:
            raise err
        if response["stream"]:
            await send(sse_error_event(err))
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
            return await self.ctx.client.send(request, stream=True)
        except _RETRYABLE_UPSTREAM_ERRORS as exc:
            log.info("backend of %s closed a pooled connection (%s); retrying once", role, exc)
        return await self.ctx.fresh_client.send(request, stream=True)

    async def _forward(self, lease: Lease, payload: dict[str, Any], send: Send) -> None:
        """Send the request to ``lease``'s backend and pass its answer through.

        Raises :class:`RouterError` 502 ``backend_error`` while nothing was
        sent to the client yet; once the answer started, a failure or a stream
        that ends without ``data: [DONE]`` ends it with an SSE error event.
        """
        role = lease.role
        upstream_body = self.ctx.routes[role].rewrite(payload, lease.endpoint.served_model)
        request = self.ctx.client.build_request(
            "POST",
            lease.endpoint.base_url + self.path,
            json=upstream_body,
            headers={
                "accept": "text/event-stream" if payload.get("stream") else "application/json"
            },
        )
        with upstream_errors(role):
            upstream = await self._send_upstream(request, role)
        try:
            content_type = upstream.headers.get("content-type", "application/json")
            if upstream.status_code >= 500:
                with upstream_errors(role):
                    text = (await upstream.aread()).decode(errors="replace")
                raise upstream_status_error(role, upstream.status_code, text)
            stream = content_type.startswith("text/event-stream")
            headers = [(b"content-type", content_type.encode())]
            if stream:
                headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": headers}
            )
            try:
                with upstream_errors(role, mid_stream=True):
                    tail = await _pass_body(upstream, send)
            except RouterError as err:
                # Headers are out: end the answer with an SSE error event the client can see.
                with contextlib.suppress(Exception):
                    await send(sse_error_event(err))
                return
            if stream and b"data: [DONE]" not in tail:
                # The backend closed the stream without its final [DONE]: it was
                # stopped (evicted after the drain time, or it died) mid-generation.
                cut = RouterError(
                    "backend_error",
                    f"the stream from role {role!r} ended before it finished: "
                    "its backend stopped (evicted after the drain time, or it exited)",
                )
                await send(sse_error_event(cut))
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await upstream.aclose()


async def _pass_body(upstream: httpx.Response, send: Send) -> bytes:
    """Send ``upstream``'s body on chunk by chunk (response left open); returns its last
    64 bytes, where a finished event stream has its ``data: [DONE]``."""
    tail = b""
    async for chunk in upstream.aiter_raw():
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            tail = (tail + chunk)[-64:]
    return tail


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
