"""One proxied request's client side (DESIGN.md layer 7): everything the proxy sends to the
client, and what tells it the client left.

- :class:`ClientAnswer`: the client's ``send``, remembering what was sent (the status,
  whether an event stream is open, whether the answer ended, the tokens generated);
  :meth:`ClientAnswer.end_with` ends an answer with an error in the shape its state
  allows (the error itself while nothing was sent, an SSE error event in a stream, the
  body closed otherwise);
- :class:`RequestCut`: cancels the request's task, once, when the client leaves
  (:func:`wait_disconnect`) or the scheduler revokes its lease;
- :func:`pass_body`: a backend's body passed on chunk by chunk, learning whether the
  stream finished and keeping its tail (where the backend reports its usage);
- :func:`send_whole`: a plain answer in one message, with its ``Content-Length``.

Used by :mod:`rosterd.router.proxy`, which reads top to bottom through these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, Literal

from starlette.types import Message, Receive, Send

from rosterd.errors import RouterError
from rosterd.router.upstream import UpstreamResponse
from rosterd.scheduler.values import Revocation

#: The bytes of an answer's end kept to read the usage the backend reports.
ANSWER_TAIL_BYTES: Final[int] = 2048
#: The bytes of an answer's start kept for the usage said there (an Anthropic stream's
#: prompt tokens, in its ``message_start``).
ANSWER_HEAD_BYTES: Final[int] = 1024

#: Why a request was cut: its client left, or the scheduler revoked its lease (and why).
CutReason = Literal["client_left"] | Revocation

#: The last body message of an answer: it ends the response.
END_OF_BODY: Final[Message] = {"type": "http.response.body", "body": b"", "more_body": False}


class ClientAnswer:
    """The client's side of one request: ``send``, remembering what was sent.

    ``status``: the status sent (0: none yet); ``stream``: the answer is an
    event stream; ``sse_open``: an event stream started and has not ended;
    ``done``: the last body message was sent; ``ended``: the stream's final event
    (``data: [DONE]``, ``message_stop``, ...) was sent, only the body's close is left;
    ``tokens``: what the backend said it generated (0: it did not say); ``tail``: the last
    bytes of the backend's answer (where its usage is) and ``head`` its first bytes (an
    event stream's, where some dialects say the prompt's usage); ``waited_s``: the
    request's wait for its role, seconds.
    """

    __slots__ = (
        "_send",
        "done",
        "ended",
        "head",
        "sse_open",
        "status",
        "stream",
        "tail",
        "tokens",
        "waited_s",
    )

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0
        self.stream = False
        self.sse_open = False
        self.done = False
        self.ended = False
        self.tokens = 0
        self.tail = self.head = b""
        self.waited_s = 0.0

    async def send(self, message: Message) -> None:
        """Send ``message`` (an ASGI response message) to the client, noting what it was."""
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.stream = self.sse_open = any(
                k == b"content-type" and v.startswith(b"text/event-stream")
                for k, v in message.get("headers", ())
            )
        elif not message.get("more_body", False):
            self.sse_open = False
            self.done = True
        await self._send(message)

    def mark_ended(self) -> None:
        """The stream's final event was sent (:attr:`ended`)."""
        self.ended = True

    async def end_with(self, err: RouterError, event: Callable[[RouterError], Message]) -> None:
        """End the answer with ``err``: raise it while nothing was sent (its envelope is
        then the whole answer), else send ``event(err)`` (the path's SSE error event) in a
        stream, or close a plain answer's body.

        Raises:
            RouterError: ``err``, when no status was sent yet.
        """
        if not self.status:
            raise err
        await self.send(event(err) if self.stream else END_OF_BODY)


class RequestCut:
    """Cancels the request's task, once, when the client leaves or the lease is revoked.

    ``why`` is ``None`` until then; then ``"client_left"`` or the
    :class:`Revocation`. Disarmed once the request is over, so a callback
    already scheduled for a later loop turn cannot cancel what runs after. A
    disconnect once the whole answer was sent cuts nothing (uvicorn's
    ``receive`` says ``http.disconnect`` as soon as the response is complete).
    """

    __slots__ = ("answer", "armed", "task", "why")

    def __init__(self, task: asyncio.Task[Any], answer: ClientAnswer) -> None:
        self.task = task
        self.answer = answer
        self.why: CutReason | None = None
        self.armed = True

    def _cut(self, why: CutReason) -> None:
        if self.armed and self.why is None:
            self.why = why
            self.task.cancel()

    def client_left(self, watcher: asyncio.Task[None]) -> None:
        """The disconnect ``watcher`` ended: cut unless the whole answer was sent, or its
        stream's final event (the SDKs close the connection as soon as they read it, which
        is a finished answer, not a client that left)."""
        answer = self.answer
        if watcher.cancelled() or watcher.exception() is not None:
            return
        if not answer.done and not answer.ended:
            self._cut("client_left")

    def revoked(self, revoked: asyncio.Future[Revocation]) -> None:
        """The scheduler revoked the lease (``revoked``'s result says why): cut."""
        if not revoked.cancelled():
            self._cut(revoked.result())


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (its ``http.disconnect``); other messages are read
    and dropped."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def pass_body(
    upstream: UpstreamResponse,
    send: Send,
    ends: tuple[bytes, ...],
    on_end: Callable[[], None] | None = None,
) -> tuple[bool, bytes, bytes]:
    """Send ``upstream``'s body on chunk by chunk as it arrives (response left open);
    returns whether one of ``ends`` (the event that ends a finished stream of the path:
    ``data: [DONE]``, ``message_stop``, ...) was seen, also across two chunks, the body's
    first :data:`ANSWER_HEAD_BYTES` bytes, and its last :data:`ANSWER_TAIL_BYTES` bytes,
    where a finished event stream has the usage the backend reports. ``on_end`` is called
    once the chunk that holds one of ``ends`` was sent."""
    head = tail = b""
    seen = False
    async for chunk in upstream.chunks():
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if len(head) < ANSWER_HEAD_BYTES:
                head = (head + chunk)[:ANSWER_HEAD_BYTES]
            if not seen:
                window = tail[-64:] + chunk
                seen = any(end in window for end in ends)
                if seen and on_end is not None:
                    on_end()  # sent: the client has the stream's final event
            tail = (tail + chunk)[-ANSWER_TAIL_BYTES:]
    return seen, head, tail


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
