"""Error envelopes per path (DESIGN.md layer 7): the same :class:`RouterError`, in the shape
the path's clients read.

OpenAI's paths answer ``{"error": {"message", "type", "code", "param"}}``
(``rosterd.router.openai_errors``); Anthropic's (``/v1/messages``) answer
``{"type": "error", "error": {"type", "message"}}`` with Anthropic's error types
(https://docs.anthropic.com/en/api/errors), and a stream cut after it started ends with
``event: error``. The status codes stay the error table's: Anthropic's SDK retries 408,
409, 429 and every 5xx, as the openai SDK does, so a queue full (429) or a load that timed
out (503) is retried and a bad request (400) is not.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from types import MappingProxyType

from starlette.responses import Response
from starlette.types import Message

from rosterd.errors import RouterError
from rosterd.router.openai_errors import error_response, sse_error_event

#: The paths whose clients read Anthropic's error shape.
ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})

#: Path -> what a finished event stream of it holds near its end (default: OpenAI's
#: ``data: [DONE]``): a stream passed through without one was cut (its backend stopped).
#: Each is looked for in every chunk and across two (the last 64 bytes of the one before).
STREAM_ENDS: Mapping[str, tuple[bytes, ...]] = MappingProxyType(
    {
        "/v1/messages": (b"event: message_stop",),
        "/v1/responses": (
            b"event: response.completed",
            b"event: response.incomplete",
            b"event: response.failed",
        ),
    }
)

#: HTTP status -> Anthropic's ``error.type`` (their API's error table).
ANTHROPIC_ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        408: "timeout_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        502: "api_error",
        503: "overloaded_error",
        504: "timeout_error",
    }
)


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for ``status``: the table's, else ``invalid_request_error`` for
    a 4xx and ``api_error`` for a 5xx."""
    return ANTHROPIC_ERROR_TYPES.get(
        status, "invalid_request_error" if status < 500 else "api_error"
    )


def anthropic_error_body(status: int, message: str) -> bytes:
    """``{"type": "error", "error": {"type", "message"}}`` as JSON bytes."""
    body = {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
    return json.dumps(body, ensure_ascii=False).encode()


def backend_error_text(raw: bytes) -> str:
    """The message of a backend's error body (``{"error": {"message": ...}}``, as
    llama-server and OpenAI write it, or Ollama's ``{"error": "..."}``), else its text; cut
    at 500 characters."""
    text = raw.decode(errors="replace")
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:500]
        if isinstance(error, str):
            return error[:500]
    return text[:500]


class ErrorEnvelope:
    """OpenAI's error shape: :meth:`response` (an ASGI app) and :meth:`sse_event` (the last
    body message of a cut stream). :class:`AnthropicEnvelope` overrides both."""

    def response(self, err: RouterError) -> Response:
        """The HTTP answer of ``err``: its status, headers and body."""
        return error_response(err)

    def sse_event(self, err: RouterError) -> Message:
        """The body message (``more_body`` false) that ends a stream cut by ``err``."""
        return sse_error_event(err)

    def status_body(self, status: int, message: str) -> bytes:
        """The body of an error answer of ``status`` relayed from a backend (``message``: its
        text), in this shape."""
        return json.dumps(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
        ).encode()


class AnthropicEnvelope(ErrorEnvelope):
    """Anthropic's error shape (``{"type": "error", "error": {"type", "message"}}``)."""

    def response(self, err: RouterError) -> Response:
        """``err``'s status and headers (``Retry-After`` included), Anthropic's body."""
        return Response(
            anthropic_error_body(err.status, err.message),
            status_code=err.status,
            headers=err.headers(),
            media_type="application/json",
        )

    def sse_event(self, err: RouterError) -> Message:
        """``event: error`` with Anthropic's body, as its streams end on an error."""
        data = anthropic_error_body(err.status, err.message)
        return {
            "type": "http.response.body",
            "body": b"event: error\ndata: " + data + b"\n\n",
            "more_body": False,
        }

    def status_body(self, status: int, message: str) -> bytes:
        """Anthropic's body for ``status``."""
        return anthropic_error_body(status, message)


OPENAI_ENVELOPE = ErrorEnvelope()
ANTHROPIC_ENVELOPE = AnthropicEnvelope()


def envelope_for(path: str) -> ErrorEnvelope:
    """The error shape the clients of ``path`` read (Anthropic's on its paths, else OpenAI's)."""
    return ANTHROPIC_ENVELOPE if path in ANTHROPIC_PATHS else OPENAI_ENVELOPE
