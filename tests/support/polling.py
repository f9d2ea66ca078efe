"""Waiting for something another process or task does: :func:`eventually` polls a check
until it returns something truthy and returns that value, or fails naming what it waited
for. :func:`eventually_sync` is its twin for tests that are plain functions (they drive
``rosterd up`` as a subprocess and have no event loop). No tests here.

A check is read once more after the deadline is crossed, so a slow check that turns true
during its last interval still counts."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _timed_out(what: str, timeout_s: float, context: Callable[[], str] | None) -> AssertionError:
    message = f"not within {timeout_s:g} s: {what}"
    if context is not None:
        message += f"\n{context()}"
    return AssertionError(message)


@overload
async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    what: str,
    timeout_s: float,
    interval_s: float = ...,
    context: Callable[[], str] | None = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T],
    *,
    what: str,
    timeout_s: float,
    interval_s: float = ...,
    context: Callable[[], str] | None = ...,
) -> T: ...


async def eventually(
    check: Callable[[], Any],
    *,
    what: str,
    timeout_s: float,
    interval_s: float = 0.1,
    context: Callable[[], str] | None = None,
) -> Any:
    """``check()`` (awaited when it returns an awaitable) every ``interval_s`` until it is
    truthy: that value. After ``timeout_s``, an ``AssertionError`` naming ``what``, followed
    by ``context()`` when given (say, the ``/status`` the test was reading)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, context)
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], T],
    *,
    what: str,
    timeout_s: float,
    interval_s: float = 0.1,
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`eventually` for a plain test function: ``check()`` every ``interval_s`` until
    it is truthy (that value), or an ``AssertionError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, context)
        time.sleep(interval_s)
