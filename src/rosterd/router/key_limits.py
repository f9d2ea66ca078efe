"""Each key's limits at the router (DESIGN.md layer 7): requests in flight, requests per
minute and tokens per UTC day (:class:`~rosterd.keys.KeyLimits`), checked as a ``use``
request comes in (:meth:`KeyLimiter.admit`).

Over a limit the request is refused before anything else, 429 ``key_limit`` with the
limit's name in the message and ``Retry-After`` to the second: for requests per minute,
when the oldest of the last minute's requests leaves the window; for tokens per day,
at the next UTC midnight; for requests in flight, 1 s (when one ends cannot be known).
Requests per minute count the requests admitted in the last 60 s (a sliding window);
tokens are what the backends reported (:mod:`rosterd.router.usage_hook` adds them as each
request ends), so a day's last request may take a key past its limit once, and the next
one is refused. The counts live in memory, keyed by key name; the day's tokens start
from the usage database at startup (:meth:`KeyLimiter.start_day`).

Plain state with an injected clock: no I/O, no tasks.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

from rosterd.errors import RouterError
from rosterd.keys import ApiKey

#: Seconds of the requests-per-minute window.
MINUTE_S: Final[float] = 60.0
#: Seconds of a day (tokens per day count per UTC day).
DAY_S: Final[int] = 86400
#: ``Retry-After`` for a key at its requests-in-flight limit, seconds.
IN_FLIGHT_RETRY_S: Final[float] = 1.0


class KeyLimiter:
    """The limits' counts per key name. ``clock()``: seconds since the epoch (UTC days)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._in_flight: dict[str, int] = {}
        self._admitted: dict[str, deque[float]] = {}
        self._day = self._day_of(clock())
        self._tokens: dict[str, int] = {}

    def start_day(self, tokens_by_key: Mapping[str, int]) -> None:
        """Today's tokens per key name so far (from the usage database, at startup)."""
        self._day = self._day_of(self.clock())
        self._tokens = dict(tokens_by_key)

    def admit(self, key: ApiKey) -> None:
        """Count a request of ``key`` in, or refuse it; call :meth:`release` when it ends.

        Raises:
            RouterError: 429 ``key_limit``, naming the limit, with its ``Retry-After``.
        """
        limits = key.limits
        if not limits.any():
            return
        now = self.clock()
        name = key.name
        if limits.tokens_per_day is not None:
            used = self.tokens_today(name, now)
            if used >= limits.tokens_per_day:
                next_day = (self._day_of(now) + 1) * DAY_S
                raise _over(
                    key,
                    "tokens_per_day",
                    f"{used} of {limits.tokens_per_day} tokens used today (UTC)",
                    next_day - now,
                )
        if limits.in_flight is not None and self._in_flight.get(name, 0) >= limits.in_flight:
            raise _over(
                key, "in_flight", f"{limits.in_flight} requests in flight", IN_FLIGHT_RETRY_S
            )
        if limits.requests_per_minute is not None:
            window = self._admitted.setdefault(name, deque())
            while window and window[0] <= now - MINUTE_S:
                window.popleft()
            if len(window) >= limits.requests_per_minute:
                raise _over(
                    key,
                    "requests_per_minute",
                    f"{limits.requests_per_minute} requests in the last minute",
                    window[0] + MINUTE_S - now,
                )
            window.append(now)
        self._in_flight[name] = self._in_flight.get(name, 0) + 1

    def release(self, key: ApiKey) -> None:
        """A request :meth:`admit` let in has ended."""
        if not key.limits.any():
            return
        left = self._in_flight.get(key.name, 0) - 1
        if left > 0:
            self._in_flight[key.name] = left
        else:
            self._in_flight.pop(key.name, None)

    def used(self, name: str, tokens: int) -> None:
        """The key named ``name`` used ``tokens`` (as its backend reported them) just now."""
        self.tokens_today(name, self.clock())
        self._tokens[name] = self._tokens.get(name, 0) + tokens

    def tokens_today(self, name: str, now: float) -> int:
        """The tokens the key named ``name`` used in the UTC day of ``now``."""
        day = self._day_of(now)
        if day != self._day:
            self._day, self._tokens = day, {}
        return self._tokens.get(name, 0)

    @staticmethod
    def _day_of(now: float) -> int:
        return int(now // DAY_S)


def _over(key: ApiKey, limit: str, what: str, retry_after_s: float) -> RouterError:
    wait_s = max(1, math.ceil(retry_after_s))
    return RouterError(
        "key_limit",
        f"key {key.name!r} is over its {limit} limit ({what}); retry after {wait_s} s",
        retry_after_s=wait_s,
    )
