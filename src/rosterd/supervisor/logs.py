"""Backend logs (DESIGN.md layer 5): a backend's output, piped through rosterd into a log
file that rotates by size.

A process writing to a file descriptor of its own cannot be rotated by renaming
its file: it would go on writing to the renamed file. So a backend's stdout and
stderr are one pipe, and rosterd moves what arrives on it into
``<state_dir>/logs/<role>.log``, rotating it when it grows past
:data:`LOG_MAX_BYTES` (``<role>.log.1`` … ``<role>.log.<LOG_BACKUPS>`` are kept,
the oldest dropped).

Why a thread per pipe, not the event loop: a backend that writes to a full
pipe blocks, and llama-server writes its log lines from the threads that
generate, so a stalled reader would stall generation. The reader is a plain
thread blocked in ``poll`` (which releases the GIL), so a busy event loop or a
slow request handler never delays it by more than the interpreter's switch
interval, and the pipe's buffer is raised to :data:`PIPE_BUFFER_BYTES` (1 MiB,
Linux's default ``pipe-max-size``) to absorb a burst meanwhile. When the log
cannot be written (a full disk), the reader keeps draining the pipe and counts
what it dropped, and says so in the log once it can write again: the backend
never blocks on rosterd. Output is not lost while rosterd is slow, only when
the disk refuses it.

Reading and writing happen under one lock, so :func:`drain_log` moves whatever
is still in the pipe into the file at once: a start error that quotes the last
lines of a backend that just exited sees all of them.

Library choice: the rotation follows the standard library's
``logging.handlers.RotatingFileHandler`` (``.log`` -> ``.log.1`` -> …), written
out here for bytes: that handler takes text records, counts characters rather
than bytes, and rotates an empty file when one write is larger than the limit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import threading
from pathlib import Path
from typing import BinaryIO, Final

#: A backend log's size, in bytes, past which it is rotated.
LOG_MAX_BYTES: Final[int] = 10 * 2**20
#: How many rotated files (``<role>.log.1`` …) are kept beside the current one.
LOG_BACKUPS: Final[int] = 3
#: The capacity asked for a backend's output pipe, bytes (Linux; elsewhere the OS default).
PIPE_BUFFER_BYTES: Final[int] = 2**20
#: The most a reader takes from the pipe in one read, bytes.
READ_CHUNK_BYTES: Final[int] = 64 * 1024


class RotatingLog:
    """One log file rotated by size (``path``, ``path.1`` … ``path.<backups>``).

    ``write(data)`` appends bytes as given, cutting them at a line end so that
    a file ends near ``max_bytes`` (a line longer than a whole file is cut).
    It never raises: bytes that cannot be written are counted in
    ``dropped_bytes`` and reported in the log by the next write that succeeds.
    Not thread-safe by itself: use under one lock.
    """

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max(1, max_bytes)
        self.backups = backups
        self.dropped_bytes = 0
        self._file: BinaryIO | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        """Append ``data``, rotating where the file would grow past ``max_bytes``."""
        if self.dropped_bytes:
            note = f"--- rosterd: {self.dropped_bytes} bytes of output were lost (log unwritable)\n"
            if self._append(note.encode()):
                self.dropped_bytes = 0
        while data:
            room = self.max_bytes - self._current_size()
            if len(data) <= room:
                piece, data = data, b""
            else:
                cut = data.rfind(b"\n", 0, max(room, 0)) + 1  # the whole lines that fit
                if cut == 0 and self._size == 0:
                    cut = self.max_bytes  # a line longer than a file: cut it
                piece, data = data[:cut], data[cut:]
            if piece and not self._append(piece):
                self.dropped_bytes += len(piece) + len(data)
                return
            if data:
                self._rotate()

    def size_bytes(self) -> int:
        """The current file's size in bytes (written since its last rotation)."""
        return self._current_size()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _current_size(self) -> int:
        if self._file is None:
            try:
                self._file = self.path.open("ab")
                self._size = self._file.tell()
            except OSError:
                return 0
        return self._size

    def _append(self, data: bytes) -> bool:
        self._current_size()
        if self._file is None:
            return False
        try:
            self._file.write(data)
            self._file.flush()  # readers (the log endpoint, a start error's tail) see it now
        except OSError:
            self.close()  # reopened by the next write
            return False
        self._size += len(data)
        return True

    def _rotate(self) -> None:
        """``path.N-1`` -> ``path.N`` … ``path`` -> ``path.1`` (the oldest dropped); a new
        ``path``. The scheme of the standard library's ``RotatingFileHandler``."""
        self.close()
        with contextlib.suppress(OSError):
            if self.backups <= 0:
                self.path.unlink(missing_ok=True)
            else:
                for n in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{n}")
                    if older.exists():
                        older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
                self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._size = 0


class _OpenLog:
    """A log file shared by the pumps writing to it (a restart's new process and the
    old one's last bytes), with the lock that orders their reads and writes."""

    def __init__(self, log: RotatingLog) -> None:
        self.log = log
        self.lock = threading.Lock()
        self.users = 0
        self.pumps: set[LogPump] = set()


