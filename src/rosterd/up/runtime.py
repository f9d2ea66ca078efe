"""The runtime of ``rosterd up`` as a plain function (layer 8): read the files, take the state
folder, join Ray if asked, start the fleet scheduler with the first configuration, serve
the router until stopped, then drain and stop every backend.

:func:`run_up` is the whole process (SIGINT and SIGTERM stop it, SIGHUP reloads);
:class:`UpRun` is one run inside a running event loop, stopped by its own handle
(:meth:`UpRun.stop`), which is how tests run it without a subprocess. Both take an
:class:`~rosterd.up.options.UpOptions` value and a
:class:`~rosterd.up.report.Reporter`, through which everything the run says goes
(``rosterd.cli`` implements it; nothing here prints).

What the fleet serves is the fleet scheduler's (``rosterd.fleet_scheduler``): the
start is its first change, a reload its next, a node lost or back on Ray another;
this module only reads what a change needs (:mod:`rosterd.up.config`) and hands it
over. uvicorn serves the ASGI router in rosterd's own event loop (so the schedulers,
the supervisor and the router share one loop); its signal capture is replaced by
rosterd's, so Ctrl-C drains and stops the backends before the process exits, and a
second Ctrl-C cuts the drain (the backends still stop: SIGTERM, ``--grace``, SIGKILL).

Errors: every failure a user can act on is a :class:`~rosterd.errors.RosterdError`
(a bad roster, overlay or fleet, a port in use, a locked or unusable state folder,
no node of the fleet on this machine); the CLI edge gives it exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rosterd.backends.node_host import NodeHost
from rosterd.errors import (
    EndedBeforeServingError,
    NothingToServeError,
    OptionError,
    ReloadRefusedError,
    RosterdError,
    StateDirError,
    SystemRefusedError,
)
from rosterd.fleet_scheduler.effects import Level
from rosterd.fleet_scheduler.loop import FleetLoop
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import Connection, ServedConfig
from rosterd.fleet_scheduler.views import fleet_status, node_views
from rosterd.metrics import RosterdMetrics
from rosterd.ray_cluster import RayCluster, disconnect, join_async
from rosterd.roster import ImportedRoster
from rosterd.router import create_app
from rosterd.router.auth import Keys
from rosterd.router.streams import LiveStreams
from rosterd.supervisor import BackendEvent, default_state_dir
from rosterd.up import config as up_config
from rosterd.up.chat_templates import missing_template_warnings
from rosterd.up.files import ConfigFiles
from rosterd.up.fleet_effects import UpFleetEffects
from rosterd.up.key_files import open_usage, read_key_ring
from rosterd.up.listen import (
    NoSignalServer,
    bind_listener,
    is_loopback_host,
    open_files_wanted,
    raise_open_files_limit,
    server_config,
)
from rosterd.up.options import UpOptions
from rosterd.up.report import Reporter, open_listener_text, serving_text
from rosterd.up.signals import RunSignals
from rosterd.usage import UsageStore

log = logging.getLogger("rosterd.reload")

#: What other modules import from here.
__all__ = ["UpOptions", "UpRun", "open_files_wanted", "raise_open_files_limit", "run_up"]


def run_up(options: UpOptions, reporter: Reporter) -> None:
    """Serve ``options`` in this process until SIGINT or SIGTERM, then stop every backend;
    ``reporter`` hears what the run says.

    Raises:
        RosterdError: bad input or an unusable port or state folder (see the module).
    """
    run = UpRun(options, reporter, stop_on_signals=True)
    # rosterd's own SIGINT handler from the start, so that asyncio.Runner sets none: its
    # handler cancels the main task, and a Ctrl-C during the plan then landed once
    # serving had begun, as a CancelledError through uvicorn's lifespan and exit 130.
    previous = signal.signal(signal.SIGINT, run.signals.interrupted)
    try:
        with asyncio.Runner() as runner:
            runner.run(run.run())
    finally:
        signal.signal(signal.SIGINT, previous)


class UpRun:
    """One ``rosterd up`` run in the running event loop: ``await run()`` serves until
    :meth:`stop`; :meth:`serving` waits until it answers HTTP.

    ``stop_on_signals``: SIGINT and SIGTERM call :meth:`stop` once the run took its
    state folder (only in the main thread, and the process's own run: tests leave it off);
    :mod:`rosterd.up.signals` says what each signal does when.

    :meth:`run` reads the files and takes the state folder; ``_serve`` is the run's three
    stages: ``_start_up`` (the fleet scheduler, the first plan, the listener, the
    router), ``_serve_until_stopped`` (serving, then the drain) and ``_shut_down``
    (every backend stopped, whatever happened before).
    """

    def __init__(self, options: UpOptions, reporter: Reporter, *, stop_on_signals: bool = False):
        self.options = options
        self.reporter = reporter
        self.stop_on_signals = stop_on_signals
        #: ``http://HOST:PORT`` once serving, else ``None``.
        self.url: str | None = None
        #: The run's files and what came of their reloads, once it serves.
        self.files: ConfigFiles | None = None
        self._stop = asyncio.Event()
        self._serving = asyncio.Event()
        self._ended = asyncio.Event()
        self._server: NoSignalServer | None = None
        self._fleet: FleetLoop | None = None
        self._effects: UpFleetEffects | None = None
        self._cluster: RayCluster | None = None
        self._state_dir: Path | None = None
        self._stopping_now = False
        self._keys = Keys()
        #: Who handles SIGINT, SIGTERM and SIGHUP at each stage of the run.
        self.signals = RunSignals(self, reporter, grace_s=options.grace_s, enabled=stop_on_signals)

    @property
    def stop_asked(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    @property
    def stopping_now(self) -> bool:
        """Whether :meth:`stop_now` was called."""
        return self._stopping_now

    def stop(self) -> None:
        """Stop serving: in-flight requests get ``limits.drain_s``, then every backend stops.
        Safe to call at any time, and more than once."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True

    def stop_now(self) -> None:
        """Stop at once: no drain (requests in flight are cut), every backend stops
        (SIGTERM, ``--grace``, SIGKILL)."""
        self._stopping_now = True
        self.stop()
        # The router's graceful shutdown ends with the requests it waits for, which the
        # schedulers now cut (uvicorn's force_exit would skip its lifespan's end).
        if self._effects is not None:
            self._effects.scheduler.stop_now()

    async def serving(self) -> str:
        """Wait until the router listens; its URL (``http://HOST:PORT``).

        Raises:
            RosterdError: the run ended before it served (its own error is raised by
                :meth:`run`).
        """
        waits = [asyncio.ensure_future(e.wait()) for e in (self._serving, self._ended)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.url is None:
            raise EndedBeforeServingError("rosterd up ended before it served")
        return self.url

    async def run(self) -> None:
        """Read, take the state folder, start and serve until :meth:`stop`; then drain and
        stop every backend.

        Raises:
            RosterdError: see the module docstring; nothing was left running.
        """
        try:
            await self._run()
        finally:
            self._ended.set()

    async def _run(self) -> None:
        options = self.options
        if not 1 <= options.port <= 65535:
            raise OptionError(f"--port {options.port} is not a usable port (1..65535)")
        roster, fleet = up_config.read_files(options)
        self._keys.replace(read_key_ring(options))
        for warning in roster.warnings:  # the import's notes, as `rosterd roster import` shows
            self.reporter.say(Level.WARNING, warning)
        state_dir = self._state_dir = options.state_dir or default_state_dir()
        host = NodeHost(
            state_dir,
            grace_s=options.grace_s,
            on_event=self._backend_event,
            auto_ports=options.auto_backend_ports,
            kv_disk_bytes=options.kv_disk_bytes,
            progress_window_s=options.limits.probe_busy_window_s,
            names_copies=True,  # one supervisor for every node of this machine
        )
        try:
            # Held for the whole run: a second `up` on this folder would otherwise take
            # this one's live backends for leftovers of an earlier run.
            host.lock()
        except OSError as exc:
            raise StateDirError(_os_message(exc)) from None
        try:
            config = up_config.gather(roster, fleet, state_dir)
            for warning in missing_template_warnings(config):
                self.reporter.say(Level.WARNING, warning)
            if options.ray_address is not None:
                self._cluster = await self._join(options.ray_address)
            connections = up_config.connections(fleet, self._cluster)
            if not self._keys.ring.required and not is_loopback_host(options.host):
                self.reporter.say(Level.WARNING, open_listener_text(options.host))
            await self._serve(config, connections, host)
        except OSError as exc:  # e.g. the state folder's logs cannot be created
            raise SystemRefusedError(_os_message(exc)) from None
        finally:
            try:
                await host.close()  # every backend of this machine stopped; the lock released
            finally:
                if self._cluster is not None:
                    disconnect()  # after the agents ended: leave the cluster

    async def _serve(
        self, config: ServedConfig, connections: Mapping[str, Connection], host: NodeHost
    ) -> None:
        """Start up, serve until stopped, shut down (whatever happened before)."""
        options = self.options
        assert self._state_dir is not None
        effects = self._effects = UpFleetEffects(
            options,
            reporter=self.reporter,
            metrics=RosterdMetrics(),
            host=host,
            cluster=self._cluster,
            state_dir=self._state_dir,
            after_plan=self.signals.again,
            on_lost=self._node_lost,
        )
        machine = FleetMachine(
            ray_address=options.ray_address,
            router_port=None if options.auto_backend_ports else options.port,
            shared_flavors=up_config.shared_flavors(),
            warm_up=options.warm_up,
        )
        self._fleet = FleetLoop(machine, effects)
        self.files = ConfigFiles(options)
        serving = _Serving(machine, effects, self._fleet, self.files, open_usage(self._state_dir))
        try:
            await self._start_up(serving, config, connections, host)
            if not self._stop.is_set():
                await self._serve_until_stopped(serving)
        finally:
            await self._shut_down(serving)

    async def _start_up(
        self,
        serving: _Serving,
        config: ServedConfig,
        connections: Mapping[str, Connection],
        host: NodeHost,
    ) -> None:
        """Reap an earlier run's leftovers, start the schedulers, apply the first plan, bind
        the listener, take the signals and build the router and its HTTP server.

        Raises:
            KeyboardInterrupt: a Ctrl-C came before the run took its signals.
        """
        options, effects, fleet = self.options, serving.effects, serving.fleet
        reaped = await host.open()
        if reaped:
            said = f"stopped {len(reaped)} backend(s) left by an earlier run: {list(reaped)}"
            self.reporter.say(Level.INFO, said)
        effects.scheduler.start()
        fleet.start()
        # The plan is shown first; no backend starts before the router serves (the
        # warm-up waits for it), so a port in use below stops the run with nothing up.
        await fleet.change(config, connections, start=True)
        wanted = open_files_wanted(options.limits, len(config.roster.specs))
        raised = raise_open_files_limit(wanted)
        if raised is not None:
            self.reporter.say(Level.INFO, raised)
        serving.sock = bind_listener(options.host, options.port)
        self.signals.take()
        if self.signals.interrupt_noted:  # Ctrl-C before the run took its signals
            self.reporter.say(Level.ERROR, "interrupted before serving; nothing was started")
            raise KeyboardInterrupt
        if self._cluster is not None:
            effects.watch_cluster(fleet.cluster_seen)
        machine, files = serving.machine, serving.files
        router = create_app(
            effects.scheduler,
            effects.routes,
            config=options.router_config(),
            metrics=effects.metrics,
            status_extra=lambda: {
                **fleet_status(machine),
                **effects.devices.replicas(),
                "config": files.status(),
            },
            reload=self.reload,
            log_path=host.supervisor.log_path,
            copy_logs=effects.copy_logs,
            streams=serving.streams,
            node_views=(lambda: node_views(machine)) if self._cluster is not None else None,
            keys=self._keys,
            usage=serving.usage,
        )
        self._server = NoSignalServer(server_config(router, options))

    async def _serve_until_stopped(self, serving: _Serving) -> None:
        """Serve HTTP until :meth:`stop`, then drain: the router's graceful shutdown beside
        the schedulers' (waiting requests fail at once, a load under way is aborted)."""
        options, effects, server = self.options, serving.effects, self._server
        assert server is not None
        assert serving.sock is not None
        serving.http = asyncio.create_task(
            server.serve(sockets=[serving.sock]), name="rosterd-http"
        )
        shown_host = f"[{options.host}]" if ":" in options.host else options.host
        self.url = f"http://{shown_host}:{options.port}"
        keyed = self._keys.ring.required
        self.reporter.say(Level.INFO, serving_text(effects.scheduler.roles, self.url, keyed=keyed))
        self._serving.set()
        effects.serving_started()
        if options.watch:
            watch = serving.files.watch(self.reload)
            serving.background.append(asyncio.create_task(watch, name="rosterd-watch"))
        await self._stop.wait()
        self.reporter.say(Level.INFO, f"stopping: {self._stopping_what()} …")
        serving.streams.close()
        for task in serving.background:
            task.cancel()
        server.should_exit = True
        # The schedulers' shutdown runs beside uvicorn's: waiting requests fail at once
        # and a load under way is aborted, instead of holding the HTTP drain until a
        # readiness poll reached its own deadline.
        stopping = asyncio.create_task(effects.scheduler.shutdown(), name="rosterd-shutdown")
        if self._stopping_now:
            effects.scheduler.stop_now()
        await serving.http
        await stopping

    async def _shut_down(self, serving: _Serving) -> None:
        """Whatever happened before: the HTTP server ended, the fleet and the schedulers
        closed (every backend stopped), the listener closed, the signals given back."""
        for task in serving.background:
            task.cancel()
        if serving.http is not None and not serving.http.done():
            # Left early (cancelled, or an error): uvicorn ends its lifespan here, not as
            # a cancelled task once the event loop closes (a traceback per task).
            if self._server is not None:
                self._server.should_exit = self._server.force_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await serving.http
        await serving.fleet.close()
        await serving.effects.scheduler.shutdown()
        await serving.effects.close()
        await asyncio.to_thread(serving.usage.close)  # what was counted, written
        if serving.sock is not None:
            serving.sock.close()
        # Not Python's default (KeyboardInterrupt in the last clean-up): this run's own
        # SIGINT handler, which says it is stopping.
        self.signals.give_back()
        self.reporter.say(Level.INFO, "rosterd stopped; no backend left running")

    async def reload(self, force: bool = False) -> Mapping[str, object]:
        """Re-read the files and serve them if the fleet scheduler takes them; what changed
        (``PlanChange.as_json`` with ``why`` and ``warnings``). ``force``: apply a
        configuration that serves no role too.

        Raises:
            RosterdError: the files do not read (file, line and column named), or the
                configuration is refused (``ReloadRefusedError``); nothing changed.
        """
        fleet, files, state_dir = self._fleet, self.files, self._state_dir
        if fleet is None or files is None or state_dir is None:
            raise EndedBeforeServingError("rosterd up is not serving yet")
        files.reading()
        roster: ImportedRoster | None = None
        try:
            roster, fleet_file = up_config.read_files(self.options)
            ring = read_key_ring(self.options)
            config = await asyncio.to_thread(up_config.gather, roster, fleet_file, state_dir)
            conns = await asyncio.to_thread(up_config.connections, fleet_file, self._cluster)
            change = await fleet.change(config, conns, force=force)
        except RosterdError as exc:
            files.refused(exc, time.time(), roster)
            if not isinstance(exc, ReloadRefusedError | NothingToServeError):  # said already
                log.error("reload refused, the running configuration stays: %s", exc)
            raise
        self._keys.replace(ring)  # with the rest of the files, or not at all
        files.applied(change, time.time())
        return change

    async def try_reload(self) -> None:
        """:meth:`reload`, its refusal only logged and kept for ``/status`` (SIGHUP)."""
        with contextlib.suppress(RosterdError):
            await self.reload()

    def _backend_event(self, event: BackendEvent) -> None:
        if self._effects is not None:
            self._effects.backend_event(event)

    def _node_lost(self, node: str, why: str) -> None:
        if self._fleet is not None:
            self._fleet.node_lost(node, why)

    async def _join(self, address: str) -> RayCluster:
        """Join the Ray cluster at ``address`` within ``--ray-join-timeout``; SIGINT and
        SIGTERM end the join at once (exit 130, nothing started).

        Raises:
            ClusterConnectError: it cannot be joined (see ``join_async``).
            KeyboardInterrupt: a signal came first (or a Ctrl-C already had).
        """
        joining = asyncio.ensure_future(
            join_async(address, timeout_s=self.options.ray_join_timeout_s)
        )
        cut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self.signals.cutting(cut):
            await asyncio.wait((joining, cut), return_when=asyncio.FIRST_COMPLETED)
        if joining.done():
            return joining.result()
        joining.cancel()  # Ray's join goes on in its daemon thread, unused, until the exit
        with contextlib.suppress(asyncio.CancelledError, RosterdError):
            await joining
        self.reporter.say(
            Level.ERROR,
            f"interrupted while joining the Ray cluster at {address}; nothing was started",
        )
        raise KeyboardInterrupt

    def _stopping_what(self) -> str:
        return (
            f"draining requests (up to --drain {self.options.limits.drain_s:g} s), "
            "then stopping every backend; Ctrl-C again to stop now"
        )


@dataclass
class _Serving:
    """What the stages of one run's serving share: the fleet's owner and its effects, the
    run's files, where each key's use is kept, the listener, the endless responses, the HTTP
    server's task and the background tasks (the files' watch)."""

    machine: FleetMachine
    effects: UpFleetEffects
    fleet: FleetLoop
    files: ConfigFiles
    usage: UsageStore
    sock: socket.socket | None = None
    streams: LiveStreams = field(default_factory=LiveStreams)
    http: asyncio.Task[None] | None = None
    background: list[asyncio.Task[None]] = field(default_factory=list)


def _os_message(exc: OSError) -> str:
    """``strerror: filename`` of an OSError, as the operator can act on it."""
    return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
