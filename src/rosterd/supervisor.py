"""The supervisor (DESIGN.md layer 5): backend processes and their lifecycle.

One ``Supervisor`` per node owns the backend servers that adapters describe
(``Launch``). What it guarantees:

- **argv only**: a backend is started from its argument list, never a shell.
- **dies with rosterd**: each backend runs in its own process group (session)
  and, on Linux, with a parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL),
  so ``kill -9`` of rosterd takes its backends with it. The signal is tied to
  the thread that started the process: run the supervisor on the event loop of
  a thread that lives as long as rosterd (normally the main thread).
- **ready means ready**: ``start`` returns only once the launch's readiness
  probe passes. It gives up at once if the process exits (``BackendStartError``
  with the exit code and the last lines of its output) or when a deadline that
  grows with the weights' size passes (``BackendNotReadyError``, process killed).
- **logs**: each backend's stdout and stderr go to ``<state_dir>/logs/<name>.log``
  (appended, one header line per start).
- **stop is polite, then firm**: SIGTERM to the group, ``grace_s`` seconds,
  then SIGKILL to the group. ``stop`` returns only after the process has exited,
  so its memory can be counted as free when it returns.
- **restarts**: a backend that exits by itself is restarted after an
  exponential backoff (``initial_backoff_s`` doubling up to ``max_backoff_s``),
  reset once a backend has run ``healthy_reset_s`` seconds; after
  ``max_restart_failures`` restarts in a row fail to become ready it gives up
  (a final ``restart_failed`` event) and the backend is no longer supervised.
- **ports**: a port something else listens on is refused with
  ``PortInUseError`` naming the holder when the OS lets us see it.
- **leftovers**: every started backend is recorded (pid, command line, start
  time, and the pid and start time of the rosterd that owns it) in
  ``<state_dir>/run/<name>.json``; ``reap_leftovers`` stops the processes of an
  earlier run whose pid, command line and start time all match a record and
  whose owner is no longer running, and never anyone else's.
- **one owner per state folder**: ``lock_state_dir`` takes an exclusive lock on
  ``<state_dir>/rosterd.lock`` (holding the owner's pid) for a rosterd's whole
  life, so a second rosterd on the same folder is refused instead of stopping
  the first one's backends.

Library choices: asyncio subprocesses (the scheduler and router are asyncio),
psutil (process start times, command lines and socket owners portably), httpx
(the project's HTTP client) for probes, ctypes for ``prctl`` (no extra package).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import httpx
import psutil

from rosterd.adapters.base import HttpProbe, Launch
from rosterd.errors import RosterdError
from rosterd.tokens import GB, valid_token

#: Readiness deadline for a backend whose weights size is unknown (seconds).
READY_BASE_S: Final[float] = 30.0
#: Extra readiness time per GB (2^30 bytes) of weights (seconds): loading reads them from disk.
READY_PER_GB_S: Final[float] = 30.0
#: Upper bound of the computed readiness deadline (seconds).
READY_MAX_S: Final[float] = 3600.0
#: How often readiness is polled while a backend loads (seconds).
READY_POLL_S: Final[float] = 0.2
#: Lines of a backend's output quoted in a start error.
TAIL_LINES: Final[int] = 20

_PR_SET_PDEATHSIG: Final[int] = 1
_LIBC: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):  # pragma: no branch - only Linux has prctl
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class SupervisorError(RosterdError):
    """A backend could not be started, stopped or found; the message says which and why.

    ``client_message``: the short reason an HTTP client may be told (no pids,
    command lines or paths), or ``None`` when the message's first line will do.
    """

    client_message: str | None = None


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


class StateDirLockedError(SupervisorError):
    """Another running rosterd holds the state folder's lock.

    ``lock_path`` is the lock file, ``owner_pid`` the pid written in it (``None``
    when it cannot be read).
    """

    def __init__(self, lock_path: Path, owner_pid: int | None) -> None:
        self.lock_path = lock_path
        self.owner_pid = owner_pid
        who = f"pid {owner_pid}" if owner_pid is not None else "a process whose pid is unknown"
        super().__init__(
            f"another rosterd ({who}) is running with the state folder {lock_path.parent}; "
            "stop it first, or give this one its own folder with --state-dir"
        )


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


class BackendStartError(SupervisorError):
    """A backend exited (or was killed) before it became ready.

    ``name`` is the backend, ``pid`` its process (gone by the time this is
    raised), ``exit_code`` its exit status (negative: killed by that signal;
    ``None``: still running when given up on), ``output_tail`` the last lines
    of its stdout/stderr, ``log_path`` its full log.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        pid: int,
        exit_code: int | None,
        output_tail: tuple[str, ...],
        log_path: Path,
    ) -> None:
        self.name = name
        self.pid = pid
        self.exit_code = exit_code
        self.output_tail = output_tail
        self.log_path = log_path
        tail = "\n".join(f"  | {line}" for line in output_tail) or "  | (no output)"
        super().__init__(f"{message}\nlast lines of {log_path}:\n{tail}")


