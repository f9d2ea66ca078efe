"""Backend processes (DESIGN.md layer 5): spawn, signal, wait, describe and measure them.

- **argv only**: ``spawn_logged`` starts a process from its argument list, never
  a shell, with its stdout and stderr appended to a log file that rotates by
  size (through a pipe rosterd reads: :mod:`rosterd.supervisor.logs`).
- **dies with rosterd**: the process leads its own process group (session)
  and, on Linux, gets a parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL),
  so ``kill -9`` of rosterd takes it along. The signal is tied to the thread
  that started the process: spawn on the event loop of a thread that lives as
  long as rosterd (normally the main thread).
- **stop is polite, then firm**: ``terminate_group`` sends SIGTERM to the
  group, waits the grace, then SIGKILL, and returns only once the group is
  gone, so the memory counts as free when it returns. Each step is logged
  (logger ``rosterd.supervisor``): the SIGTERM, how long the wait took, and
  the SIGKILL when the grace ran out.
- ``tree_rss_bytes`` is the one measure of a process tree's resident memory.

Library choices: asyncio subprocesses (the scheduler and router are asyncio),
psutil (process trees and memory portably), ctypes for ``prctl`` (no extra package).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import psutil

from rosterd.supervisor.logs import drain_log, log_files, open_backend_log

#: Lines of a backend's output quoted in a start error.
TAIL_LINES: Final[int] = 20
#: At most this many lines of a backend's output say why it failed (``failure_reason``).
REASON_LINES: Final[int] = 3
#: At most this many characters of them (``failure_reason``); one line is cut to fit.
REASON_CHARS: Final[int] = 240
#: How the header line that starts each process's output in its log begins (the backend's
#: name follows): :func:`spawn_logged` writes it, :func:`latest_run_output` finds it.
_RUN_HEADER: Final[str] = "--- rosterd: starting "

# llama.cpp's time stamp and level ("0.00.003.444 E "; E is an error), and runs of blanks.
_STAMP = re.compile(r"^\d+(?:\.\d+)+ ([A-Z]) ")
# A line that says why, in output without levels: an error word ("ValueError:" too).
_ERROR_WORD = re.compile(
    r"error\b|\bfail(?:s|ed|ure)?\b|\binvalid\b|\bunable\b|\bcannot\b|\bnot found\b", re.I
)
_BLANKS = re.compile(r"\s+")
log = logging.getLogger("rosterd.supervisor")

#: How long to wait for a killed group's last processes to disappear (seconds).
GROUP_GONE_TIMEOUT_S: Final[float] = 5.0

_PR_SET_PDEATHSIG: Final[int] = 1
_LIBC: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):  # pragma: no branch - only Linux has prctl
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def describe_exit(code: int | None) -> str:
    """How a process ended, from its return code, for messages.

    ``0``/``1`` -> ``exited with code 1``; ``-9`` -> ``was killed by signal 9
    (SIGKILL)`` (asyncio gives a negative code for a signal); ``None`` ->
    ``exited``.
    """
    if code is None:
        return "exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"was killed by signal {-code}"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def _parent_death_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child SIGKILL when its parent dies (Linux), else ``None``."""
    libc = _LIBC
    if libc is None:
        return None

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then no signal would come.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


