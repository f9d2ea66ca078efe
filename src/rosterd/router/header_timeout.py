"""A read timeout for request headers (DESIGN.md layer 7): uvicorn's HTTP protocol, with a
connection closed when a request's headers do not arrive in time.

uvicorn times out an idle keep-alive connection but not a client that sends
half a request line or its headers a byte at a time (slowloris): such a
connection stayed open for ever. :func:`header_timeout_protocol` gives
uvicorn's httptools protocol (the one ``http="auto"`` picks when httptools is
installed, a dependency of rosterd) with a timer from the connection's start,
and from the first byte of each next request, to the end of its headers; when
it fires the connection is closed. The body has its own timeout
(:func:`rosterd.router.body.read_body`). Subclassing uvicorn's protocol keeps
its parser and flow control; only the two callbacks are wrapped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_timeout_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol closing a connection whose request headers take longer
    than ``timeout_s`` seconds (pass it as ``uvicorn.Config(http=...)``)."""

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return HeaderTimeoutProtocol