class BackendNotReadyError(BackendStartError):
    """A backend did not pass its readiness probe before the deadline; it was killed."""


class PortInUseError(SupervisorError):
    """Another process listens on the backend's port.

    ``host``/``port`` are the address; ``holder`` names the process
    (``pid 123 (llama-server)``) or is ``None`` when the OS does not tell us.
    """

    def __init__(self, host: str, port: int, holder: str | None) -> None:
        self.host = host
        self.port = port
        self.holder = holder
        who = f"by {holder}" if holder else "by another process (its owner is not visible)"
        self.client_message = (
            f"port {port} is in use by another process; stop it or give the role another port"
        )
        super().__init__(
            f"port {port} on {host} is already in use {who}; "
            "stop that process or give the role another port"
        )


@dataclass(frozen=True, slots=True)
class Backend:
    """A snapshot of one supervised backend.

    ``pid`` is the current process (its process group has the same id);
    ``ready`` is false while it is restarting; ``restarts`` counts automatic
    restarts since ``start``.
    """

    name: str
    pid: int
    launch: Launch
    log_path: Path
    ready: bool
    restarts: int

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the backend."""
        return self.launch.base_url


EventKind = Literal["ready", "exited", "restarting", "restart_failed", "stopped"]


@dataclass(frozen=True, slots=True)
class BackendEvent:
    """Something that happened to a backend, given to the ``on_event`` callback.

    ``kind``: ``ready`` (started or restarted and ready), ``exited`` (died by
    itself; ``exit_code`` set), ``restarting`` (``delay_s`` until the next
    try), ``restart_failed`` (``detail`` says why; ``final`` when the
    supervisor gave up and no process is left), ``stopped`` (by ``stop``).
    """

    name: str
    kind: EventKind
    pid: int | None = None
    exit_code: int | None = None
    delay_s: float | None = None
    detail: str = ""
    final: bool = False


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one ``HttpProbe``: ``ok``, the HTTP ``status`` (``None`` if no answer)."""

    ok: bool
    status: int | None
    detail: str = ""


