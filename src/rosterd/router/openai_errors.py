"""The router's errors (DESIGN.md layer 7): one error tree, one table, one OpenAI envelope.

Every error answer of the router is a :class:`RouterError`; its ``code`` picks
one row of :data:`ERROR_KINDS`, which gives the HTTP status, the OpenAI error
``type``, the default ``Retry-After`` and any fixed header. This module is the
only place that builds the OpenAI error body, the SSE error event that ends a
cut stream and the ``Retry-After`` header, and the only place where the errors
of the layers below are mapped to ours, each in one context manager at the
boundary (as httpx maps httpcore's errors in ``map_httpcore_exceptions``)::

    RosterdError
     └── RouterError            one error answer: code -> status, type, Retry-After
         (mapped here from)
         ├── SchedulerError     scheduler_errors(): queue_full, queue_timeout, ...
         ├── Revocation         revoked_error(): evicted, shutting_down, backend_unhealthy
         └── UpstreamError      upstream_errors(role): backend_error

The shapes follow OpenAI's API: ``{"error": {"message", "type", "code",
"param": null}}`` as the body, and ``data: {"error": {...}}`` as the last event
of a stream. Starlette's ``Response`` carries the body; it is an ASGI app, so
the plain endpoints and the raw ASGI proxy send errors the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from rosterd.errors import (
    LoadBackoffError,
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    RoleUnavailableError,
    RosterdError,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.router.upstream import UpstreamError
from rosterd.scheduler.values import Revocation

log = logging.getLogger("rosterd.router")

#: OpenAI's error types (``error.type``); clients branch on them to decide whether to retry.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"
UPSTREAM = "upstream_error"


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """One row of the error table: what an error ``code`` answers.

    ``status``: the HTTP status; ``type``: the OpenAI error type;
    ``retry_after_s``: the default ``Retry-After``, seconds (``None``: no
    header unless the error carries one); ``headers``: fixed extra headers.
    """

    status: int
    type: str
    retry_after_s: float | None = None
    headers: tuple[tuple[str, str], ...] = ()


#: Error code (OpenAI's ``error.code``) -> what it answers. Every error the router sends is here.
ERROR_KINDS: Mapping[str, ErrorKind] = MappingProxyType(
    {
        "bad_request": ErrorKind(400, INVALID_REQUEST),  # e.g. an invalid Content-Length
        "invalid_json": ErrorKind(400, INVALID_REQUEST),
        "model_missing": ErrorKind(400, INVALID_REQUEST),
        "invalid_role": ErrorKind(400, INVALID_REQUEST),
        # RFC 9110 §11.6.1: a 401 names the scheme it wants.
        "invalid_api_key": ErrorKind(
            401, AUTHENTICATION, headers=(("WWW-Authenticate", "Bearer"),)
        ),
        "model_not_found": ErrorKind(404, INVALID_REQUEST),
        "not_found": ErrorKind(404, INVALID_REQUEST),
        "method_not_allowed": ErrorKind(405, INVALID_REQUEST),
        # The client did not send its headers or body within --request-read-timeout.
        "request_timeout": ErrorKind(408, INVALID_REQUEST, headers=(("Connection", "close"),)),
        "body_too_large": ErrorKind(413, INVALID_REQUEST),
        # The role's backend does not serve this endpoint (llama-server's 501 for embeddings
        # without --embeddings): the request's fault, not worth a retry.
        "not_supported": ErrorKind(400, INVALID_REQUEST),
        # A reload refused: the files are invalid (file, line, column in the message).
        "invalid_config": ErrorKind(422, INVALID_REQUEST),
        "queue_full": ErrorKind(429, RATE_LIMIT),  # Retry-After: the scheduler's estimate
        "internal_error": ErrorKind(500, SERVER),
        "backend_error": ErrorKind(502, UPSTREAM),
        "backend_load_failed": ErrorKind(502, UPSTREAM, retry_after_s=5.0),
        # No byte within --first-byte-timeout / --chunk-timeout; the role is probed.
        "backend_timeout": ErrorKind(504, UPSTREAM, retry_after_s=5.0),
        # Its generation probe failed: the requests on it were ended, it is restarting.
        "backend_unhealthy": ErrorKind(503, SERVER, retry_after_s=5.0),
        # Its last loads failed; Retry-After: the scheduler's time left in the backoff.
        "load_backoff": ErrorKind(503, SERVER),
        "queue_timeout": ErrorKind(503, SERVER),  # Retry-After: the scheduler's estimate
        "shutting_down": ErrorKind(503, SERVER, retry_after_s=5.0),
        "evicted": ErrorKind(503, SERVER, retry_after_s=1.0),
        "role_refused": ErrorKind(503, SERVER),
        "model_unavailable": ErrorKind(503, SERVER),
        "unavailable": ErrorKind(503, SERVER),
    }
)


class RouterError(RosterdError):
    """One OpenAI error answer: ``code`` (a key of :data:`ERROR_KINDS`) and ``message``.

    ``retry_after_s`` (seconds) overrides the table's default ``Retry-After``
    when given. ``status``, ``err_type`` and ``headers()`` come from the table.
    Raises ``KeyError`` for a code missing from the table (a bug, not a
    request's fault).
    """

    def __init__(self, code: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = ERROR_KINDS[code]
        self.code = code
        self.message = message
        self.retry_after_s = self.kind.retry_after_s if retry_after_s is None else retry_after_s

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.kind.status

    @property
    def err_type(self) -> str:
        """The OpenAI error type."""
        return self.kind.type

    def headers(self) -> dict[str, str]:
        """The answer's extra headers: the table's, and ``Retry-After`` when there is one."""
        headers = dict(self.kind.headers)
        if self.retry_after_s is not None:
            headers["Retry-After"] = retry_after_header(self.retry_after_s)
        return headers

    def body(self) -> dict[str, object]:
        """The OpenAI error body of this error."""
        return error_body(self.message, self.err_type, self.code)


def error_body(message: str, err_type: str, code: str) -> dict[str, object]:
    """The OpenAI error shape: ``{"error": {"message", "type", "code", "param": None}}``."""
    return {"error": {"message": message, "type": err_type, "code": code, "param": None}}


def retry_after_header(retry_after_s: float) -> str:
    """``Retry-After`` for a wait of ``retry_after_s`` seconds: whole seconds, rounded up, at
    least 1 (RFC 9110 §10.2.3 allows only a non-negative integer; 0 would invite a hot loop)."""
    return str(max(1, math.ceil(retry_after_s)))


def _render(err: RouterError) -> bytes:
    return json.dumps(err.body()).encode()


def error_response(err: RouterError) -> Response:
    """The HTTP answer of ``err``: its status, headers and JSON body (an ASGI app)."""
    return Response(
        _render(err), status_code=err.status, headers=err.headers(), media_type="application/json"
    )


async def send_error(scope: Scope, receive: Receive, send: Send, err: RouterError) -> None:
    """Answer a raw ASGI request with ``err`` (before any response byte was sent)."""
    await error_response(err)(scope, receive, send)


def sse_error_event(err: RouterError) -> Message:
    """The last body message of a cut stream: ``data: {"error": {...}}\\n\\n`` (OpenAI's shape)."""
    return {
        "type": "http.response.body",
        "body": b"data: " + _render(err) + b"\n\n",
        "more_body": False,
    }


#: Scheduler error class -> error code; the most specific class in the error's MRO wins.
SCHEDULER_CODES: Mapping[type[SchedulerError], str] = MappingProxyType(
    {
        QueueFullError: "queue_full",
        QueueTimeoutError: "queue_timeout",
        ShuttingDownError: "shutting_down",
        RoleRefusedError: "role_refused",
        RoleUnavailableError: "model_unavailable",
        LoadFailedError: "backend_load_failed",
        LoadBackoffError: "load_backoff",
        UnknownRoleError: "model_not_found",
        SchedulerError: "unavailable",
    }
)


#: Error code -> the option of ``rosterd up`` that sets the limit it hit, named in its message.
LIMIT_OPTIONS: Mapping[str, str] = MappingProxyType(
    {"queue_timeout": "--queue-timeout", "queue_full": "--max-queue"}
)


def scheduler_error(exc: SchedulerError) -> RouterError:
    """The answer to a scheduler refusal: its code from :data:`SCHEDULER_CODES`, its message
    (naming the option of :data:`LIMIT_OPTIONS` that sets the limit, if any), and its
    ``retry_after_s`` when it carries one (else the table's default)."""
    code = next(SCHEDULER_CODES[c] for c in type(exc).__mro__ if c in SCHEDULER_CODES)
    message = str(exc)
    option = LIMIT_OPTIONS.get(code)
    if option is not None and option not in message:
        message += f"; rosterd up's {option} sets the limit"
    return RouterError(code, message, retry_after_s=exc.retry_after_s)


@contextlib.contextmanager
def scheduler_errors() -> Iterator[None]:
    """Raise a ``SchedulerError`` inside the block as its :class:`RouterError`."""
    try:
        yield
    except SchedulerError as exc:
        raise scheduler_error(exc) from exc


def revoked_error(revocation: Revocation) -> RouterError:
    """The answer to a request the scheduler cut (its lease revoked): the revocation's code
    (``evicted``, ``shutting_down``, ``backend_unhealthy``) and message, ``Retry-After`` 1 s."""
    return RouterError(revocation.code, revocation.message, retry_after_s=1.0)


@contextlib.contextmanager
def upstream_errors(role: str, *, mid_stream: bool = False) -> Iterator[None]:
    """Raise an :class:`~rosterd.router.upstream.UpstreamError` (refused, closed unanswered,
    timed out, invalid or cut answer) inside the block as 502 ``backend_error`` naming ``role``.

    ``mid_stream``: the response had started (the caller ends it with
    :func:`sse_error_event`), and the message says so.
    """
    try:
        yield
    except UpstreamError as exc:
        if mid_stream:
            message = f"backend of role {role!r} failed mid-stream: {exc}"
        else:
            message = f"backend of role {role!r} failed: {type(exc).__name__}: {exc}"
        # Every request rosterd cannot carry through is logged with its cause: the
        # client only sees the answer, the operator needs the reason (e.g. EMFILE).
        log.warning("%s (%s)", message, repr(exc.__cause__ or exc.__context__ or exc))
        raise RouterError("backend_error", message) from exc


#: The status a backend answers for an endpoint it does not serve (RFC 9110 §15.6.2).
NOT_IMPLEMENTED = 501

#: What to do when a role's backend does not serve an endpoint, per proxied path's label.
_ENABLE_HINTS: Mapping[str, str] = MappingProxyType(
    {
        "embeddings": (
            "to enable them, add --embeddings to extra_args of the role's model in the fleet "
            "file's models: section (e.g. models: {MODEL: {path: ..., extra_args: "
            "[--embeddings, --pooling, mean]}}; --pooling mean for a GGUF that sets no pooling "
            "type), then run rosterd reload"
        ),
    }
)


def upstream_status_error(
    role: str, status: int, text: str, *, endpoint: str = "requests"
) -> RouterError:
    """The answer when ``role``'s backend answered a 5xx ``status`` with body ``text``.

    501 (llama-server's "This server does not support embeddings", without
    ``--embeddings``) is the request's fault, not the backend's: 400
    ``not_supported`` saying the role's backend does not serve ``endpoint`` (a
    label of ``PROXIED_PATHS``) and how to enable it, so clients do not retry it.
    Any other 5xx is 502 ``backend_error`` quoting at most 500 characters of the
    body; a 501 quotes its OpenAI ``error.message`` when the body has one.
    """
    if status == NOT_IMPLEMENTED:
        hint = _ENABLE_HINTS.get(endpoint, "it cannot answer this endpoint")
        return RouterError(
            "not_supported",
            f"the backend of role {role!r} does not serve {endpoint} (it answered {status}: "
            f"{_backend_message(text)[:500]}); {hint}",
        )
    return RouterError("backend_error", f"backend of role {role!r} answered {status}: {text[:500]}")


def _backend_message(text: str) -> str:
    """``error.message`` of an OpenAI-shaped error body (llama-server's are), else ``text``."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else text