_registry_lock = threading.Lock()
_open_logs: dict[Path, _OpenLog] = {}


def _acquire(path: Path, max_bytes: int, backups: int) -> _OpenLog:
    with _registry_lock:
        shared = _open_logs.get(path)
        if shared is None:
            shared = _OpenLog(RotatingLog(path, max_bytes=max_bytes, backups=backups))
            _open_logs[path] = shared
        shared.users += 1
        return shared


def _release(path: Path, shared: _OpenLog) -> None:
    with _registry_lock:
        shared.users -= 1
        if shared.users == 0 and _open_logs.get(path) is shared:
            del _open_logs[path]
            with shared.lock:
                shared.log.close()


class LogPump:
    """Moves one process's output from the read end of its pipe into a :class:`RotatingLog`,
    on a daemon thread of its own, until the pipe's last writer closed it."""

    def __init__(self, name: str, read_fd: int, path: Path, shared: _OpenLog) -> None:
        self.name = name
        self._fd = read_fd
        self._path = path
        self._shared = shared
        self._closed = False
        os.set_blocking(read_fd, False)
        self._thread = threading.Thread(target=self._run, name=f"rosterd-log-{name}", daemon=True)

    def start(self) -> None:
        with self._shared.lock:
            self._shared.pumps.add(self)
        self._thread.start()

    def drain(self) -> None:
        """Move whatever the pipe holds now into the log (returns at once)."""
        with self._shared.lock:
            self._move()

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the pipe to close; whether it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _move(self) -> None:
        """Under the lock: read the pipe until it is empty; close it at end of file."""
        while not self._closed:
            try:
                data = os.read(self._fd, READ_CHUNK_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._closed = True
                os.close(self._fd)
                self._shared.pumps.discard(self)
                return
            self._shared.log.write(data)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                poller.poll()
                with self._shared.lock:
                    self._move()
                    if self._closed:
                        return
        finally:
            _release(self._path, self._shared)


def _enlarge_pipe(fd: int) -> None:
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if set_size is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, set_size, PIPE_BUFFER_BYTES)


class BackendLog:
    """The log of one process about to start: ``write_fd`` is the pipe end to give it as
    stdout and stderr; :meth:`started` hands the read end to a :class:`LogPump`.

    Made by :func:`open_backend_log`; ``offset`` is the log's size after the header
    line (where this process's output begins, unless the file rotates meanwhile).
    """

    def __init__(self, name: str, path: Path, shared: _OpenLog, header: bytes) -> None:
        self.name = name
        self.path = path
        self._shared = shared
        read_fd, self.write_fd = os.pipe()  # both ends close-on-exec, as Python makes them
        self._read_fd: int | None = read_fd
        _enlarge_pipe(self.write_fd)
        with shared.lock:
            shared.log.write(header)
            self.offset = shared.log.size_bytes()

    def started(self) -> LogPump:
        """The process has the write end: close ours and start moving its output."""
        os.close(self.write_fd)
        assert self._read_fd is not None
        pump = LogPump(self.name, self._read_fd, self.path, self._shared)
        self._read_fd = None
        pump.start()
        return pump

    def abandon(self) -> None:
        """The process did not start: close both ends and let the log go."""
        os.close(self.write_fd)
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        _release(self.path, self._shared)


def open_backend_log(
    name: str,
    path: Path,
    header: str,
    *,
    max_bytes: int | None = None,
    backups: int | None = None,
) -> BackendLog:
    """Append ``header`` to the log at ``path`` and make the pipe for ``name``'s output.

    ``max_bytes`` and ``backups`` (default :data:`LOG_MAX_BYTES`,
    :data:`LOG_BACKUPS`, read when called) apply to the first user of ``path``
    in this process (later users share its file). Raises ``OSError`` if the
    log's folder cannot be written or no pipe can be made.
    """
    max_bytes = LOG_MAX_BYTES if max_bytes is None else max_bytes
    backups = LOG_BACKUPS if backups is None else backups
    path.parent.mkdir(parents=True, exist_ok=True)
    # Open it now, so a log that cannot be created fails the start (as it always did).
    with path.open("ab"):
        pass
    shared = _acquire(path, max_bytes, backups)
    try:
        return BackendLog(name, path, shared, header.encode())
    except BaseException:
        _release(path, shared)
        raise


def drain_log(path: Path) -> None:
    """Move what the processes logging to ``path`` have written so far into the file."""
    with _registry_lock:
        shared = _open_logs.get(path)
    if shared is None:
        return
    with shared.lock:
        pumps = list(shared.pumps)
    for pump in pumps:
        pump.drain()


def log_files(path: Path) -> list[Path]:
    """``path`` and its rotated files that exist, oldest first (``.log.3``, …, ``.log``)."""
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
        reverse=True,
    )
    return [*rotated, *([path] if path.exists() else [])]
