"""Ollama's generation routes (DESIGN.md layer 7): ``/api/chat``, ``/api/generate``,
``/api/embed``, ``/api/embeddings``, each a raw ASGI app.

A request goes through the OpenAI :class:`~rosterd.router.proxy.Proxy` like any
other, so it is queued, loads its role on demand, has the same deadlines, and
is cut the same way when the client leaves or the scheduler revokes its lease:

- a role whose backend answers Ollama's API itself (an ``ollama`` role,
  ``RoleRoute.ollama_api``) gets the request as it came, on the same path, but
  for ``model`` (the role's tag) and ``keep_alive`` (``-1``, as rosterd's own load
  asks: the scheduler, not ollama's timer, decides when it leaves memory);
- any other role gets the OpenAI request of :func:`~.requests.openai_call`, and
  its answer comes back in Ollama's shapes (:mod:`.answers`): one JSON object, or
  NDJSON lines (``application/x-ndjson``) when streamed.

A request that only names its model loads the role (``rosterd load``'s path) and
answers ``done_reason: load``; with ``keep_alive: 0`` it unloads it (``unload``). A
request with ``keep_alive: 0`` that generates unloads its role once its answer is
complete, before the answer's last line is sent, so the client sees the role gone
from ``/api/ps`` when it has its answer. Errors come in Ollama's envelope,
``{"error": "..."}``, with the status the error table gives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from starlette.types import Message, Receive, Scope, Send

from rosterd.errors import ClientGoneError, RouterError
from rosterd.router.body import parse_json_object, read_body, requested_model
from rosterd.router.ollama.answers import (
    StreamTranslator,
    error_line,
    error_message,
    load_answer,
    whole_answer,
)
from rosterd.router.ollama.requests import (
    keep_alive_zero,
    loads_only,
    openai_call,
    resolve_ollama_name,
)
from rosterd.router.openai_errors import scheduler_errors
from rosterd.router.proxy import Proxy, ProxyContext
from rosterd.router.routing import NODE_SCOPE, ROLE_SCOPE
from rosterd.router.validation import check_request

log = logging.getLogger("rosterd.router")

#: Ollama's generation paths -> the kind of request (also the metrics' endpoint label,
#: ``ollama_<kind>``).
OLLAMA_PATHS: Mapping[str, str] = {
    "/api/chat": "chat",
    "/api/generate": "generate",
    "/api/embed": "embed",
    "/api/embeddings": "embeddings",
}

#: The OpenAI route each kind is translated to (``generate`` with ``raw: true`` goes to
#: ``/v1/completions``; :func:`openai_call` says which).
_OPENAI_PATHS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")

_NDJSON = b"application/x-ndjson"


def metrics_label(kind: str) -> str:
    """The ``endpoint`` label of ``rosterd_requests_total`` for an Ollama ``kind``."""
    return f"ollama_{kind}"


class OllamaGeneration:
    """The raw ASGI app of one Ollama generation path (a key of :data:`OLLAMA_PATHS`)."""

    def __init__(self, ctx: ProxyContext, path: str) -> None:
        self.ctx = ctx
        self.path = path
        self.kind = OLLAMA_PATHS[path]
        self.label = metrics_label(self.kind)
        self.native = Proxy(ctx, path, label=self.label)
        self.translated = {p: Proxy(ctx, p, label=self.label) for p in _OPENAI_PATHS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        role = "-"
        try:
            config = self.ctx.config
            body = await read_body(
                scope, receive, config.max_body_bytes, timeout_s=config.request_read_timeout_s
            )
            payload = parse_json_object(body)
            model = requested_model(payload)
            role = resolve_ollama_name(self.ctx.names, model)
            # The access log's role and node, for an answer refused before a lease.
            scope[ROLE_SCOPE], scope[NODE_SCOPE] = role, self.ctx.scheduler.node_names(role)
            check_request(self.path, payload, ctx_size=self.ctx.routes[role].ctx_size)
            if loads_only(self.kind, payload):
                await self._load_or_unload(role, model, payload, send)
                self._count(role, 200, started)
                return
            await self._generate(scope, receive, send, role, model, payload, started)
        except ClientGoneError:
            self._count(role, 499, started)
        except RouterError as err:
            await send_ollama_error(send, err)
            self._count(role, err.status, started)

    async def _load_or_unload(
        self, role: str, model: str, payload: Mapping[str, Any], send: Send
    ) -> None:
        unload = keep_alive_zero(payload)
        with scheduler_errors():
            if unload:
                await self.ctx.scheduler.unload(role)
            else:
                await self.ctx.scheduler.load(role)
        reason = "unload" if unload else "load"
        answer = load_answer(self.kind, model=model, now_s=time.time(), reason=reason)
        await _send_json(send, 200, json.dumps(answer).encode())

    async def _generate(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        role: str,
        model: str,
        payload: dict[str, Any],
        started: float,
    ) -> None:
        """Forward through the proxy (the role's own Ollama API, or translated), relaying
        the answer in Ollama's shapes; with ``keep_alive: 0``, unload before its end."""
        unload = keep_alive_zero(payload)
        if self.ctx.routes[role].ollama_api:
            proxy = self.native
            body = {**payload, "model": role, "keep_alive": -1}
            relay = _Relay(send, None, hold_end=unload, started=started)
        else:
            call = openai_call(self.kind, role, payload)
            proxy, body = self.translated[call.path], call.body
            translate = _Translation(self.kind, model, call.stream)
            relay = _Relay(send, translate, hold_end=unload, started=started)
        inner_scope = {
            **scope,
            "headers": [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"],
        }
        await proxy(inner_scope, _replay(json.dumps(body).encode(), receive), relay.send)
        if unload:
            try:
                with scheduler_errors():
                    await self.ctx.scheduler.unload(role)
            except RouterError as err:  # the answer is out; the unload is the operator's
                log.warning("keep_alive 0: could not unload %s: %s", role, err.message)
        with contextlib.suppress(OSError, ClientGoneError):
            await relay.flush()

    def _count(self, role: str, status: int, started: float) -> None:
        """Count a request the proxy did not (an early error, a load): as the proxy does."""
        metrics = self.ctx.metrics
        metrics.requests.labels(role=role, endpoint=self.label, code=str(status)).inc()
        metrics.request_duration.labels(role=role, endpoint=self.label).observe(
            time.perf_counter() - started
        )


class _Translation:
    """What the relay needs to turn an OpenAI answer into Ollama's: the request's
    ``kind``, the ``model`` name the client gave, whether it ``stream``s."""

    __slots__ = ("kind", "model", "stream", "translator")

    def __init__(self, kind: str, model: str, stream: bool) -> None:
        self.kind = kind
        self.model = model
        self.stream = stream
        self.translator = StreamTranslator(kind, model)


class _Relay:
    """The ``send`` the proxy answers through: passes the answer on in Ollama's shapes.

    ``translate`` ``None``: the backend speaks Ollama (passed through but for error
    answers and a cut stream's error event, which become Ollama's ``{"error"}``).
    ``hold_end``: keep the answer's last message until :meth:`flush` (after an unload).
    """

    def __init__(
        self, send: Send, translate: _Translation | None, *, hold_end: bool, started: float
    ) -> None:
        self._send = send
        self.translate = translate
        self.hold_end = hold_end
        self.started = started
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.mode = ""  # "error", "stream", "whole", "pass"
        self.buffer = b""
        self.held: list[Message] = []

    def _elapsed_ns(self) -> int:
        return int((time.perf_counter() - self.started) * 1e9)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            await self._start(message)
            return
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if self.mode in ("error", "whole"):
            self.buffer += chunk
            if not more:
                await self._finish_buffered()
            return
        if self.mode == "stream":
            assert self.translate is not None
            chunk = self.translate.translator.feed(
                chunk, now_s=time.time(), total_ns=self._elapsed_ns()
            )
        elif not more and chunk.startswith(b"data: "):
            # The proxy's SSE error event ending a cut stream: Ollama's error line instead.
            chunk = error_line(error_message(chunk[len(b"data: ") :].strip()))
        await self._out({"type": "http.response.body", "body": chunk, "more_body": more})

    async def _start(self, message: Message) -> None:
        self.status = int(message["status"])
        self.headers = [
            (k, v) for k, v in message.get("headers", []) if k not in (b"content-length",)
        ]
        content_type = dict(self.headers).get(b"content-type", b"")
        if self.status >= 400:
            self.mode = "error"
        elif self.translate is None:
            self.mode = "pass"
            await self._out(message)
        elif content_type.startswith(b"text/event-stream"):
            self.mode = "stream"
            headers = [(k, v) for k, v in self.headers if k != b"content-type"]
            headers.append((b"content-type", _NDJSON))
            await self._out({**message, "headers": headers})
        else:
            self.mode = "whole"

    async def _finish_buffered(self) -> None:
        if self.mode == "error":
            body = error_line(error_message(self.buffer))
        else:
            assert self.translate is not None
            try:
                data = json.loads(self.buffer)
            except ValueError:
                data = {}
            answer = whole_answer(
                self.translate.kind,
                data if isinstance(data, dict) else {},
                model=self.translate.model,
                now_s=time.time(),
                total_ns=self._elapsed_ns(),
            )
            body = json.dumps(answer, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in self.headers if k != b"content-type"]
        headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await self._out({"type": "http.response.start", "status": self.status, "headers": headers})
        await self._out({"type": "http.response.body", "body": body, "more_body": False})

    async def _out(self, message: Message) -> None:
        if self.hold_end and (self.held or _is_last(message) or self.mode in ("whole", "error")):
            self.held.append(message)
            return
        await self._send(message)

    async def flush(self) -> None:
        """Send what :attr:`hold_end` kept back."""
        held, self.held = self.held, []
        for message in held:
            await self._send(message)


def _is_last(message: Message) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)


async def send_ollama_error(send: Send, err: RouterError) -> None:
    """Answer a raw ASGI request with ``err`` in Ollama's envelope (nothing sent yet)."""
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers().items()]
    body = error_line(err.message)
    headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` as the request, then waits on the client's own
    ``receive`` (where its disconnect comes)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
