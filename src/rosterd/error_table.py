"""The one table of error answers (layer 1, plain values): what each error code answers.

An error code (OpenAI's ``error.code``) picks one row: the HTTP status, the OpenAI
error ``type``, the default ``Retry-After`` and any fixed header. Every error answer
of the router is a :class:`~rosterd.errors.RouterError` carrying one code of
:data:`ERROR_KINDS`; :mod:`rosterd.router.openai_errors` builds the answers and maps
the errors of the layers below to codes. The table sits below the error tree
because ``RouterError`` carries its row. The shape follows OpenAI's API:
``{"error": {"message", "type", "code", "param": null}}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: OpenAI's error types (``error.type``); clients branch on them to decide whether to retry.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
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
        # A valid key without the path's scope (use, watch, operate).
        "permission_denied": ErrorKind(403, PERMISSION),
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
        # A key over one of its limits (in flight, per minute, per day); the message names it.
        "key_limit": ErrorKind(429, RATE_LIMIT),
        # A dialect's path or field a role's backend lacks and chat completions cannot carry
        # (e.g. /v1/messages/count_tokens on mlx_lm.server): RFC 9110 §15.6.2's status.
        "not_translatable": ErrorKind(501, INVALID_REQUEST),
        "internal_error": ErrorKind(500, SERVER),
        # Something rosterd does not do by design (Ollama's /api/pull: models come from
        # the roster); the message says what to do instead.
        "not_implemented": ErrorKind(501, INVALID_REQUEST),
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
        # Its node was lost while the answer streamed (unstarted ones are sent again).
        "node_lost": ErrorKind(503, SERVER, retry_after_s=1.0),
        "role_refused": ErrorKind(503, SERVER),
        # A role the plan could not place (or placed on a node this process does not run):
        # the plan's reason; no Retry-After, since only a change of the files or the
        # fleet (a reload, a node back) serves it, and ``x-should-retry: false``, which the
        # openai and anthropic SDKs obey instead of retrying a 503 at once.
        "model_unplaced": ErrorKind(503, SERVER, headers=(("x-should-retry", "false"),)),
        "model_unavailable": ErrorKind(503, SERVER),
        "unavailable": ErrorKind(503, SERVER),
    }
)


def error_body(message: str, err_type: str, code: str) -> dict[str, object]:
    """The OpenAI error shape: ``{"error": {"message", "type", "code", "param": None}}``."""
    return {"error": {"message": message, "type": err_type, "code": code, "param": None}}


def retry_after_header(retry_after_s: float) -> str:
    """``Retry-After`` for a wait of ``retry_after_s`` seconds: whole seconds, rounded up, at
    least 1 (RFC 9110 §10.2.3 allows only a non-negative integer; 0 would invite a hot loop)."""
    return str(max(1, math.ceil(retry_after_s)))
