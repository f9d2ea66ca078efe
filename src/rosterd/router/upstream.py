"""The router's upstream client (DESIGN.md layer 7): HTTP/1.1 towards the backends.

aiohttp's client, chosen by measurement: on this project's bench (a fixed
answer upstream, 32 connections) httpx/httpcore's pool scans every
connection's expiry and readability on every request, so its cost grows with
the connections and rosterd served 365 req/s at 75 ms p50; aiohttp's pool
(per-host stacks of idle connections, an expired one dropped as it is taken)
costs the same for 1 or 64 connections, its parser is llhttp (C), and it
streams a body chunk by chunk as it arrives. In one process on the shared
2-core machine, a request cost about 55 µs with aiohttp against 850 µs with
httpx at 32 in flight. A well-kept library, so no pool of our own.

Two sessions, both without proxy settings from the environment (backends are
local or on the lab's nodes), without cookies, without ``Accept-Encoding``
(bodies are passed through as they come, so they must come uncompressed):

- ``pooled`` keeps an idle connection ``RouterConfig.upstream_keepalive_s``;
- ``fresh`` keeps none: the one retry of :meth:`Upstream.send` goes on a new
  connection, never a pooled one.

Sessions are made on first use, inside the running event loop (aiohttp's
rule), and closed by :meth:`Upstream.close` (the app's lifespan).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import aiohttp

from rosterd.router.routing import RouterConfig

log = logging.getLogger("rosterd.router")

#: Upstream errors raised before any response byte: the backend closed (or reset) the pooled
#: connection without reading the request, so it is sent again on a fresh connection.
#: ``ClientConnectorError`` (nobody listens) is an ``OSError`` too but is not retried.
RETRYABLE_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class Upstream:
    """The HTTP client towards backends: a pooled and a fresh aiohttp session.

    ``config`` gives the timeouts (connect, and read between two chunks,
    seconds) and how long an idle connection is kept.
    """

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def _session(self, *, fresh: bool) -> aiohttp.ClientSession:
        session = self._fresh if fresh else self._pooled
        if session is None or session.closed:
            config = self.config
            connector = (
                aiohttp.TCPConnector(limit=0, force_close=True)
                if fresh
                else aiohttp.TCPConnector(limit=0, keepalive_timeout=config.upstream_keepalive_s)
            )
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=config.upstream_connect_s,
                    sock_read=config.upstream_read_s,
                ),
                auto_decompress=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("Accept-Encoding",),
            )
            if fresh:
                self._fresh = session
            else:
                self._pooled = session
        return session

    async def send(
        self, url: str, body: bytes, headers: Mapping[str, str], role: str
    ) -> aiohttp.ClientResponse:
        """``POST body`` to ``url``; returns once the answer's head is in (body not read).

        Idle connections expire before the backend's keep-alive timeout
        (``RouterConfig.upstream_keepalive_s``), but a backend may still close
        one as the pool hands it out: the request then fails before any
        response byte (``ServerDisconnectedError``, or a reset), so the backend
        never took it and sending it once more, on a new connection, is safe.
        The caller must ``close()`` or ``release()`` the response. Raises
        ``aiohttp.ClientError`` when the retry fails too, or for any other
        failure (refused connection, timeout).
        """
        try:
            return await self._session(fresh=False).post(url, data=body, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except RETRYABLE_ERRORS as exc:
            log.info("backend of %s closed a pooled connection (%s); retrying once", role, exc)
        return await self._session(fresh=True).post(url, data=body, headers=headers)

    async def close(self) -> None:
        """Close both sessions and their connections (they are made again if used after)."""
        for session in (self._pooled, self._fresh):
            if session is not None:
                await session.close()
        self._pooled = self._fresh = None
