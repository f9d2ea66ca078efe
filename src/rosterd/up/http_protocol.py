"""The HTTP/1.1 protocol ``rosterd up`` serves with (layer 8): uvicorn's httptools protocol with
deadlines for clients that send too slowly.

uvicorn bounds only the wait between two requests of a kept-alive connection
(``timeout_keep_alive``). A connection that never sends a request, a client that
sends its headers one byte at a time (slowloris) and a body that stops
half-way were held for ever: measured, 5,000 idle connections stayed open, and
a request whose body stopped held its handler (and its queue slot) until the
client left. Here each request's headers must be complete within
``HEADER_TIMEOUT_S`` of the connection (or of the request's first byte), and
a body must keep arriving: no ``BODY_IDLE_TIMEOUT_S`` without a byte. A
connection closed for either reason is logged with its cause; the handler of a
cut body sees the client as gone.

Subclassing uvicorn's protocol (``uvicorn.Config(http=...)`` takes a class) keeps
uvicorn's parser, flow control and pipelining; only the timers are ours.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("rosterd.http")

#: Seconds a connection may take to send a request's complete headers (from the
#: connection, or from the request's first byte on a kept-alive one).
HEADER_TIMEOUT_S = 10.0

#: Seconds a request's body may go without a byte before the connection is closed.
BODY_IDLE_TIMEOUT_S = 30.0


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a body idle timeout."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_idle_timeout_s = BODY_IDLE_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection: its first request's headers must come within the deadline."""
        super().connection_made(transport)
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop both timers, then uvicorn's handling."""
        self._cancel_timers()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        """A request's first byte (on a kept-alive connection, after the keep-alive wait)."""
        super().on_message_begin()
        if self._header_timer is None:
            self._arm_header_deadline()

    def on_headers_complete(self) -> None:
        """Headers in: the header deadline ends, the body's idle timer starts."""
        self._cancel_header_timer()
        super().on_headers_complete()
        self._arm_body_timer()

    def on_body(self, body: bytes) -> None:
        """A piece of the body: the idle timer starts again."""
        super().on_body(body)
        self._arm_body_timer()

    def on_message_complete(self) -> None:
        """The whole request is in: no more deadlines until the next one."""
        self._cancel_timers()
        super().on_message_complete()

    def _arm_header_deadline(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(
            self.header_timeout_s,
            self._close_slow,
            f"request headers not complete within {self.header_timeout_s:g} s",
        )

    def _arm_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
        self._body_timer = self.loop.call_later(
            self.body_idle_timeout_s,
            self._close_slow,
            f"request body stalled: no byte for {self.body_idle_timeout_s:g} s",
        )

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_header_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _close_slow(self, cause: str) -> None:
        self._header_timer = self._body_timer = None
        if self.transport.is_closing():
            return
        client = "%s:%d" % self.client if self.client else "a client"  # noqa: UP031
        log.info("closed the connection of %s: %s", client, cause)
        self.transport.close()


def bounded_http_protocol(header_timeout_s: float) -> type[BoundedHttpProtocol]:
    """:class:`BoundedHttpProtocol` whose headers deadline is ``header_timeout_s`` seconds
    (``rosterd up`` gives ``HEADER_TIMEOUT_S``, or ``--request-read-timeout`` when that is
    shorter; pass it as ``uvicorn.Config(http=...)``)."""
    return type(
        "RosterdHttpProtocol", (BoundedHttpProtocol,), {"header_timeout_s": header_timeout_s}
    )
