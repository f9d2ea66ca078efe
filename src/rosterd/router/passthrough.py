"""A backend's body passed through to the client chunk by chunk (DESIGN.md layer 7), for
:mod:`~rosterd.router.proxy`: what it sends and what it learns of the stream's end; a
plain answer sent whole; the watch for a client that leaves."""

from __future__ import annotations

from starlette.types import Receive, Send

from rosterd.router.upstream import UpstreamResponse

#: The bytes of an answer's end kept to read the usage the backend reports (the proxy's).
ANSWER_TAIL_BYTES = 2048


async def pass_body(
    upstream: UpstreamResponse, send: Send, ends: tuple[bytes, ...]
) -> tuple[bool, bytes]:
    """Send ``upstream``'s body on chunk by chunk as it arrives (response left open);
    returns whether one of ``ends`` (the event that ends a finished stream of the path:
    ``data: [DONE]``, ``message_stop``, ...) was seen, also across two chunks, and the
    body's last :data:`ANSWER_TAIL_BYTES` bytes, where a finished event stream has the
    usage the backend reports."""
    tail = b""
    seen = False
    async for chunk in upstream.chunks():
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not seen:
                window = tail[-64:] + chunk
                seen = any(end in window for end in ends)
            tail = (tail + chunk)[-ANSWER_TAIL_BYTES:]
    return seen, tail


async def send_whole(
    send: Send, status: int, content_type: str, body: bytes, told: list[tuple[bytes, bytes]]
) -> None:
    """Send a plain answer in one message: ``body`` with its ``Content-Length``, after the
    ``told`` headers (rosterd's own, e.g. the queue wait)."""
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *told,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (its ``http.disconnect``); other messages are read
    and dropped."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
