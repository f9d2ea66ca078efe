"""The router's upstream client (DESIGN.md layer 7): HTTP/1.1 to the backends, kept alive.

A small client of our own on httptools (llhttp, the C parser uvicorn uses,
already a dependency), chosen by measurement on this project's bench (a fixed
answer upstream, the shared 2-core machine) against the two libraries:

- httpx/httpcore: its pool scans every connection's expiry and readability on
  every request, so its cost grows with the connections: 365 req/s and 75 ms
  p50 through rosterd at 32 connections, about 850 µs a request in the pool;
- aiohttp's client: flat in the connections but 90 to 180 µs of Python per
  request (request and response objects, timers, payload writers, tracing
  hooks): rosterd reached about 3,000 req/s at 32 connections with p50 7 to
  10 ms, short of the 5 ms the router must stay under;
- this client: 20 to 35 µs a request in the same loop, which is what the
  router needs from it: one request line and head built in one ``bytes``, one
  write, one parser per connection, the body handed on chunk by chunk.

What it does and no more: ``POST`` a body to a backend (``http://`` only) and
stream the answer; keep idle connections per backend (newest reused first,
each kept ``keepalive_s``, at most ``IDLE_PER_BACKEND``), so taking and giving
back a connection is O(1) whatever their number; connect and read timeouts
(read: between two chunks); a backend that closes a connection or resets it
before any answer byte raises :class:`UpstreamClosedError` (the proxy sends the
request once more on a new connection); reading pauses while more than
``PAUSE_READING_BYTES`` wait for a slow client. Its failures are
:class:`UpstreamError`s, mapped to the OpenAI error in ``openai_errors``.
"""

from __future__ import annotations

import asyncio
import collections
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Final, cast

import httptools

from rosterd.errors import (
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)

#: The most idle connections kept per backend; one more is closed when given back.
IDLE_PER_BACKEND: Final[int] = 64
#: Answer bytes waiting for the client above which the backend connection stops reading.
PAUSE_READING_BYTES: Final[int] = 256 * 1024


class _Connection(asyncio.Protocol):
    """One connection to a backend, one request at a time; parses answers as they come."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[bool] | None = None  # result: timed out
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered_bytes = 0
        self.paused = False
        self.lost = False
        self.error: UpstreamError | None = None
        self.idle_since = 0.0
        self.idle_in: dict[_Connection, None] | None = None  # the pool holding it, while idle
        self._reset()

    def _reset(self) -> None:
        self.status = 0  # 0 until the head is in
        self.content_type = b""
        self.content_length: int | None = None
        self.chunked = False
        self.got_bytes = False
        self.complete = False
        self.keep_alive = False

    # asyncio.Protocol and httptools callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamProtocolError(f"invalid HTTP answer: {exc}"))
            if self.transport is not None:
                self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.idle_in is not None:  # closed while idle (the backend's keep-alive timeout)
            self.idle_in.pop(self, None)
            self.idle_in = None
        if self.status and not self.chunked and self.content_length is None:
            self.complete = True  # a body delimited by the connection's end
        elif not self.got_bytes:
            why = f": {exc}" if exc else ""
            self._fail(UpstreamClosedError(f"the backend closed the connection unanswered{why}"))
        elif not self.complete:
            self._fail(UpstreamProtocolError("the backend closed the connection mid-answer"))
        self._wake()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name == b"content-length":
            self.content_length = int(value)
        elif name == b"transfer-encoding":
            self.chunked = b"chunked" in value.lower()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered_bytes += len(body)
        if self.buffered_bytes > PAUSE_READING_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        # Asked here: once the callback returns, llhttp is reset for the next answer.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # the request's side
    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(False)

    async def wait(self, read_s: float) -> None:
        """Wait for the next event (head, chunk, end, failure) at most ``read_s`` seconds."""
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        timer = loop.call_later(read_s, _time_out, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self.waiter = None
        if waiter.result():
            raise UpstreamTimeoutError(f"the backend sent nothing for {read_s:g} s")

    def take_chunk(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered_bytes -= len(chunk)
        if self.paused and self.buffered_bytes <= PAUSE_READING_BYTES // 2:
            self.paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return (
            self.complete
            and not self.chunks
            and not self.lost
            and self.error is None
            and self.keep_alive
            and self.transport is not None
            and not self.transport.is_closing()
        )


def _time_out(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(True)


class UpstreamResponse:
    """A backend's answer, head read, body streaming.

    ``status``; ``content_type`` (``""`` when not given); ``content_length``
    (bytes, ``None`` when not given). Read the body with :meth:`chunks` or
    :meth:`read`; :meth:`close` it in every case: a connection whose answer
    was read to its end goes back to the pool, any other is closed (so a
    backend generating for a client that left stops).
    """

    def __init__(self, pool: Upstream, conn: _Connection) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = conn.status
        self.content_type = conn.content_type.decode("latin-1")
        self.content_length = conn.content_length

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk as it arrives (transfer coding removed).

        Raises :class:`UpstreamTimeoutError`, or :class:`UpstreamProtocolError`
        when the backend cuts the body.
        """
        conn = self._conn
        assert conn is not None, "the response is closed"
        while True:
            if conn.chunks:
                yield conn.take_chunk()
            elif conn.complete:
                return
            elif conn.error is not None:
                raise conn.error
            else:
                await conn.wait(self._pool.read_s)

    async def read(self) -> bytes:
        """The whole body; raises as :meth:`chunks`."""
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Give the connection back (answer read to its end) or close it (any other case)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.give_back(conn)


