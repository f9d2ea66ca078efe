"""The usage database (DESIGN.md layer 5: the state folder): per hour, key name and role,
the requests, errors, prompt and completion tokens, queue wait and time served.

``<state_dir>/usage.sqlite3`` is SQLite (the standard library's ``sqlite3``) in WAL mode:
one table, one row per (hour, key, role), added to with ``INSERT ... ON CONFLICT DO
UPDATE``. The router counts a finished request into a dict in memory
(:meth:`UsageStore.record`, a few microseconds on the event loop, no I/O); a writer
thread writes what was counted every ``flush_interval_s`` (default 1 s) in one
transaction, so the event loop never waits on the disk and a burst of requests costs
one write. A kill -9 loses at most what was counted since the last write (one
interval); a write committed in WAL mode survives the process (``synchronous=NORMAL``:
only a power cut may lose the last transactions). Reads (:meth:`UsageStore.totals`)
add what is counted but not yet written, so they are exact while rosterd runs.

Only key *names* are stored, never a key.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: The counters of a row, in the database's and the JSON's order.
USAGE_FIELDS: Final[tuple[str, ...]] = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "queue_wait_s",
    "served_s",
)
#: What a usage table may be grouped by.
GROUPINGS: Final[tuple[str, ...]] = ("key", "role")
#: Seconds of one bucket.
BUCKET_S: Final[int] = 3600
#: The file in the state folder.
FILE_NAME: Final[str] = "usage.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    hour INTEGER NOT NULL,
    key TEXT NOT NULL,
    role TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    queue_wait_s REAL NOT NULL DEFAULT 0,
    served_s REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, key, role)
)
"""
# Column names are this module's constants; every value is a bound parameter.
_COLUMNS = ", ".join(USAGE_FIELDS)
_ADDED = ", ".join(f"{f} = {f} + excluded.{f}" for f in USAGE_FIELDS)
_UPSERT = (
    f"INSERT INTO usage (hour, key, role, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "  # noqa: S608
    f"ON CONFLICT (hour, key, role) DO UPDATE SET {_ADDED}"
)
_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """Seconds in a duration such as ``7d``, ``12h``, ``30m``, ``90s`` or ``2w``.

    Raises:
        ValueError: ``text`` is not one.
    """
    found = _SINCE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"{text!r} is not a duration such as 7d, 12h, 30m or 2w")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


@dataclass
class _Counts:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_wait_s: float = 0.0
    served_s: float = 0.0

    def values(self) -> tuple[int, int, int, int, float, float]:
        return (
            self.requests,
            self.errors,
            self.prompt_tokens,
            self.completion_tokens,
            self.queue_wait_s,
            self.served_s,
        )


class UsageStore:
    """The usage database at ``<state_dir>/usage.sqlite3`` (see the module docstring).

    :meth:`open` creates it (and its table) and starts the writer thread; :meth:`close`
    writes what is left and stops it. ``clock()``: seconds since the epoch (the hour a
    request is counted in).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        flush_interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self._pending: dict[tuple[int, str, str], _Counts] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def open(self) -> None:
        """Create the database if needed (WAL mode) and start writing.

        Raises:
            sqlite3.Error, OSError: the file cannot be created or is not a usage database.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(self._connect()) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            db.commit()
        self._stop.clear()
        self._writer = threading.Thread(
            target=self._write_forever, name="rosterd-usage", daemon=True
        )
        self._writer.start()

    def close(self) -> None:
        """Write what is counted and stop the writer (safe to call more than once)."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self.flush()

    def record(
        self,
        key: str,
        role: str,
        *,
        error: bool,
        prompt_tokens: int,
        completion_tokens: int,
        queue_wait_s: float,
        served_s: float,
    ) -> None:
        """Count one finished request of ``key`` (its name) on ``role`` in this hour."""
        hour = int(self.clock()) // BUCKET_S * BUCKET_S
        with self._lock:
            counts = self._pending.get((hour, key, role))
            if counts is None:
                counts = self._pending[(hour, key, role)] = _Counts()
            counts.requests += 1
            counts.errors += int(error)
            counts.prompt_tokens += prompt_tokens
            counts.completion_tokens += completion_tokens
            counts.queue_wait_s += queue_wait_s
            counts.served_s += served_s

    def flush(self) -> None:
        """Write what is counted now, in one transaction (the writer thread's work)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        rows = [(*where, *counts.values()) for where, counts in pending.items()]
        try:
            with contextlib.closing(self._connect()) as db, db:
                db.executemany(_UPSERT, rows)
        except sqlite3.Error:
            with self._lock:  # kept for the next try (a locked or full disk, for a while)
                for where, counts in pending.items():
                    self._merge(where, counts)
            raise

    def totals(self, since_s: float, by: Iterable[str] = GROUPINGS) -> list[dict[str, object]]:
        """The counters summed over the hours from the one holding ``since_s`` (epoch
        seconds) on, grouped by ``by`` (a subset of ``("key", "role")``; empty: one row),
        counted-but-unwritten requests included; sorted by the groups (blocking: call it
        in a thread while serving).

        Each row: the group's fields (``key``, ``role``), then :data:`USAGE_FIELDS`.
        """
        groups = [g for g in GROUPINGS if g in set(by)]
        start = int(since_s) // BUCKET_S * BUCKET_S
        summed: dict[tuple[str, ...], list[float]] = {}

        def add(where: Mapping[str, str], values: Iterable[float]) -> None:
            group = tuple(where[g] for g in groups)
            row = summed.setdefault(group, [0] * len(USAGE_FIELDS))
            for i, value in enumerate(values):
                row[i] += value

        with contextlib.closing(self._connect()) as db:
            query = f"SELECT key, role, {_COLUMNS} FROM usage WHERE hour >= ?"  # noqa: S608
            for key, role, *values in db.execute(query, (start,)):
                add({"key": key, "role": role}, values)
        with self._lock:
            pending = [(w, c.values()) for w, c in self._pending.items() if w[0] >= start]
        for (_hour, key, role), values in pending:
            add({"key": key, "role": role}, values)
        out: list[dict[str, object]] = []
        for group, values in sorted(summed.items()):
            row: dict[str, object] = dict(zip(groups, group, strict=True))
            for name, value in zip(USAGE_FIELDS, values, strict=True):
                row[name] = round(value, 6) if name.endswith("_s") else int(value)
            out.append(row)
        return out

    def _merge(self, where: tuple[int, str, str], counts: _Counts) -> None:
        mine = self._pending.setdefault(where, _Counts())
        for name in USAGE_FIELDS:
            setattr(mine, name, getattr(mine, name) + getattr(counts, name))

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10.0)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _write_forever(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            with contextlib.suppress(sqlite3.Error):  # kept and tried again next time
                self.flush()