async def spawn_logged(
    name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
) -> tuple[asyncio.subprocess.Process, int]:
    """Start ``argv`` (no shell) in its own process group, dying with this process.

    ``env`` is added to this process's environment. Output (stdout and stderr,
    one pipe) is appended to ``log_path`` after one header line naming
    ``name``, the time and the command, by a reader of rosterd's that rotates
    the log by size (:mod:`rosterd.supervisor.logs`). Returns the process and
    the log's size in bytes before its first output (the offset ``output_tail``
    reads from).

    Raises:
        OSError: the log cannot be opened or ``argv[0]`` cannot be executed.
    """
    header = f"{_RUN_HEADER}{name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: {' '.join(argv)}\n"
    log = open_backend_log(name, log_path, header)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log.write_fd,
            stderr=log.write_fd,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=_parent_death_preexec(os.getpid()),
        )
    except BaseException:
        log.abandon()
        raise
    log.started()
    return proc, log.offset


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; a group that is gone (or not ours) is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def wait_group_gone(pgid: int, *, timeout_s: float) -> None:
    """Wait until no process is left in group ``pgid`` (bounded by ``timeout_s`` seconds)."""
    deadline = time.monotonic() + timeout_s
    pause_s = 0.002  # most groups are gone at once: look again soon, then less often
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        await asyncio.sleep(pause_s)
        pause_s = min(0.05, pause_s * 2)


async def terminate_group(
    proc: asyncio.subprocess.Process, *, grace_s: float, name: str | None = None, why: str = ""
) -> None:
    """SIGTERM ``proc``'s group, wait ``grace_s`` seconds, SIGKILL it; return once it is gone.

    ``grace_s`` 0 sends SIGKILL at once. ``proc`` must lead its own group (as
    ``spawn_logged`` starts it); whatever else is left in the group is killed too.
    With ``name`` (the backend's), each step is logged at INFO, the SIGKILL at WARNING,
    with ``why`` (what a SIGKILL costs this backend, ``Launch.sigkill_note``) when given.
    """
    pgid = proc.pid
    who = f"backend {name} (pid {pgid})"
    if proc.returncode is None:
        started = time.monotonic()
        if grace_s > 0:
            if name is not None:
                log.info("%s: SIGTERM; waiting up to %g s before SIGKILL", who, grace_s)
            kill_group(pgid, signal.SIGTERM)
        else:
            if name is not None:
                log.info("%s: SIGKILL (no grace)", who)
            kill_group(pgid, signal.SIGKILL)
        try:
            await asyncio.wait_for(proc.wait(), timeout=grace_s if grace_s > 0 else 5.0)
            if name is not None:
                log.info("%s: exited after %.2f s", who, time.monotonic() - started)
        except TimeoutError:
            if name is not None:
                note = f" ({why})" if why else ""
                log.warning("%s: still running after %g s; SIGKILL%s", who, grace_s, note)
            kill_group(pgid, signal.SIGKILL)
            await proc.wait()
    kill_group(pgid, signal.SIGKILL)  # anything left in the group
    await wait_group_gone(pgid, timeout_s=GROUP_GONE_TIMEOUT_S)


async def stop_foreign_group(proc: psutil.Process, *, grace_s: float) -> None:
    """Stop a process that is not our child: SIGTERM, ``grace_s`` seconds, SIGKILL.

    When it leads its own process group the signals go to the whole group and
    this returns once the group is gone; otherwise only the process is signalled.
    """
    pgid = proc.pid
    try:
        is_leader = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return
    if is_leader:
        kill_group(pgid, signal.SIGTERM)
    else:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    await asyncio.to_thread(psutil.wait_procs, [proc], timeout=grace_s)
    if is_leader:
        kill_group(pgid, signal.SIGKILL)
        await wait_group_gone(pgid, timeout_s=GROUP_GONE_TIMEOUT_S)
    else:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def latest_run_output(path: Path, name: str) -> str:
    """What the latest process of backend ``name`` wrote to its log ``path`` so far: the
    text after the last header line :func:`spawn_logged` wrote for it, from the rotated
    files too (newest first, until one holds that header); ``""`` if unreadable.

    What the backend wrote and rosterd's log reader has not yet moved is moved first.
    Reads up to the whole log and its rotated files (``LOG_MAX_BYTES`` each): call it off
    the event loop, once per process.
    """
    drain_log(path)
    header = f"{_RUN_HEADER}{name} at ".encode()
    parts: list[bytes] = []
    for file in reversed(log_files(path)):
        try:
            data = file.read_bytes()
        except OSError:
            break
        start = data.rfind(header)
        if start < 0:
            parts.append(data)  # all of it is this run's: its header is in an older file
            continue
        line_end = data.find(b"\n", start)
        parts.append(data[line_end + 1 :] if line_end >= 0 else b"")
        break
    return b"".join(reversed(parts)).decode("utf-8", errors="replace")


