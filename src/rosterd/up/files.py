"""The configuration files of one ``rosterd up`` (layer 8): which they are, what ``/status``
says of the last reload, and ``--watch``.

A reload (``POST /rosterd/reload``, ``rosterd reload``, SIGHUP, or ``--watch``
noticing a change) reads the files again and posts the change to the fleet
scheduler, which applies it only if it is valid (``rosterd.fleet_scheduler``); what
came of it is kept here for ``/status`` (:meth:`ConfigFiles.status`).

``--watch`` polls the files every :data:`WATCH_INTERVAL_S` seconds (their size, mtime
and inode, then their bytes): three small files need no watcher library, and polling
by path keeps working when an editor replaces a file by renaming a new one over it,
which an inotify watch on the old file misses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from rosterd.errors import InputError, RosterdError
from rosterd.roster import ImportedRoster
from rosterd.up.options import UpOptions

#: How often ``--watch`` looks at the roster, overlay and fleet files, seconds.
WATCH_INTERVAL_S = 1.0


def error_json(
    exc: RosterdError, at: float, *, file: str | None = None, line: int | None = None
) -> dict[str, object]:
    """A refused reload as ``/status`` shows it: ``{"message", "file", "line", "column",
    "at"}``: where an ``InputError`` names, else ``file`` and ``line`` as given (the
    roster's place a refusal points at, :func:`roster_place`), else ``None``; ``at``:
    seconds since the epoch."""
    where = exc if isinstance(exc, InputError) else None
    return {
        "message": str(exc),
        "file": where.file if where else file,
        "line": where.line if where else line,
        "column": where.column if where else None,
        "at": at,
    }


def roster_place(roster_file: str, warnings: Iterable[str]) -> tuple[str, int | None]:
    """Where a configuration that imports no role went wrong: ``roster_file`` and the line
    of its first warning that names one (``FILE:LINE: ...``, as the import's warnings are
    led), else ``None`` for the line."""
    lead = f"{roster_file}:"
    for warning in warnings:
        number = warning.removeprefix(lead).partition(":")[0]
        if warning.startswith(lead) and number.isdigit():
            return roster_file, int(number)
    return roster_file, None


def _marks(paths: Iterable[Path]) -> tuple[object, ...]:
    """Size, mtime and inode of each of ``paths`` (``None`` for one that cannot be read)."""
    marks: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            marks.append(None)
            continue
        marks.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(marks)


def _digest(paths: Iterable[Path]) -> str:
    """A hash of the bytes of ``paths`` (a file that cannot be read counts as empty)."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"\0unreadable")
        h.update(b"\0")
    return h.hexdigest()


class ConfigFiles:
    """The roster, overlay and fleet files of ``options``, and what came of their reloads."""

    def __init__(self, options: UpOptions) -> None:
        self.options = options
        self.last_reload_at: float | None = None
        self.last_change: Mapping[str, object] | None = None
        self.last_error: dict[str, object] | None = None
        self._seen = _digest(self.paths)

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files a reload reads: the roster, then the overlay, fleet and keys when given."""
        o = self.options
        given = (o.roster_path, o.overlay_path, o.fleet_path, o.keys_path)
        return tuple(p for p in given if p is not None)

    def reading(self) -> None:
        """A reload reads the files now (``--watch`` then waits for their next change)."""
        self._seen = _digest(self.paths)

    def applied(self, change: Mapping[str, object], at: float) -> None:
        """A reload applied ``change`` at ``at`` (seconds since the epoch)."""
        self.last_reload_at, self.last_change, self.last_error = at, change, None

    def refused(self, exc: RosterdError, at: float, roster: ImportedRoster | None = None) -> None:
        """A reload was refused at ``at`` (seconds since the epoch), for ``exc``; where
        ``exc`` names no place and the new ``roster`` imported no role, the roster is why,
        and ``/status`` points at it (:func:`roster_place`)."""
        file, line = None, None
        if roster is not None and not roster.specs:
            file, line = roster_place(str(self.options.roster_path), roster.warnings)
        self.last_error = error_json(exc, at, file=file, line=line)

    def status(self) -> dict[str, object]:
        """``/status``'s ``config``: ``{"files": {"roster", "overlay", "fleet", "keys"} (paths or
        None), "watch", "last_reload_at" (epoch seconds or None), "last_change",
        "last_error" (see :func:`error_json`, None after a reload that worked)}``."""
        o = self.options
        return {
            "files": {
                "roster": str(o.roster_path),
                "overlay": str(o.overlay_path) if o.overlay_path else None,
                "fleet": str(o.fleet_path) if o.fleet_path else None,
                "keys": str(o.keys_path) if o.keys_path else None,
            },
            "watch": o.watch,
            "last_reload_at": self.last_reload_at,
            "last_change": self.last_change,
            "last_error": self.last_error,
        }

    async def watch(
        self,
        reload: Callable[[], Awaitable[object]],
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        """Call ``reload()`` whenever the files' bytes change (looked at every
        ``interval_s``); runs until cancelled. A refused change (``reload`` raised a
        ``RosterdError``, logged and kept by whoever reloaded) is not tried again until
        the files change."""
        marks = _marks(self.paths)
        while True:
            await asyncio.sleep(interval_s)
            now = _marks(self.paths)
            if now == marks:
                continue
            marks = now
            if _digest(self.paths) != self._seen:
                with contextlib.suppress(RosterdError):
                    await reload()
