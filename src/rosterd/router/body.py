"""The request body of a proxied call (DESIGN.md layer 7): read within a limit, strict JSON,
the ``model`` field.

The standard library's ``json`` parses it, with hooks that refuse what Python
accepts but RFC 8259 does not; a body that could not be forwarded as valid
JSON is refused here with 400 rather than failing upstream.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.types import Receive, Scope

from rosterd.errors import ClientGoneError, RouterError


async def read_body(
    scope: Scope, receive: Receive, limit_bytes: int, *, timeout_s: float | None = None
) -> bytes:
    """The request body, refusing more than ``limit_bytes`` before reading it all.

    Raises :class:`RouterError` 413 ``body_too_large`` (from ``Content-Length``
    when it is declared, else as the chunks come), 400 ``bad_request`` for a
    ``Content-Length`` that is not a number, 408 ``request_timeout`` when the
    whole body did not arrive within ``timeout_s`` seconds (``None``: no limit),
    and :class:`ClientGoneError` when the client disconnects first.
    """
    if timeout_s is None:
        return await _read_body(scope, receive, limit_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(scope, receive, limit_bytes)
    except TimeoutError:
        raise RouterError(
            "request_timeout",
            f"the request body did not arrive within {timeout_s:g} s (--request-read-timeout)",
        ) from None


async def _read_body(scope: Scope, receive: Receive, limit_bytes: int) -> bytes:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise RouterError("bad_request", "invalid Content-Length") from None
            if declared > limit_bytes:
                raise _too_large(limit_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneError("the client disconnected while sending its request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise _too_large(limit_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit_bytes: int) -> RouterError:
    return RouterError(
        "body_too_large",
        f"request body is larger than the limit of {limit_bytes} bytes "
        "(rosterd up's --max-body sets it)",
    )


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, parsed strictly (RFC 8259).

    ``NaN``, ``Infinity`` and ``-Infinity``, numbers that overflow a float,
    invalid UTF-8 or lone surrogates, and nesting deeper than Python's
    recursion limit are refused, because the body could not be forwarded as
    valid JSON. Raises :class:`RouterError` 400 ``invalid_json``.
    """
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
        # What the upstream request will be: UTF-8 without escapes, so a lone
        # surrogate ("\ud800") fails here rather than while forwarding.
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode()
    except RecursionError:
        raise RouterError("invalid_json", "the request body is nested too deeply") from None
    except ValueError as exc:
        raise RouterError("invalid_json", f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RouterError("invalid_json", "the request body must be a JSON object")
    return data


def requested_model(payload: dict[str, Any]) -> str:
    """The body's ``model``; raises :class:`RouterError` 400 ``model_missing`` unless it is a
    non-empty string."""
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise RouterError("model_missing", "the request body needs a 'model' string naming a role")
    return model
