"""The state folder's run records (DESIGN.md layer 5): who owns the folder, what it left running.

- **one owner per state folder**: ``lock_state_dir`` takes an exclusive lock on
  ``<state_dir>/rosterd.lock`` (holding the owner's pid) for a rosterd's whole
  life, so a second rosterd on the same folder is refused instead of stopping
  the first one's backends.
- **records**: every started backend is recorded in
  ``<state_dir>/run/<name>.json``: ``name``, ``pid``, ``create_time`` (the
  process's start time, seconds since the epoch), ``cmdline`` (its argv), and
  ``owner_pid``/``owner_create_time`` of the rosterd that started it.
- **leftovers**: ``reap_leftovers`` stops the processes of an earlier run
  whose pid, command line and start time all match a record and whose owner
  is no longer running, and never anyone else's.
- **load times**: each ready backend's load, seconds from its spawn to its readiness, is
  kept in ``<state_dir>/run/loads/<name>.json`` (``name``, ``loads_s``: the last
  :data:`KEPT_LOADS`, oldest first), across runs: a load's expected total comes from them
  (``rosterd.router.load_progress``). The subfolder keeps them out of the records the
  reaper reads; a folder without it (an older run's) has no past loads.

Library choices: ``fcntl.flock`` (the lock dies with its process, so a crash
never leaves the folder locked), psutil (start times and command lines portably).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Final

import psutil

from rosterd.errors import StateDirLockedError
from rosterd.supervisor.process import stop_foreign_group

#: Two start times closer than this (seconds) are the same: psutil rounds them.
_SAME_START_S: Final[float] = 0.05

#: How many past loads a backend's load times keep: enough for a median that one slow
#: (cold page cache) or fast load does not sway, few enough that an old disk is forgotten.
KEPT_LOADS: Final[int] = 8


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rosterd`` (default ``~/.local/state/rosterd``) on the machine that
    calls it: logs, pid records and measured memory peaks (``rosterd up`` writes them,
    ``rosterd plan`` reads them); a node agent's folder is ``<it>/nodes/<node>``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rosterd"


class StateDirLock:
    """An exclusive ``fcntl.flock`` on ``<state_dir>/rosterd.lock``, held until :meth:`release`.

    The file holds the owner's pid (decimal text). The lock dies with the
    process, so a crashed rosterd never leaves the folder locked.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays, a later run reuses it."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)

    def __enter__(self) -> StateDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_state_dir(state_dir: Path) -> StateDirLock:
    """Take the exclusive lock of ``state_dir`` (created if missing) for this process.

    Raises:
        StateDirLockedError: another process holds it (its pid in the message).
        OSError: the folder or lock file cannot be created.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "rosterd.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            text = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip()
        except OSError:
            text = ""
        os.close(fd)
        raise StateDirLockedError(path, int(text) if text.isdigit() else None) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirLock(path, fd)


def record_path(run_dir: Path, name: str) -> Path:
    """Where backend ``name``'s record lives: ``<run_dir>/<name>.json``."""
    return run_dir / f"{name}.json"


def write_record(path: Path, *, name: str, pid: int, argv: Sequence[str]) -> None:
    """Record that this process started backend ``name`` as ``pid`` from ``argv`` (atomically).

    Raises:
        OSError: the record cannot be written.
    """
    record = {
        "name": name,
        "pid": pid,
        "create_time": _process_create_time(pid),
        "cmdline": list(argv),
        "owner_pid": os.getpid(),
        "owner_create_time": _process_create_time(os.getpid()),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def load_times_path(run_dir: Path, name: str) -> Path:
    """Where backend ``name``'s past load times live: ``<run_dir>/loads/<name>.json``."""
    return run_dir / "loads" / f"{name}.json"


def record_load(run_dir: Path, name: str, load_s: float) -> None:
    """Add a load of backend ``name`` that took ``load_s`` seconds (spawn to ready) to its
    load times, keeping the last :data:`KEPT_LOADS` (atomically; an unreadable file starts
    over).

    Raises:
        OSError: the file cannot be written.
    """
    path = load_times_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    loads = [*past_loads_s(run_dir, name), round(load_s, 3)][-KEPT_LOADS:]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": name, "loads_s": loads}))
    tmp.replace(path)


def past_loads_s(run_dir: Path, name: str) -> tuple[float, ...]:
    """Backend ``name``'s past load times, seconds, oldest first; ``()`` when none were
    kept (a missing, unreadable or malformed file: an older run's folder has none)."""
    record = _read_record(load_times_path(run_dir, name))
    loads = record.get("loads_s") if record is not None else None
    if not isinstance(loads, list):
        return ()
    return tuple(
        float(s) for s in loads if isinstance(s, int | float) and not isinstance(s, bool) and s >= 0
    )


def drop_record(path: Path) -> None:
    """Remove a record (a missing one is fine)."""
    path.unlink(missing_ok=True)


async def reap_leftovers(run_dir: Path, *, keep: Collection[str], grace_s: float) -> list[int]:
    """Stop backends an earlier rosterd run left behind; return their pids.

    For each record in ``run_dir`` whose name is not in ``keep`` (this
    rosterd's own backends), the process is stopped (SIGTERM to its group,
    ``grace_s`` seconds, SIGKILL) only if its pid, command line and start time
    all match the record and the rosterd that started it is no longer running.
    A live owner's record is left alone; any other record (its process gone,
    its pid now another program's, or unreadable) is removed.
    """
    reaped: list[int] = []
    for path, record in _read_records(run_dir, keep):
        if record is not None and _owner_alive(record):
            continue  # another running rosterd's backend: never ours to stop
        if record is not None:
            proc = _matching_process(record)
            if proc is not None:
                await stop_foreign_group(proc, grace_s=grace_s)
                reaped.append(proc.pid)
        drop_record(path)
    return reaped


def _read_records(
    run_dir: Path, keep: Collection[str]
) -> list[tuple[Path, Mapping[str, object] | None]]:
    """Every record in ``run_dir`` not named in ``keep``, by file name (``None``: unreadable)."""
    return [
        (path, _read_record(path))
        for path in sorted(run_dir.glob("*.json"))
        if path.stem not in keep
    ]


def _read_record(path: Path) -> Mapping[str, object] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _process_create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0.0


def _owner_alive(record: Mapping[str, object]) -> bool:
    """Whether the rosterd that wrote ``record`` still runs (same pid and start time).

    Records without an owner (older versions) count as ownerless: ``False``.
    """
    pid, created = record.get("owner_pid"), record.get("owner_create_time")
    if not isinstance(pid, int) or not isinstance(created, float | int):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(proc.create_time() - float(created)) <= _SAME_START_S
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # it exists; when in doubt, do not stop its backends


def _matching_process(record: Mapping[str, object]) -> psutil.Process | None:
    """The live process the record describes: same pid, command line and start time."""
    pid, create_time, cmdline = record.get("pid"), record.get("create_time"), record.get("cmdline")
    if not isinstance(pid, int) or not isinstance(create_time, float | int):
        return None
    if not isinstance(cmdline, list):
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - float(create_time)) > _SAME_START_S:
            return None
        if proc.cmdline() != cmdline:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return proc
