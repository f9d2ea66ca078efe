"""A dialect's request served through a backend's chat completions (DESIGN.md layer 7).

For a role whose backend does not serve a dialect natively (``RoleRoute.native``, its
adapter's ``dialects_for`` its weights), the proxy hands the request here: the dialect's
:class:`Translation` turns it into a ``POST /v1/chat/completions``, and the answer back,
a plain one whole, a stream event by event as its chunks arrive (each chat chunk makes
its own events at once: nothing is held back). A backend's 4xx comes back with its
status in the dialect's error shape; a 5xx is 502 (``upstream_status_error``), and a
stream that ends without ``data: [DONE]`` ends with the dialect's error event.

The chat answer's last bytes (:data:`~rosterd.router.client_side.ANSWER_TAIL_BYTES`) are
returned to the proxy, which reads the tokens the backend reported from them as it does
for a chat request (usage per key, the charts): the dialect's answer says them in other
words, or not at all.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from starlette.types import Send

from rosterd.errors import RouterError
from rosterd.router.client_side import ANSWER_TAIL_BYTES
from rosterd.router.dialects.envelope import ErrorEnvelope
from rosterd.router.openai_errors import upstream_errors, upstream_status_error
from rosterd.router.upstream import UpstreamResponse
from rosterd.router.validation import refusal_text

#: Where a translated request goes on the backend.
CHAT_PATH = "/v1/chat/completions"

#: ``post(path, body, accept)``: the request to the role's backend (the proxy's, with its
#: one retry on a pooled connection the backend closed).
PostUpstream = Callable[[str, bytes, str], Awaitable[UpstreamResponse]]


class StreamTranslation(Protocol):
    """One answer's stream: chat chunks in, the dialect's SSE-framed events out."""

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        """The events one parsed chat chunk makes (possibly none)."""
        ...

    def finish(self) -> list[bytes]:
        """The closing events, after the chat stream's ``data: [DONE]``."""
        ...


class Translation(Protocol):
    """A dialect over chat completions: request out, answer and stream back."""

    def chat_request(self, payload: Mapping[str, Any], who: str) -> dict[str, Any]:
        """The chat request for ``payload``; raises :class:`RouterError` (4xx, or 501 naming
        ``who``, the role and its flavor) for a request it cannot carry over."""
        ...

    def answer(self, chat: Mapping[str, Any]) -> dict[str, Any]:
        """The dialect's answer for a whole chat completion."""
        ...

    def stream(self) -> StreamTranslation:
        """A fresh stream translation for one answer."""
        ...


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def forward_translated(
    translation: Translation,
    chat_request: Mapping[str, Any],
    *,
    role: str,
    label: str,
    post: PostUpstream,
    send: Send,
    envelope: ErrorEnvelope,
    ctx_size: int | None = None,
) -> bytes:
    """Send ``chat_request`` (already translated and rewritten to the served model) to the
    backend's chat completions and answer ``send`` in the dialect; returns the chat
    answer's last bytes, where its usage is (empty for a refusal, which generated nothing).
    ``ctx_size``: the role's context, tokens, named in the refusal of a prompt longer than it.

    Raises :class:`RouterError` (502 ``backend_error``) while nothing was sent yet; once a
    stream started, a failure ends it with ``envelope``'s error event.
    """
    stream = bool(chat_request.get("stream"))
    accept = "text/event-stream" if stream else "application/json"
    with upstream_errors(role):
        upstream = await post(CHAT_PATH, _encode(chat_request), accept)
    try:
        if upstream.status >= 500:
            with upstream_errors(role):
                text = (await upstream.read()).decode(errors="replace")
            raise upstream_status_error(role, upstream.status, text, endpoint=label)
        if upstream.status >= 400:
            with upstream_errors(role):
                raw = await upstream.read()
            body = envelope.status_body(upstream.status, refusal_text(role, ctx_size, raw))
            await _send_json(send, upstream.status, body)
            return b""
        content_type = upstream.content_type or ""
        if not content_type.startswith("text/event-stream"):
            with upstream_errors(role):
                raw = await upstream.read()
            try:
                chat = json.loads(raw)
            except ValueError:
                raise RouterError(
                    "backend_error", f"backend of role {role!r} answered chat with no JSON"
                ) from None
            await _send_json(send, 200, _encode(translation.answer(chat)))
            return raw[-ANSWER_TAIL_BYTES:]
        return await _relay_stream(
            translation.stream(), upstream, role=role, send=send, envelope=envelope
        )
    finally:
        upstream.close()


async def _relay_stream(
    events: StreamTranslation,
    upstream: UpstreamResponse,
    *,
    role: str,
    send: Send,
    envelope: ErrorEnvelope,
) -> bytes:
    """Relay the chat stream as the dialect's events; returns the chat stream's last bytes
    (as far as it came)."""
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    pending = tail = b""
    try:
        with upstream_errors(role, mid_stream=True):
            async for chunk in upstream.chunks():
                tail = (tail + chunk)[-ANSWER_TAIL_BYTES:]
                pending += chunk
                *lines, pending = pending.split(b"\n")
                out: list[bytes] = []
                for line in lines:
                    data = line.strip()
                    if not data.startswith(b"data:"):
                        continue
                    data = data[5:].strip()
                    if data == b"[DONE]":
                        body = b"".join(out + events.finish())
                        await send({"type": "http.response.body", "body": body, "more_body": False})
                        return tail
                    with contextlib.suppress(ValueError):
                        parsed = json.loads(data)
                        if isinstance(parsed, dict):
                            out += events.feed(parsed)
                if out:
                    body = b"".join(out)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
    except RouterError as err:
        with contextlib.suppress(Exception):
            await send(envelope.sse_event(err))
        return tail
    cut = RouterError(
        "backend_error",
        f"the stream from role {role!r} ended before it finished: "
        "its backend stopped (evicted after the drain time, or it exited)",
    )
    await send(envelope.sse_event(cut))
    return tail
