"""Streams that never end by themselves (DESIGN.md layer 7): the page's event stream and
followed logs, and the one signal that ends them when rosterd stops.

uvicorn's graceful shutdown waits for every open response to finish (up to
``--drain``) before it stops; a followed log or an event stream would hold
rosterd's stop that long. :class:`LiveStreams` is told when serving stops
(``close()``), and every such stream ends at once.
"""

from __future__ import annotations

import asyncio
from typing import Final, TypeVar

T = TypeVar("T")

#: Seconds between keep-alive comments on an otherwise quiet stream (proxies drop idle ones).
HEARTBEAT_S: Final[float] = 15.0


class LiveStreams:
    """The open-ended responses of one router: ends them all with :meth:`close`.

    Create it inside the event loop that serves (or before, and use it there).
    """

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """Whether serving stopped (no new stream starts; open ones end)."""
        return self._closed.is_set()

    def close(self) -> None:
        """End every open stream now (safe to call more than once, from the loop's thread)."""
        self._closed.set()

    async def wait_closed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for :meth:`close`; whether it came."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._closed.wait()
        except TimeoutError:
            return False
        return True

    async def next_item(self, queue: asyncio.Queue[T], timeout_s: float) -> T | None:
        """The next item of ``queue``, or ``None`` once ``timeout_s`` seconds passed or
        :meth:`close` came first (no item is lost: one not taken stays queued)."""
        getting = asyncio.ensure_future(queue.get())
        closing = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait(
                {getting, closing}, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            closing.cancel()
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            return getting.result()
        return None
