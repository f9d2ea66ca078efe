"""A role's backend log over HTTP (DESIGN.md layer 7): ``GET /rosterd/logs/{role}``.

``?lines=N`` (default :data:`DEFAULT_LINES`, at most :data:`MAX_LINES`) gives the
last N lines, read across the rotated files (``<role>.log.1`` …, see
:mod:`rosterd.supervisor.logs`) as ``text/plain``. ``?follow=1`` sends them,
then whatever the backend writes next, as it is written, until the client
leaves or rosterd stops; a rotation is followed into the new file, as
``tail -F`` does. The bytes are the backend's own (invalid UTF-8 included).

A role with copies on several nodes of this machine has a log per copy
(``<role>@<node>.log``, ``rosterd.backends.copy_names``): ``?node=NAME`` picks one;
without it a tail gives each copy's last lines under a ``==> <role>@<node>.log <==``
line, as ``tail`` does for several files, and a follow asks for ``?node``.

The log is read from its file, not from the pipe the supervisor drains, so it
shows the same bytes a person finds in the state folder. New bytes are looked
for every :data:`FOLLOW_POLL_S` seconds: a file gives no portable "grown"
signal, and a quarter of a second is as live as a person reads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rosterd.errors import RouterError
from rosterd.router.streams import LiveStreams
from rosterd.supervisor.logs import log_files

#: Lines a tail gives when ``?lines`` is not given.
DEFAULT_LINES: Final[int] = 200
#: The most lines one tail gives.
MAX_LINES: Final[int] = 10_000
#: Seconds between two looks for new bytes while following.
FOLLOW_POLL_S: Final[float] = 0.25
#: Bytes read per step, from the end of a file while tailing, or while following.
READ_BLOCK_BYTES: Final[int] = 64 * 1024

#: role -> its log file on this machine (``None``: this process keeps no log for it).
LogPath = Callable[[str], Path | None]
#: role -> node -> the log file of its copy there, for the copies of this machine that run
#: under their copy's name (empty: the role has one log, ``LogPath``'s).
CopyLogs = Callable[[str], Mapping[str, Path]]


def tail_bytes(path: Path, lines: int, *, current_limit: int | None = None) -> bytes:
    """The last ``lines`` lines of ``path`` and its rotated files, oldest first.

    ``current_limit``: read ``path`` itself only up to this byte (what was
    there when a follow started). ``b""`` when no file exists or ``lines`` is 0.
    """
    if lines <= 0:
        return b""
    blocks: list[bytes] = []
    newlines = 0
    for file in reversed(log_files(path)):  # newest first
        try:
            with file.open("rb") as f:
                end = f.seek(0, os.SEEK_END)
                if file == path and current_limit is not None:
                    end = min(end, current_limit)
                pos = end
                while pos > 0 and newlines <= lines:
                    step = min(READ_BLOCK_BYTES, pos)
                    pos -= step
                    f.seek(pos)
                    block = f.read(step)
                    blocks.append(block)
                    newlines += block.count(b"\n")
        except OSError:
            continue
        if newlines > lines:
            break
    # More newlines than asked: the first line read may be cut, and is dropped here.
    return b"".join(b"".join(reversed(blocks)).splitlines(keepends=True)[-lines:])


def _read_from(path: Path, inode: tuple[int, int] | None, pos: int) -> tuple[bytes, int] | None:
    """The bytes of ``path`` from ``pos`` and its size, if ``path`` is the file ``inode``
    (``None``: any file); ``None`` if it is another file or none."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if inode is not None and (st.st_ino, st.st_dev) != inode:
                return None
            if st.st_size < pos:
                pos = 0  # truncated: its new contents from their start
            f.seek(pos)
            data = f.read()
            return data, pos + len(data)
    except OSError:
        return None


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_dev


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


