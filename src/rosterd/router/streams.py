"""Streams that never end by themselves (DESIGN.md layer 7): the page's event stream and
followed logs, and the one signal that ends them when rosterd stops.

uvicorn's graceful shutdown waits for every open response to finish (up to
``--drain``) before it stops; a followed log or an event stream would hold
rosterd's stop that long. :class:`LiveStreams` is told when serving stops
(``close()``), and every such stream ends at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final

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

    async def ticks(self, interval_s: float) -> AsyncIterator[None]:
        """Yield every ``interval_s`` seconds until :meth:`close`."""
        while not await self.wait_closed(interval_s):
            yield None