def ready_timeout_for(weights_bytes: int) -> float:
    """The readiness deadline in seconds for weights of ``weights_bytes`` bytes.

    ``READY_BASE_S + READY_PER_GB_S * weights_bytes / GB``, at most ``READY_MAX_S``.
    """
    return min(READY_MAX_S, READY_BASE_S + READY_PER_GB_S * max(weights_bytes, 0) / GB)


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Seconds to wait before restart number ``failures + 1`` of a crash series.

    ``initial_s * 2**failures``, at most ``max_s``: 0.5, 1, 2, 4, ... capped.
    """
    return min(max_s, initial_s * (2.0 ** min(failures, 62)))


async def run_probe(
    base_url: str, probe: HttpProbe, *, timeout_s: float, client: httpx.AsyncClient | None = None
) -> ProbeResult:
    """Send ``probe`` to ``base_url`` and judge the answer; never raises for HTTP trouble.

    Passes when the status is in ``probe.ok_status`` and, if
    ``probe.expect_json_key`` is set, the JSON body is an object with that key.
    A server that does not answer within ``timeout_s`` seconds fails (that is
    how a wedged server shows: HTTP accepted, generation never ends).
    """
    own = client is None
    http = client or httpx.AsyncClient()
    try:
        response = await http.request(
            probe.method,
            base_url + probe.path,
            json=dict(probe.json) if probe.json is not None else None,
            timeout=timeout_s,
        )
    except httpx.TimeoutException:
        return ProbeResult(False, None, f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as err:
        return ProbeResult(False, None, f"{type(err).__name__}: {err}")
    finally:
        if own:
            await http.aclose()
    if response.status_code not in probe.ok_status:
        return ProbeResult(False, response.status_code, response.text[:200])
    if probe.expect_json_key is not None:
        try:
            body = response.json()
        except ValueError:
            return ProbeResult(False, response.status_code, "answer is not JSON")
        if not isinstance(body, dict) or probe.expect_json_key not in body:
            return ProbeResult(
                False, response.status_code, f"answer has no {probe.expect_json_key!r}"
            )
    return ProbeResult(True, response.status_code)


def port_holder(host: str, port: int) -> str | None:
    """Who listens on ``port`` (any local address matching ``host``), e.g. ``pid 42 (python3)``.

    ``None`` when nothing visible listens there or the OS hides the owner
    (another user's process without privileges).
    """
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        # A listener on the wildcard address holds the port on every address.
        if conn.laddr.ip not in {host, f"::ffff:{host}", "0.0.0.0", "::"}:
            continue
        if conn.pid is None:
            return None
        try:
            proc = psutil.Process(conn.pid)
            return f"pid {conn.pid} ({proc.name()}: {' '.join(proc.cmdline())[:120]})"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return f"pid {conn.pid}"
    return None


def check_port_free(host: str, port: int) -> None:
    """Raise ``PortInUseError`` if something listens on ``host``:``port``.

    Binds a throwaway socket (``SO_REUSEADDR``, so a closed socket lingering in
    TIME_WAIT does not count as a holder).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise PortInUseError(host, port, port_holder(host, port)) from None


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


@dataclass(eq=False)
class _Managed:
    """Mutable bookkeeping of one backend (owned by the supervisor's event loop)."""

    name: str
    launch: Launch
    ready_timeout_s: float
    restart: bool
    log_path: Path
    record_path: Path
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    ready_at: float = 0.0
    restarts: int = 0
    failures: int = 0
    stopping: bool = False
    watcher: asyncio.Task[None] | None = None


class Supervisor:
    """Starts, watches, restarts and stops backend servers (see the module docstring).

    ``state_dir`` holds ``logs/`` and ``run/`` (created if missing);
    ``grace_s`` is the time between SIGTERM and SIGKILL; restarts back off
    from ``initial_backoff_s`` doubling to ``max_backoff_s``, and the backoff
    resets after ``healthy_reset_s`` seconds of healthy running; after
    ``max_restart_failures`` failed restarts in a row it gives up; ``on_event``
    (optional, called on the event loop, must not block) hears every
    ``BackendEvent``. All durations are seconds. Use from one event loop.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        grace_s: float = 10.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        healthy_reset_s: float = 60.0,
        max_restart_failures: int = 5,
        on_event: Callable[[BackendEvent], None] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.grace_s = grace_s
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.healthy_reset_s = healthy_reset_s
        self.max_restart_failures = max_restart_failures
        self._on_event = on_event
        self._logs = self.state_dir / "logs"
        self._run = self.state_dir / "run"
        self._logs.mkdir(parents=True, exist_ok=True)
        self._run.mkdir(parents=True, exist_ok=True)
        self._managed: dict[str, _Managed] = {}

    # -- queries -----------------------------------------------------------

    def backend(self, name: str) -> Backend | None:
        """The backend ``name`` as it is now, or ``None`` if it is not supervised."""
        m = self._managed.get(name)
        if m is None or m.proc is None:
            return None
        return Backend(
            name=name,
            pid=m.proc.pid,
            launch=m.launch,
            log_path=m.log_path,
            ready=m.ready,
            restarts=m.restarts,
        )

    def measured_bytes(self, name: str) -> int | None:
        """Resident memory (RSS, bytes) of backend ``name`` and its children, as measured now.

        ``None`` when it is not supervised or has no running process. Pages of
        memory-mapped weights count once they have been touched, so this is the
        figure to report next to a role's estimate.
        """
        m = self._managed.get(name)
        if m is None or m.proc is None or m.proc.returncode is not None:
            return None
        try:
            root = psutil.Process(m.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += proc.memory_info().rss
        return total

    def names(self) -> tuple[str, ...]:
        """The supervised backends' names, sorted."""
        return tuple(sorted(self._managed))

    def log_path(self, name: str) -> Path:
        """Where backend ``name``'s output goes: ``<state_dir>/logs/<name>.log``."""
        return self._logs / f"{name}.log"

    async def probe(self, name: str, probe: HttpProbe, *, timeout_s: float) -> ProbeResult:
        """Run ``probe`` (e.g. an adapter's generation probe) against backend ``name``.

        Raises:
            SupervisorError: ``name`` is not supervised.
        """
        m = self._managed.get(name)
        if m is None:
            raise SupervisorError(f"no backend named {name} is running")
        return await run_probe(m.launch.base_url, probe, timeout_s=timeout_s)

    # -- lifecycle ---------------------------------------------------------

    async def start(
        self,
        name: str,
        launch: Launch,
        *,
        ready_timeout_s: float | None = None,
        restart: bool = True,
    ) -> Backend:
        """Start backend ``name`` from ``launch`` and return once it is ready.

        ``name`` must be a plain token (it names the log and record files).
        ``ready_timeout_s`` defaults to ``ready_timeout_for(launch.weights_bytes)``.
        With ``restart`` true, a later crash is restarted with backoff.

        Raises:
            SupervisorError: ``name`` is not a plain token or is already supervised.
            PortInUseError: something already listens on the launch's port.
            BackendStartError: the process exited before it was ready (exit
                code and output tail in the error).
            BackendNotReadyError: not ready before the deadline; it was killed.
        """
        if not valid_token(name, 64):
            raise SupervisorError(f"backend name {name!r} is not a plain token")
        if name in self._managed:
            raise SupervisorError(f"backend {name} is already supervised; stop it first")
        timeout = (
            ready_timeout_s
            if ready_timeout_s is not None
            else ready_timeout_for(launch.weights_bytes)
        )
        m = _Managed(
            name=name,
            launch=launch,
            ready_timeout_s=timeout,
            restart=restart,
            log_path=self.log_path(name),
            record_path=self._run / f"{name}.json",
        )
        self._managed[name] = m
        try:
            await self._spawn_until_ready(m)
        except BaseException:
            self._managed.pop(name, None)
            raise
        m.watcher = asyncio.create_task(self._watch(m), name=f"rosterd-watch-{name}")
        snapshot = self.backend(name)
        assert snapshot is not None
        return snapshot

    async def stop(self, name: str) -> None:
        """Stop backend ``name``: SIGTERM to its group, ``grace_s``, then SIGKILL.

        Returns only after the process has exited (its memory is then free) and
        its record is removed. Stopping a name that is not supervised does nothing.
        """
        m = self._managed.get(name)
        if m is None:
            return
        m.stopping = True
        if m.watcher is not None:
            m.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await m.watcher
        pid = m.proc.pid if m.proc is not None else None
        if m.proc is not None:
            await self._terminate(m.proc)
        self._drop_record(m)
        self._managed.pop(name, None)
        self._emit(BackendEvent(name, "stopped", pid=pid))

    async def stop_all(self) -> None:
        """Stop every supervised backend (concurrently); returns once all have exited."""
        await asyncio.gather(*(self.stop(name) for name in list(self._managed)))

    async def reap_leftovers(self) -> list[int]:
        """Stop backends an earlier rosterd run left behind; return their pids.

        For each record in ``<state_dir>/run/`` not owned by this supervisor,
        the process is stopped (SIGTERM to its group, grace, SIGKILL) only if
        its pid, command line and start time all match the record and the
        rosterd that started it (``owner_pid``/``owner_create_time``) is no
        longer running; a live owner's record is left alone, and a record
        whose pid now belongs to another process is just removed.
        """
        reaped: list[int] = []
        for record_path in sorted(self._run.glob("*.json")):
            if record_path.stem in self._managed:
                continue
            record = _read_record(record_path)
            if record is not None and _owner_alive(record):
                continue  # another running rosterd's backend: never ours to stop
            if record is not None:
                proc = _matching_process(record)
                if proc is not None:
                    await _stop_foreign_group(proc, self.grace_s)
                    reaped.append(proc.pid)
            record_path.unlink(missing_ok=True)
        return reaped

    # -- internals ---------------------------------------------------------

    def _emit(self, event: BackendEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

    async def _spawn_until_ready(self, m: _Managed) -> None:
        """Spawn ``m``'s process and wait for readiness; on failure the process is gone."""
        launch = m.launch
        check_port_free(launch.host, launch.port)
        with m.log_path.open("ab") as log:
            log.write(
                f"--- rosterd: starting {m.name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: "
                f"{' '.join(launch.argv)}\n".encode()
            )
            log.flush()
            offset = log.tell()
            env = {**os.environ, **launch.env}
            proc = await asyncio.create_subprocess_exec(
                *launch.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                preexec_fn=_parent_death_preexec(os.getpid()),
            )
        m.proc = proc
        m.ready = False
        self._write_record(m, proc.pid)
        try:
            await self._wait_ready(m, proc, offset)
        except BaseException:
            await self._terminate(proc, grace_s=0.0)
            self._drop_record(m)
            raise
        m.ready = True
        m.ready_at = time.monotonic()
        self._emit(BackendEvent(m.name, "ready", pid=proc.pid))

    async def _wait_ready(self, m: _Managed, proc: asyncio.subprocess.Process, offset: int) -> None:
        def failed(
            message: str, exit_code: int | None, error: type[BackendStartError] = BackendStartError
        ) -> BackendStartError:
            return error(
                message,
                name=m.name,
                pid=proc.pid,
                exit_code=exit_code,
                output_tail=_tail(m.log_path, offset),
                log_path=m.log_path,
            )

        deadline = time.monotonic() + m.ready_timeout_s
        exited = asyncio.ensure_future(proc.wait())
        try:
            async with httpx.AsyncClient() as client:
                while True:
                    if m.stopping:  # stop() came before this process existed for it
                        raise failed(
                            f"backend {m.name} was stopped before it was ready", proc.returncode
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise failed(
                            f"backend {m.name} was not ready within {m.ready_timeout_s:g} s "
                            f"({m.launch.readiness.method} {m.launch.readiness.path}); killed it",
                            None,
                            BackendNotReadyError,
                        )
                    probing = asyncio.ensure_future(
                        run_probe(
                            m.launch.base_url,
                            m.launch.readiness,
                            timeout_s=max(0.5, min(remaining, 30.0)),
                            client=client,
                        )
                    )
                    await asyncio.wait({probing, exited}, return_when=asyncio.FIRST_COMPLETED)
                    if exited.done():
                        probing.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await probing
                        code = exited.result()
                        why = "was stopped" if m.stopping else describe_exit(code)
                        raise failed(f"backend {m.name} {why} before it was ready", code)
                    if probing.result().ok:
                        return
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(exited), READY_POLL_S)
        finally:
            if not exited.done():
                exited.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exited

    async def _watch(self, m: _Managed) -> None:
        """Wait for ``m``'s process to exit by itself; restart it with capped backoff."""
        while True:
            assert m.proc is not None
            code = await m.proc.wait()
            if m.stopping:
                return
            pid = m.proc.pid
            m.ready = False
            _kill_group(pid, signal.SIGKILL)  # children the backend left behind
            self._drop_record(m)
            self._emit(BackendEvent(m.name, "exited", pid=pid, exit_code=code))
            if not m.restart:
                self._managed.pop(m.name, None)
                return
            if m.ready_at and time.monotonic() - m.ready_at >= self.healthy_reset_s:
                m.failures = 0
            failed_tries = 0
            while True:
                delay = backoff_delay(m.failures, self.initial_backoff_s, self.max_backoff_s)
                m.failures += 1
                self._emit(BackendEvent(m.name, "restarting", pid=pid, delay_s=delay))
                await asyncio.sleep(delay)
                if m.stopping:
                    return
                try:
                    await self._spawn_until_ready(m)
                except SupervisorError as err:
                    m.ready_at = 0.0
                    failed_tries += 1
                    if failed_tries < self.max_restart_failures:
                        self._emit(BackendEvent(m.name, "restart_failed", detail=str(err)))
                        continue
                    # the failed try's process is gone: nothing runs any more
                    self._managed.pop(m.name, None)
                    detail = f"gave up after {failed_tries} failed restart(s): {err}"
                    self._emit(BackendEvent(m.name, "restart_failed", detail=detail, final=True))
                    return
                m.restarts += 1
                break

    async def _terminate(
        self, proc: asyncio.subprocess.Process, *, grace_s: float | None = None
    ) -> None:
        """SIGTERM the process group, wait ``grace_s``, SIGKILL it; return after exit."""
        grace = self.grace_s if grace_s is None else grace_s
        pgid = proc.pid  # start_new_session: the backend leads its own group
        if proc.returncode is None:
            _kill_group(pgid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            try:
                await asyncio.wait_for(proc.wait(), timeout=grace if grace > 0 else 5.0)
            except TimeoutError:
                _kill_group(pgid, signal.SIGKILL)
                await proc.wait()
        _kill_group(pgid, signal.SIGKILL)  # anything left in the group
        await _wait_group_gone(pgid, timeout_s=5.0)

    def _write_record(self, m: _Managed, pid: int) -> None:
        try:
            create_time = psutil.Process(pid).create_time()
        except psutil.NoSuchProcess:
            create_time = 0.0
        record = {
            "name": m.name,
            "pid": pid,
            "create_time": create_time,
            "cmdline": list(m.launch.argv),
            "owner_pid": os.getpid(),
            "owner_create_time": _process_create_time(os.getpid()),
        }
        tmp = m.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(m.record_path)

    def _drop_record(self, m: _Managed) -> None:
        m.record_path.unlink(missing_ok=True)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _wait_group_gone(pgid: int, *, timeout_s: float) -> None:
    """Wait until no process is left in group ``pgid`` (bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        await asyncio.sleep(0.05)


def _tail(path: Path, offset: int, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines written to ``path`` after byte ``offset``."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace").splitlines()
    return tuple(line.rstrip() for line in text[-lines:])


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
        return abs(proc.create_time() - float(created)) <= 0.05
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
        if abs(proc.create_time() - float(create_time)) > 0.05:
            return None
        if proc.cmdline() != cmdline:
            return None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return proc


async def _stop_foreign_group(proc: psutil.Process, grace_s: float) -> None:
    """Stop a leftover backend that is not our child: SIGTERM its group, grace, SIGKILL."""
    pgid = proc.pid
    try:
        is_leader = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return
    if is_leader:
        _kill_group(pgid, signal.SIGTERM)
    else:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    await asyncio.to_thread(psutil.wait_procs, [proc], timeout=grace_s)
    if is_leader:
        _kill_group(pgid, signal.SIGKILL)
        await _wait_group_gone(pgid, timeout_s=5.0)
    else:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