class Upstream:
    """Keep-alive HTTP/1.1 connections to backends, and the requests sent on them.

    ``connect_s``: connect timeout, seconds; ``read_s``: longest silence of a
    backend while answering, seconds; ``keepalive_s``: how long an idle
    connection is kept for reuse, seconds.
    """

    def __init__(self, *, connect_s: float, read_s: float, keepalive_s: float) -> None:
        self.connect_s = connect_s
        self.read_s = read_s
        self.keepalive_s = keepalive_s
        # backend (host, port) -> its idle connections (a dict keeps order: popitem() takes
        # the newest, a lost connection leaves with pop(), both O(1)).
        self._idle: dict[tuple[str, int], dict[_Connection, None]] = {}
        self._targets: dict[str, tuple[tuple[str, int], bytes]] = {}

    def _target(self, base_url: str) -> tuple[tuple[str, int], bytes]:
        """``base_url`` -> ((host, port), Host header); raises :class:`UpstreamConnectError`."""
        target = self._targets.get(base_url)
        if target is None:
            parts = urllib.parse.urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise UpstreamConnectError(f"cannot reach {base_url!r}: only http:// is spoken")
            port = parts.port or 80
            target = ((parts.hostname, port), parts.netloc.encode("idna"))
            self._targets[base_url] = target
        return target

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(lambda: _Connection(key), *key)
        except TimeoutError:
            raise UpstreamConnectError(
                f"cannot connect to {key[0]}:{key[1]} within {self.connect_s:g} s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        return conn

    def _pooled(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn, _ = idle.popitem()
            conn.idle_in = None
            if conn.lost or now - conn.idle_since > self.keepalive_s:
                if conn.transport is not None:
                    conn.transport.close()
                continue
            return conn
        return None

    def give_back(self, conn: _Connection) -> None:
        """Pool ``conn`` if its answer was read to the end and it stays open, else close it."""
        idle = self._idle.setdefault(conn.key, {})
        if conn.reusable() and len(idle) < IDLE_PER_BACKEND:
            conn._reset()
            conn.idle_since = time.monotonic()
            conn.idle_in = idle
            idle[conn] = None
        elif conn.transport is not None:
            conn.transport.abort()

    async def post(
        self, base_url: str, path: str, body: bytes, accept: str, *, fresh: bool = False
    ) -> UpstreamResponse:
        """``POST`` JSON ``body`` to ``base_url + path``; returns once the answer's head is in.

        ``fresh``: on a new connection, never a pooled one. The caller must
        :meth:`UpstreamResponse.close` the answer. Raises
        :class:`UpstreamConnectError`, :class:`UpstreamClosedError` (closed or
        reset before any answer byte: the backend never took the request),
        :class:`UpstreamTimeoutError`, :class:`UpstreamProtocolError`.
        """
        key, host = self._target(base_url)
        conn = None if fresh else self._pooled(key)
        if conn is None:
            conn = await self._connect(key)
        assert conn.transport is not None
        head = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: %s\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), host, accept.encode(), len(body))
        )
        try:
            conn.transport.write(head + body)
            while not conn.status:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(self.read_s)
        except BaseException:
            conn.transport.abort()
            raise
        return UpstreamResponse(self, conn)

    async def close(self) -> None:
        """Close every idle connection (answers still streaming close their own)."""
        for idle in self._idle.values():
            for conn in list(idle):
                conn.idle_in = None
                if conn.transport is not None:
                    conn.transport.close()
            idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