async def follow_log(
    path: Path, lines: int, streams: LiveStreams, *, poll_s: float = FOLLOW_POLL_S
) -> AsyncIterator[bytes]:
    """The last ``lines`` lines of the log at ``path``, then each new piece as it is written.

    Ends when ``streams`` closes (a client that leaves is noticed by the server,
    which cancels this). A rotated file (renamed to ``<path>.1``, as the
    supervisor rotates) is read to its end, then the new ``path`` from its
    start; a truncated one from its start again. No file is held open between
    two looks, so a cancelled follow leaves nothing open.
    """
    inode = _inode(path)
    pos = _size(path) if inode is not None else 0
    head = await asyncio.to_thread(tail_bytes, path, lines, current_limit=pos)
    if head:
        yield head
    rotated = path.with_name(path.name + ".1")
    while not streams.closed:
        now = _inode(path)
        if inode is not None and now != inode:  # rotated: the old file's last bytes first
            rest = _read_from(rotated, inode, pos)
            if rest is not None and rest[0]:
                yield rest[0]
            inode, pos = now, 0
        elif inode is None:
            inode, pos = now, 0
        if inode is not None:
            got = _read_from(path, inode, pos)
            if got is not None:
                data, pos = got
                if data:
                    yield data
                    continue  # more may be there already: look again before waiting
        await streams.wait_closed(poll_s)


def _lines_param(request: Request) -> int:
    raw = request.query_params.get("lines")
    if raw is None:
        return DEFAULT_LINES
    try:
        lines = int(raw)
    except ValueError:
        lines = -1
    if not 0 <= lines <= MAX_LINES:
        raise RouterError(
            "bad_request", f"lines must be a whole number from 0 to {MAX_LINES}, not {raw[:40]!r}"
        )
    return lines


def _follow_param(request: Request) -> bool:
    raw = request.query_params.get("follow", "0").lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no", ""):
        return False
    raise RouterError("bad_request", f"follow must be 1 or 0, not {raw[:40]!r}")


def _copy_path(role: str, node: str | None, copies: Mapping[str, Path]) -> Path | None:
    """The log of ``role``'s copy on ``node`` (``?node``; ``None``: not given), with
    ``copies`` its copies' logs by node: the one copy's when it has one here, ``None``
    when it has several and no ``node`` was given.

    Raises:
        RouterError: 404 ``not_found`` when ``node`` holds no copy of ``role`` here.
    """
    if node is not None:
        if node not in copies:
            where = ", ".join(sorted(copies))
            raise RouterError(
                "not_found", f"role {role} has no copy on node {node} here; its copies: {where}"
            )
        return copies[node]
    return next(iter(copies.values())) if len(copies) == 1 else None


def _copies_tail(copies: Mapping[str, Path], lines: int) -> bytes:
    """The last ``lines`` lines of each copy's log, by node, each under a
    ``==> <file> <==`` line (as ``tail`` shows several files)."""
    parts = [
        f"==> {copies[node].name} <==\n".encode() + tail_bytes(copies[node], lines)
        for node in sorted(copies)
    ]
    return b"\n".join(parts)


async def log_response(
    request: Request,
    role: str,
    log_path: LogPath,
    streams: LiveStreams,
    copy_logs: CopyLogs | None = None,
) -> Response:
    """The answer to ``GET /rosterd/logs/{role}`` for a resolved ``role``; ``copy_logs``:
    the logs of its copies on this machine's nodes, by node (``?node`` picks one).

    Raises:
        RouterError: 400 ``bad_request`` for a bad ``lines`` or ``follow``, or a follow of
            a role with several copies here without ``?node``; 404 ``not_found`` when this
            process keeps no log for ``role``, or ``?node`` holds no copy of it.
    """
    lines = _lines_param(request)
    follow = _follow_param(request)
    node = request.query_params.get("node") or None
    copies = dict(copy_logs(role)) if copy_logs is not None else {}
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    media = "text/plain; charset=utf-8"
    # A role with one copy has one log, named by the role: ``?node`` changes nothing.
    path = _copy_path(role, node, copies) if copies else log_path(role)
    if path is None and copies:
        if follow:
            where = ", ".join(sorted(copies))
            raise RouterError(
                "bad_request",
                f"role {role} has copies on nodes {where} here: follow one with "
                f"?node= (rosterd logs {role} --node NODE -f)",
            )
        body = await asyncio.to_thread(_copies_tail, copies, lines)
        return Response(body, media_type=media, headers=headers)
    if path is None:
        raise RouterError("not_found", f"role {role}'s backend log is not kept by this process")
    if not follow:
        body = await asyncio.to_thread(tail_bytes, path, lines)
        return Response(body, media_type=media, headers=headers)
    headers["X-Accel-Buffering"] = "no"
    return StreamingResponse(follow_log(path, lines, streams), media_type=media, headers=headers)
