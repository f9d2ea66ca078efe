"""The router's error answers (DESIGN.md layer 7): one error class, one table, one envelope.

Every error answer of the router is a :class:`~rosterd.errors.RouterError`; its
``code`` picks one row of :data:`rosterd.error_table.ERROR_KINDS`, which gives the
HTTP status, the OpenAI error ``type``, the default ``Retry-After`` and any fixed
header (the table and the body's shape sit in layer 1, beside the error tree,
because the error carries its row). This module is the only place that builds the
HTTP answer and the SSE error event that ends a cut stream, and the only place
where the errors of the layers below are mapped to ours, each in one context
manager at the boundary (as httpx maps httpcore's errors in
``map_httpcore_exceptions``)::

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
from collections.abc import Iterator, Mapping
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
    RouterError,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
    UpstreamError,
)
from rosterd.router.config_faults import config_fault
from rosterd.scheduler.values import Revocation

log = logging.getLogger("rosterd.router")


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
    """Raise an :class:`~rosterd.errors.UpstreamError` (refused, closed unanswered,
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
        "rerank": (
            "to enable it, set reranking: true on the role's entry of the fleet file's "
            "models: section (the GGUF must be a reranker), then run rosterd reload"
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
    A refusal caused by the role's configuration (:mod:`~rosterd.router.config_faults`:
    tools to a llama-server without ``--jinja``) is 400 ``not_supported`` too, naming
    the role and the fix. Any other 5xx is 502 ``backend_error`` quoting at most 500
    characters of the body; a 501 quotes its OpenAI ``error.message`` when the body has one.
    """
    if status == NOT_IMPLEMENTED:
        hint = _ENABLE_HINTS.get(endpoint, "it cannot answer this endpoint")
        return RouterError(
            "not_supported",
            f"the backend of role {role!r} does not serve {endpoint} (it answered {status}: "
            f"{_backend_message(text)[:500]}); {hint}",
        )
    fix = config_fault(role, _backend_message(text))
    if fix is not None:
        return RouterError(
            "not_supported",
            f"{fix} (its backend answered {status}: {_backend_message(text)[:500]})",
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
