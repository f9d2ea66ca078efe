"""Whose request of a role goes first (DESIGN.md layer 7): a key's ``priority`` is the
latency class its requests queue in, and on one role a ``batch`` request waits behind every
``interactive`` one, whatever the role's own class (:class:`Turns`).

The node's queue is the scheduler's, first come first served; this sits in front of it.
An interactive request asks for its lease at once. A batch request asks only while no
interactive request of the same role is waiting for one; when an interactive request
comes, the batch requests still waiting in the node's queue give up their place
(cancelling a waiter only removes it from the queue: ``NodeScheduler.acquire``) and ask
again once no interactive request waits. So an interactive request is never behind a
batch one, and a batch one keeps its turn among the batch ones (they ask again in the
order they first waited). A request's class is its key's ``priority``, else its role's
latency class: without keys, or with keys that set none, every request of a role has
the role's class and nothing changes. Each try at the node's queue has its own queue
timeout: a batch request may wait longer in all (batch work is there to wait).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rosterd.router.caller import caller
from rosterd.spec import LatencyClass

T = TypeVar("T")


class Turns:
    """Per role: the interactive requests waiting for a lease, and the batch requests'
    tries at the node's queue, to be cancelled when an interactive request comes."""

    def __init__(self) -> None:
        self._interactive: dict[str, int] = {}
        self._clear: dict[str, asyncio.Event] = {}
        # In the order they asked (a dict keeps it): cancelled in that order, they ask
        # again in that order, so batch requests keep their turns among themselves.
        self._batch_tries: dict[str, dict[asyncio.Task[object], None]] = {}

    def class_of(self, role_class: LatencyClass) -> LatencyClass:
        """The class the request being served queues in: its key's priority, else
        ``role_class`` (the role's own)."""
        key = caller()
        return key.priority if key is not None and key.priority is not None else role_class

    async def acquire(
        self,
        role: str,
        klass: LatencyClass,
        ask: Callable[[], Awaitable[T]],
        give_back: Callable[[T], None],
    ) -> T:
        """``await ask()`` (the node's queue) in the turn of ``klass`` on ``role``;
        ``give_back(lease)`` returns a lease granted to a request cut at that moment."""
        if klass is LatencyClass.INTERACTIVE:
            return await self._interactive_turn(role, ask)
        return await self._batch_turn(role, ask, give_back)

    async def _interactive_turn(self, role: str, ask: Callable[[], Awaitable[T]]) -> T:
        self._interactive[role] = self._interactive.get(role, 0) + 1
        self._event(role).clear()
        for attempt in tuple(self._batch_tries.get(role, ())):
            attempt.cancel()  # ahead of it in the node's queue: it asks again later
        try:
            return await ask()
        finally:
            left = self._interactive[role] - 1
            if left:
                self._interactive[role] = left
            else:
                del self._interactive[role]
                self._event(role).set()

    async def _batch_turn(
        self, role: str, ask: Callable[[], Awaitable[T]], give_back: Callable[[T], None]
    ) -> T:
        while True:
            while self._interactive.get(role):
                await self._event(role).wait()
            attempt: asyncio.Task[T] = asyncio.ensure_future(ask())
            tries = self._batch_tries.setdefault(role, {})
            tries[attempt] = None
            try:
                return await attempt
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or not task.cancelling():
                    continue  # an interactive request took the place: ask again after it
                # Our own request was cut: a lease granted at that very moment goes back.
                if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
                    give_back(attempt.result())
                raise
            finally:
                tries.pop(attempt, None)
                if not tries:
                    self._batch_tries.pop(role, None)

    def _event(self, role: str) -> asyncio.Event:
        event = self._clear.get(role)
        if event is None:
            event = self._clear[role] = asyncio.Event()
            event.set()
        return event
