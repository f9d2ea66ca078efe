"""The access log (DESIGN.md layer 7): one line per request, who asked what and how it ended.

:class:`AccessLog` is ASGI middleware outside every other part of the router (the key
gate included, so a 401 leaves its line too). It watches a request go by and, when
its answer has ended, logs one :class:`AccessLine` on the ``rosterd.access`` logger:
every request to a model path (the proxied OpenAI, Anthropic, Responses and rerank
paths, Ollama's generation paths), and any other request answered 4xx or 5xx.

It reads only what passes: the request's ``model`` from its body, the role, node,
queue wait and load from the ``X-Rosterd-*`` headers (``wait_report``), the error's
code and message from the answer's envelope (OpenAI's, Anthropic's, Ollama's, or a
cut stream's last SSE event: for a backend's own failure the message quotes the
backend's words), the tokens from the usage at the answer's end. Nothing in the
request path changes. The key name is what the key gate leaves in the request's scope
(empty on an open router).

:func:`plain_line` and :func:`json_line` are the two forms (``--access-log-format``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rosterd.router.auth import KEY_NAME_SCOPE
from rosterd.router.dialects.envelope import STREAM_ENDS
from rosterd.router.proxy import CLIENT_CLOSED_STATUS
from rosterd.router.routing import NODE_SCOPE, PROXIED_PATHS, ROLE_SCOPE
from rosterd.router.usage_hook import said_prompt_tokens

log = logging.getLogger("rosterd.access")

#: Request body bytes kept to read its ``model`` (a model name sits in the first bytes).
BODY_KEPT_BYTES = 64 * 2**10
#: Answer bytes kept from its end, for the error and the usage.
TAIL_KEPT_BYTES = 16 * 2**10
#: Ollama's paths that generate (the rest of ``/api/`` is the catalog).
OLLAMA_MODEL_PATHS = frozenset({"/api/chat", "/api/generate", "/api/embed", "/api/embeddings"})

_TOKENS_IN = re.compile(rb'"(?:prompt_tokens|input_tokens|prompt_eval_count)"\s*:\s*(\d+)')
_TOKENS_OUT = re.compile(rb'"(?:completion_tokens|output_tokens|eval_count)"\s*:\s*(\d+)')
_SSE_DATA = re.compile(rb"data: (\{.*\})")
# llama-server's own counts, in the ``timings`` of a stream's last chunk: it sends OpenAI's
# ``usage`` there only when asked (``stream_options.include_usage``). ``prompt_n`` counts the
# prompt tokens it evaluated, ``cache_n`` those it reused from its cache.
_PREDICTED_N = re.compile(rb'"predicted_n"\s*:\s*(\d+)')
_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d+)')
_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')


@dataclass(frozen=True)
class AccessLine:
    """One request. Times in seconds (``None``: it did not happen, e.g. no first byte);
    ``time``: ISO 8601 UTC when it arrived; empty strings for what is not known; ``node``:
    the node that served it, or for a further copy on another of the node's devices the
    copy's key (``box/chat~2``)."""

    time: str
    client: str
    key: str
    dialect: str
    method: str
    path: str
    model: str
    role: str
    node: str
    status: int
    code: str
    reason: str
    queue_wait_s: float | None
    load_s: float | None
    first_byte_s: float | None
    duration_s: float
    tokens_in: int | None
    tokens_out: int | None


def dialect_of(path: str) -> str:
    """``openai``, ``anthropic``, ``responses``, ``rerank``, ``ollama`` or ``rosterd``."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path == "/v1/responses":
        return "responses"
    if path.endswith("/rerank"):
        return "rerank"
    if path.startswith("/api/"):
        return "ollama"
    return "openai" if path in PROXIED_PATHS else "rosterd"


def plain_line(line: AccessLine) -> str:
    """The plain form: ``key=value`` pairs, a value with spaces quoted (JSON string)."""

    def shown(value: object) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3f}"
        text = str(value)
        return json.dumps(text, ensure_ascii=False) if not text or " " in text else text

    return " ".join(f"{name}={shown(value)}" for name, value in asdict(line).items())


def json_line(line: AccessLine) -> str:
    """The JSON form: one object per line, every field of :class:`AccessLine`."""
    return json.dumps(asdict(line), ensure_ascii=False, separators=(",", ":"))


class AccessFormatter(logging.Formatter):
    """A ``logging`` formatter of the ``rosterd.access`` records: ``plain`` or ``json``."""

    def __init__(self, form: str = "plain") -> None:
        super().__init__()
        if form not in ("plain", "json"):
            raise ValueError(f"access log format {form!r}: expected plain or json")
        self.form = form

    def format(self, record: logging.LogRecord) -> str:
        line = getattr(record, "access", None)
        if not isinstance(line, AccessLine):
            return super().format(record)
        return json_line(line) if self.form == "json" else plain_line(line)


class AccessLog:
    """ASGI middleware: ``app`` with one :class:`AccessLine` logged per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        seen = _Seen(time.perf_counter())
        ends = STREAM_ENDS.get(str(scope.get("path", "")), (b"data: [DONE]",))

        async def receive_seen() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not seen.finished:
                # A client that closes once it read the stream's final event (the SDKs do,
                # before the body's close) got its whole answer: it did not leave.
                seen.client_left = not any(end in seen.tail for end in ends)
            if message["type"] == "http.request" and len(seen.body) < BODY_KEPT_BYTES:
                seen.body += message.get("body", b"")[: BODY_KEPT_BYTES - len(seen.body)]
            return message

        async def send_seen(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.status = int(message["status"])
                seen.headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1")
                    for k, v in message.get("headers", ())
                }
            elif message["type"] == "http.response.body":
                chunk: bytes = message.get("body", b"")
                if chunk and seen.first_byte_s is None:
                    seen.first_byte_s = time.perf_counter() - seen.started
                seen.tail = (seen.tail + chunk)[-TAIL_KEPT_BYTES:]
                seen.finished = seen.finished or not message.get("more_body", False)
            await send(message)

        arrived = datetime.now(UTC).isoformat(timespec="milliseconds")
        try:
            await self.app(scope, receive_seen, send_seen)
        finally:
            path = str(scope.get("path", ""))
            if path in PROXIED_PATHS or path in OLLAMA_MODEL_PATHS or seen.status >= 400:
                line = seen.line(scope, arrived, time.perf_counter() - seen.started)
                log.info("%s %s %s", line.method, line.path, line.status, extra={"access": line})