def output_tail(path: Path, offset: int, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines written to ``path`` after byte ``offset`` (``()`` if unreadable).

    What the backend wrote and rosterd's log reader has not yet moved is moved
    first. If the log rotated since ``offset`` was taken (the file is now
    shorter than ``offset``), the rotated file's part after ``offset`` comes
    first; a start would have to write a whole log's worth (10 MiB) for that
    to be mistaken.
    """
    drain_log(path)
    try:
        with path.open("rb") as f:
            data = f.read()
        if len(data) >= offset:
            data = data[offset:]
        else:  # rotated since: the start of this output is in the previous file
            with contextlib.suppress(OSError), path.with_name(path.name + ".1").open("rb") as old:
                old.seek(offset)
                data = old.read() + data
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace").splitlines()
    return tuple(line.rstrip() for line in text[-lines:])


def failure_reason(tail: Sequence[str]) -> str:
    """The few lines of a backend's output ``tail`` that say why it failed, as one line.

    The first ``REASON_LINES`` distinct lines that say why: those of error level
    when the output has llama.cpp's levels (``0.00.003.444 E ...``; it prints the
    cause first, e.g. ``invalid magic characters``, and repeats itself), else
    those with an error word ("error", "failed", "invalid", ...); without the
    time stamp and level, joined by ``"; "``. The last non-blank line when no
    line says why; ``""`` for no output. Control characters become
    ``?``, and the result is at most ``REASON_CHARS`` characters (cut with
    ``…``).
    """
    lines = [line for line in map(_clean, tail) if line]
    levels = [_STAMP.match(line) for line in lines]
    if any(levels):  # llama.cpp says which lines are errors
        telling = [
            line for line, level in zip(lines, levels, strict=True) if level and level[1] == "E"
        ]
    else:
        telling = [line for line in lines if _ERROR_WORD.search(line)]
    picked: list[str] = []
    for line in telling or lines[-1:]:
        text = _STAMP.sub("", line)
        if text not in picked:
            picked.append(text)
        if len(picked) == REASON_LINES:
            break
    reason = "; ".join(picked)
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


def _clean(line: str) -> str:
    """``line`` with control characters as ``?`` and runs of blanks as one space."""
    shown = "".join(c if c.isprintable() or c.isspace() else "?" for c in line)
    return _BLANKS.sub(" ", shown).strip()


def tree_rss_bytes(pid: int) -> int | None:
    """Resident memory (RSS, bytes) of process ``pid`` plus all its descendants, as of now.

    ``None`` when ``pid`` does not run (or is a zombie) or its own memory cannot
    be read. A descendant that exits while being counted, or whose memory the
    OS hides, is left out. Pages of memory-mapped weights count once they have
    been touched, so this is the figure to report next to a role's estimate.
    """
    try:
        root = psutil.Process(pid)
        if root.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped: holds no memory
            return None
        total = int(root.memory_info().rss)
        children = root.children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):
            total += int(child.memory_info().rss)
    return total


def process_tree_peak_rss_bytes(pid: int) -> int | None:
    """The peak resident memory (bytes) of process ``pid`` plus its children's, or ``None``.

    On Linux each process's ``VmHWM`` (its high-water mark); where that is not
    readable, its current RSS. ``None`` when ``pid`` is not running.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0
    for proc in procs:
        peak = _vm_hwm_bytes(proc.pid)
        if peak is None:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                peak = proc.memory_info().rss
        total += peak or 0
    return total


def _vm_hwm_bytes(pid: int) -> int | None:
    """``VmHWM`` of ``pid`` from ``/proc/<pid>/status`` in bytes, or ``None`` if unavailable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
