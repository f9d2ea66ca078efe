"""One proxied request's client side (DESIGN.md layer 7): what was sent to the client
(:class:`ClientAnswer`), the cut of its task when the client leaves or the lease is
revoked (:class:`RequestCut`), and whether a cut request may be sent again
(:func:`may_resend`). Used by :mod:`rosterd.router.proxy`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Send

from rosterd.scheduler.values import Revocation


class ClientAnswer:
    """The client's side of one request: ``send``, remembering what was sent.

    ``status``: the status sent (0: none yet); ``stream``: the answer is an
    event stream; ``sse_open``: an event stream started and has not ended;
    ``done``: the last body message was sent; ``tokens``: what the backend said it
    generated (0: it did not say); ``tail``: the last bytes of the backend's answer (where
    its usage is); ``waited_s``: the request's wait for its role, seconds.
    """

    __slots__ = ("_send", "done", "sse_open", "status", "stream", "tail", "tokens", "waited_s")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 0
        self.stream = False
        self.sse_open = False
        self.done = False
        self.tokens = 0
        self.tail = b""
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
        self.why: str | Revocation | None = None
        self.armed = True

    def _cut(self, why: str | Revocation) -> None:
        if self.armed and self.why is None:
            self.why = why
            self.task.cancel()

    def client_left(self, watcher: asyncio.Task[None]) -> None:
        """The disconnect ``watcher`` ended: cut unless the whole answer was sent."""
        if not watcher.cancelled() and watcher.exception() is None and not self.answer.done:
            self._cut("client_left")

    def revoked(self, revoked: asyncio.Future[Revocation]) -> None:
        """The scheduler revoked the lease (``revoked``'s result says why): cut."""
        if not revoked.cancelled():
            self._cut(revoked.result())


def may_resend(why: str | Revocation, answer: ClientAnswer) -> bool:
    """Whether a request cut for ``why`` may be sent again: its revocation allows it and no
    byte of its answer was sent."""
    return isinstance(why, Revocation) and why.resend and not answer.status