class _Seen:
    """What :class:`AccessLog` saw of one request."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.body = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self.first_byte_s: float | None = None
        self.tail = b""
        self.finished = False  # the answer's last body message was sent
        self.client_left = False  # the client disconnected before that

    def line(self, scope: Scope, arrived: str, duration_s: float) -> AccessLine:
        client = scope.get("client")
        cut = b'data: {"error"' in self.tail  # a stream that ended with an error event
        code, reason = _error_of(self.tail) if self.status >= 400 or cut else ("", "")
        # rosterd's own code, the same in every dialect (Anthropic's envelope says
        # not_found_error where OpenAI's says model_not_found, Ollama's says none)
        code = self.headers.get("x-rosterd-error") or code
        status = self.status or 500
        if self.client_left:
            # It left before the answer's end: logged as nginx does, not as the 200 it began.
            status, code = CLIENT_CLOSED_STATUS, "client_closed"
            reason = (
                f"the client closed the connection after {duration_s:.1f} s, "
                "before the answer ended"
            )
        path = str(scope.get("path", ""))
        return AccessLine(
            time=arrived,
            client=f"{client[0]}:{client[1]}" if client else "",
            key=str(scope.get(KEY_NAME_SCOPE, "")),
            dialect=dialect_of(path),
            method=str(scope.get("method", "")),
            path=path,
            model=_model_of(self.body),
            role=self.headers.get("x-rosterd-role") or str(scope.get(ROLE_SCOPE, "")),
            node=self.headers.get("x-rosterd-copy")  # box/chat~2: which of its node's copies
            or self.headers.get("x-rosterd-node")
            or str(scope.get(NODE_SCOPE, "")),
            status=status,
            code=code,
            reason=reason,
            queue_wait_s=_seconds(self.headers.get("x-rosterd-queue-wait-s")),
            load_s=_seconds(self.headers.get("x-rosterd-load-s")),
            first_byte_s=self.first_byte_s,
            duration_s=duration_s,
            tokens_in=_tokens_in(self.tail),
            tokens_out=_first_of(_last_int(_TOKENS_OUT, self.tail), _PREDICTED_N, self.tail),
        )


def _model_of(body: bytes) -> str:
    try:
        payload = json.loads(body)
    except ValueError:
        match = re.search(rb'"model"\s*:\s*"([^"\\]{1,200})"', body)
        return match.group(1).decode(errors="replace") if match else ""
    model = payload.get("model") if isinstance(payload, dict) else None
    return model[:200] if isinstance(model, str) else ""


def _error_of(tail: bytes) -> tuple[str, str]:
    """The code and message of the envelope at the answer's end: a JSON body, or a cut
    stream's last ``data:`` event."""
    candidates: list[Any] = []
    try:
        candidates.append(json.loads(tail))
    except ValueError:
        for match in reversed(_SSE_DATA.findall(tail)):
            try:
                candidates.append(json.loads(match))
            except ValueError:
                continue
            break
    for data in candidates:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, str):  # Ollama's {"error": "..."}
            return "", error
        if isinstance(error, dict):
            code = error.get("code") or error.get("type") or ""
            return str(code), str(error.get("message", ""))
    return "", ""


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _last_int(pattern: re.Pattern[bytes], data: bytes) -> int | None:
    found = pattern.findall(data)
    return int(found[-1]) if found else None


def _first_of(found: int | None, pattern: re.Pattern[bytes], data: bytes) -> int | None:
    return found if found is not None else _last_int(pattern, data)


def _tokens_in(tail: bytes) -> int | None:
    """The prompt's tokens, the whole prompt's as the key's usage counts them
    (:func:`~rosterd.router.usage_hook.said_prompt_tokens`: Anthropic's ``input_tokens``
    leaves out what its cache held), else llama-server's timings (evaluated plus reused
    from its cache)."""
    if _TOKENS_IN.search(tail):  # the answer's usage, as the key's usage counts it
        return said_prompt_tokens(tail)
    evaluated = _last_int(_PROMPT_N, tail)
    if evaluated is None:
        return None
    return evaluated + (_last_int(_CACHE_N, tail) or 0)
