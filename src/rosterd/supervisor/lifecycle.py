"""The ``Supervisor`` (DESIGN.md layer 5): one node's backends, from start to stop.

One ``Supervisor`` per node owns the backend servers that adapters describe
(``Launch``), built from this package's parts: ``process`` (spawn in a process
group that dies with rosterd, stop SIGTERM -> grace -> SIGKILL, RSS),
``probes`` (readiness and its deadline), ``ports`` (a held port is refused)
and ``run_records`` (the state folder's records and leftovers). This module
adds the lifecycle:

- **ready means ready**: ``start`` returns only once the launch's readiness
  probe passes. It gives up at once if the process exits (``BackendStartError``
  with the exit code and the last lines of its output) or when a deadline that
  grows with the weights' size passes (``BackendNotReadyError``, process killed).
- **logs**: each backend's stdout and stderr go to ``<state_dir>/logs/<name>.log``
  (appended, one header line per start; rotated by size, see ``logs``).
- **stop**: ``stop`` returns only after the process group has exited, so the
  backend's memory can be counted as free when it returns.
- **restarts**: a backend that exits by itself is restarted after an
  exponential backoff (``initial_backoff_s`` doubling up to ``max_backoff_s``),
  reset once a backend has run ``healthy_reset_s`` seconds; after
  ``max_restart_failures`` restarts in a row fail to become ready it gives up
  (a final ``restart_failed`` event) and the backend is no longer supervised.
- **restart on demand**: ``restart`` kills a backend that is alive but wedged
  (its generation probe failed) and starts it again at once, through the same
  path as a crash (``exited``, ``restarting``, ``ready`` events).

Library choice: asyncio (the scheduler and router are asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rosterd.adapters.base import HttpProbe, Launch, ProgressProbe
from rosterd.backends.copy_names import valid_backend_name
from rosterd.backends.values import BackendEvent, ProbeResult
from rosterd.errors import (
    BackendAlreadySupervisedError,
    BackendNameError,
    BackendNotSupervisedError,
    BackendStartError,
    SupervisorError,
)
from rosterd.supervisor.ports import check_port_free
from rosterd.supervisor.probes import ready_timeout_for, run_generation_probe, wait_ready
from rosterd.supervisor.process import kill_group, spawn_logged, terminate_group, tree_rss_bytes
from rosterd.supervisor.run_records import (
    drop_record,
    past_loads_s,
    reap_leftovers,
    record_load,
    record_path,
    write_record,
)

log = logging.getLogger("rosterd.supervisor")


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


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Seconds to wait before restart number ``failures + 1`` of a crash series.

    ``initial_s * 2**failures``, at most ``max_s``: 0.5, 1, 2, 4, ... capped.
    """
    return min(max_s, initial_s * (2.0 ** min(failures, 62)))


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
    restart_now: bool = False  # killed by ``restart``: start again at once, not a crash
    watcher: asyncio.Task[None] | None = None
    grace_s: float | None = None  # this backend's SIGTERM-to-SIGKILL time (None: the default)
    stop_requested: asyncio.Event | None = None  # set by stop: wakes a readiness poll at once


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
        figure to report next to a role's estimate (``tree_rss_bytes``).
        """
        m = self._managed.get(name)
        if m is None or m.proc is None or m.proc.returncode is not None:
            return None
        return tree_rss_bytes(m.proc.pid)

    def names(self) -> tuple[str, ...]:
        """The supervised backends' names, sorted."""
        return tuple(sorted(self._managed))

    def past_loads_s(self, name: str) -> tuple[float, ...]:
        """Backend ``name``'s past loads on this state folder, seconds from spawn to ready,
        oldest first, across runs (``run_records.past_loads_s``)."""
        return past_loads_s(self._run, name)

    def log_path(self, name: str) -> Path:
        """Where backend ``name``'s output goes: ``<state_dir>/logs/<name>.log``."""
        return self._logs / f"{name}.log"

    async def probe(
        self,
        name: str,
        probe: HttpProbe,
        *,
        timeout_s: float,
        progress: ProgressProbe | None = None,
        window_s: float = 45.0,
    ) -> ProbeResult:
        """Run ``probe`` (an adapter's generation probe) against backend ``name`` within
        ``timeout_s`` seconds; with no answer, a backend whose ``progress`` answer changes
        within ``window_s`` seconds is busy and passes (``run_generation_probe``).

        Raises:
            BackendNotSupervisedError: ``name`` is not supervised.
        """
        m = self._managed.get(name)
        if m is None:
            raise BackendNotSupervisedError(f"no backend named {name} is running")
        return await run_generation_probe(
            m.launch.base_url, probe, timeout_s=timeout_s, progress=progress, window_s=window_s
        )

    # -- lifecycle ---------------------------------------------------------

    async def start(
        self,
        name: str,
        launch: Launch,
        *,
        ready_timeout_s: float | None = None,
        restart: bool = True,
        grace_s: float | None = None,
    ) -> Backend:
        """Start backend ``name`` from ``launch`` and return once it is ready.

        ``name`` must be a plain token, or a copy's ``<role>@<node>``
        (``rosterd.backends.copy_names``): it names the log and record files.
        ``ready_timeout_s`` defaults to ``ready_timeout_for(launch.weights_bytes)``.
        With ``restart`` true, a later crash is restarted with backoff.
        ``grace_s``: this backend's SIGTERM-to-SIGKILL time when stopped (default:
        the supervisor's ``grace_s``).

        Raises:
            BackendNameError: ``name`` is neither a plain token nor a copy's name.
            BackendAlreadySupervisedError: ``name`` is already supervised.
            PortInUseError: something already listens on the launch's port.
            BackendStartError: the process exited before it was ready (exit
                code and output tail in the error).
            BackendNotReadyError: not ready before the deadline; it was killed.
            BackendStoppedError: ``stop(name)`` came before it was ready.
            OSError: the log cannot be written or the program cannot be executed.
        """
        if not valid_backend_name(name):
            raise BackendNameError(
                f"backend name {name!r} is not a plain token (nor a copy's <role>@<node>)"
            )
        if name in self._managed:
            raise BackendAlreadySupervisedError(
                f"backend {name} is already supervised; stop it first"
            )
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
            record_path=record_path(self._run, name),
            grace_s=grace_s,
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

    async def restart(self, name: str) -> None:
        """Kill backend ``name`` (SIGKILL to its group: it is wedged, so it would not honour
        SIGTERM) and start it again at once; returns once the kill was sent. The new
        process is reported as a crash restart is (``exited``, ``restarting``,
        ``ready`` or ``restart_failed``), without counting as a failure in the backoff.

        Raises:
            BackendNotSupervisedError: ``name`` is not supervised with restarts.
        """
        m = self._managed.get(name)
        if m is None or m.proc is None or not m.restart or m.stopping:
            raise BackendNotSupervisedError(f"no backend named {name} is running")
        if m.proc.returncode is not None:
            return  # it exited already: the watcher restarts it
        m.restart_now = True
        log.warning("backend %s (pid %d): killing it to restart it", name, m.proc.pid)
        kill_group(m.proc.pid, signal.SIGKILL)

    async def stop(self, name: str) -> None:
        """Stop backend ``name``: SIGTERM to its group, its grace (the ``grace_s`` it was
        started with, else the supervisor's), then SIGKILL; each step is logged.

        Returns only after the process has exited (its memory is then free) and
        its record is removed. Stopping a name that is not supervised does nothing.
        A backend still starting is woken at once (its readiness poll ends).
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
        if m.stop_requested is not None:
            m.stop_requested.set()
        if m.proc is not None:
            grace = self.grace_s if m.grace_s is None else m.grace_s
            if m.grace_s is None and m.launch.stop_grace_s is not None:
                grace = max(grace, m.launch.stop_grace_s)  # the backend's own least grace
            await terminate_group(m.proc, grace_s=grace, name=name, why=m.launch.sigkill_note)
        drop_record(m.record_path)
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
        return await reap_leftovers(self._run, keep=set(self._managed), grace_s=self.grace_s)

    # -- internals ---------------------------------------------------------

    def _emit(self, event: BackendEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

    async def _spawn_until_ready(self, m: _Managed) -> None:
        """Spawn ``m``'s process and wait for readiness; on failure the process is gone."""
        launch = m.launch
        check_port_free(launch.host, launch.port)
        spawned_at = time.monotonic()
        proc, offset = await spawn_logged(m.name, launch.argv, launch.env, m.log_path)
        m.proc = proc
        m.ready = False
        if m.stop_requested is None:
            m.stop_requested = asyncio.Event()
        write_record(m.record_path, name=m.name, pid=proc.pid, argv=launch.argv)
        try:
            await wait_ready(
                m.name,
                launch,
                proc,
                timeout_s=m.ready_timeout_s,
                log_path=m.log_path,
                log_offset=offset,
                stopping=lambda: m.stopping,
                stop_requested=m.stop_requested,
            )
        except BaseException as exc:
            await terminate_group(proc, grace_s=0.0)
            drop_record(m.record_path)
            if isinstance(exc, BackendStartError):
                # It exited at once: if another process took the port after the check
                # above, that is why (a bind race), and the caller may pick another.
                check_port_free(launch.host, launch.port)
            raise
        m.ready = True
        m.ready_at = time.monotonic()
        try:
            record_load(self._run, m.name, m.ready_at - spawned_at)
        except OSError as exc:  # a full disk costs the next load's estimate, not this load
            log.warning("cannot record the load time of %s: %s", m.name, exc)
        self._emit(BackendEvent(m.name, "ready", pid=proc.pid))

    async def _watch(self, m: _Managed) -> None:
        """Wait for ``m``'s process to exit by itself; restart it with capped backoff."""
        while True:
            assert m.proc is not None
            code = await m.proc.wait()
            if m.stopping:
                return
            pid = m.proc.pid
            m.ready = False
            kill_group(pid, signal.SIGKILL)  # children the backend left behind
            drop_record(m.record_path)
            self._emit(BackendEvent(m.name, "exited", pid=pid, exit_code=code))
            if not m.restart:
                self._managed.pop(m.name, None)
                return
            if m.ready_at and time.monotonic() - m.ready_at >= self.healthy_reset_s:
                m.failures = 0
            failed_tries = 0
            while True:
                if m.restart_now:  # asked for: no crash, no backoff
                    m.restart_now, delay = False, 0.0
                else:
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
