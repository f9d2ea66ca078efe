"""The runtime of ``rosterd up`` as a plain function (layer 8): import, plan, check the
weights, start the supervisor, the scheduler and the router, serve until stopped, then
drain and stop every backend.

:func:`run_up` is the whole process (SIGINT and SIGTERM stop it);
:class:`UpRun` is one run inside a running event loop, stopped by its own
handle (:meth:`UpRun.stop`), which is how tests run it without a subprocess or
Typer. Both take an :class:`~rosterd.up.options.UpOptions` value (re-exported
here); ``rosterd up`` only parses its options into one (:mod:`rosterd.cli.serve_cmd`).

It lives in the CLI layer, not beside the router, because it prints: the plan,
each role it cannot serve, backend crashes and restarts, "serving", "stopped"
(DESIGN.md: only the CLI prints), on the consoles it is given.

uvicorn serves the ASGI router in rosterd's own event loop (so the scheduler,
supervisor and router share one loop); its signal capture is replaced by
rosterd's, so Ctrl-C drains and stops the backends before the process exits
(the socket, that server and the open-files limit: :mod:`rosterd.up.listen`;
backend events printed and the warm-up: :mod:`rosterd.up.progress`).

Errors: every failure a user can act on is a :class:`~rosterd.errors.RosterdError`
(a bad roster, overlay or fleet, a port in use, a locked or unusable state
folder, no node of the fleet on this machine); the CLI edge gives it exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from rich.console import Console
from rich.text import Text

from rosterd.backends.interface import PeakSource
from rosterd.backends.local import SupervisorBackends
from rosterd.errors import (
    EndedBeforeServingError,
    NothingToServeError,
    OptionError,
    StateDirError,
    SystemRefusedError,
)
from rosterd.fleet import Fleet, Node
from rosterd.memory.gathering import RosterMemory, gather_memory
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import PeakRecorder, follow_peaks
from rosterd.metrics import RosterdMetrics
from rosterd.placement import Plan, plan
from rosterd.roster import ImportedRoster
from rosterd.router import RouterConfig, RouteTable, create_app
from rosterd.router.streams import LiveStreams
from rosterd.scheduler.fleet import NodeConfig, Scheduler
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeConcurrency
from rosterd.supervisor import BackendEvent, Supervisor, default_state_dir, lock_state_dir
from rosterd.up.http_protocol import HEADER_TIMEOUT_S, bounded_http_protocol
from rosterd.up.listen import (
    LISTEN_BACKLOG,
    NoSignalServer,
    bind_listener,
    open_files_wanted,
    raise_open_files_limit,
)
from rosterd.up.options import UpOptions
from rosterd.up.plan_view import (
    check_ports,
    first_by_role,
    is_local_address,
    is_loopback_host,
    print_plan,
    role_routes,
    unserved_reasons,
)
from rosterd.up.progress import (
    added_roles,
    print_backend_event,
    say_remote_nodes,
    warm_up,
    warn_open_listener,
)
from rosterd.up.reload import (
    ConfigReloader,
    Served,
    plan_config,
    read_config,
    served_config,
    status_extra,
)

if TYPE_CHECKING:
    from rosterd.up.ray_fleet import UpFleet

#: What other modules import from here (``UpOptions`` and the open-files sizing moved).
__all__ = ["UpOptions", "UpRun", "open_files_wanted", "raise_open_files_limit", "run_up"]


def run_up(options: UpOptions, *, out: Console, err: Console) -> None:
    """Serve ``options`` in this process until SIGINT or SIGTERM, then stop every backend.

    ``out`` gets the plan and progress, ``err`` the warnings.

    Raises:
        RosterdError: bad input or an unusable port or state folder (see the module).
    """
    run = UpRun(options, out=out, err=err, stop_on_signals=True)
    # rosterd's own SIGINT handler from the start, so that asyncio.Runner sets none: its
    # handler cancels the main task, and a Ctrl-C during the plan then landed once
    # serving had begun, as a CancelledError through uvicorn's lifespan and exit 130.
    previous = signal.signal(signal.SIGINT, run.interrupted)
    try:
        with asyncio.Runner() as runner:
            runner.run(run.run())
    finally:
        signal.signal(signal.SIGINT, previous)


class UpRun:
    """One ``rosterd up`` run in the running event loop: ``await run()`` serves until
    :meth:`stop`; :meth:`serving` waits until it answers HTTP.

    ``stop_on_signals``: SIGINT and SIGTERM call :meth:`stop` once the plan is made
    (only in the main thread, and the process's own run: tests leave it off).
    """

    def __init__(
        self, options: UpOptions, *, out: Console, err: Console, stop_on_signals: bool = False
    ) -> None:
        self.options = options
        self.stop_on_signals = stop_on_signals
        self.out = out
        self.err = err
        #: ``http://HOST:PORT`` once serving, else ``None``.
        self.url: str | None = None
        self._stop = asyncio.Event()
        self._serving = asyncio.Event()
        self._ended = asyncio.Event()
        self._server: NoSignalServer | None = None
        #: The reload of this run, once it serves.
        self.reloader: ConfigReloader | None = None
        self._memory_warned: set[str] = set()
        # Set once the plan is made and the loop handles SIGINT: from then on no Ctrl-C
        # ends the run early (every backend must be stopped).
        self._signals_taken = False
        self._interrupted = False  # a Ctrl-C before that: see interrupted()
        self._reloads: set[asyncio.Task[None]] = set()
        # node -> where its backends' peaks are measured (this machine's supervisor,
        # or a node agent on its node)
        self._backends: dict[str, PeakSource] = {}

    def interrupted(self, signum: int, frame: object) -> None:
        """The SIGINT handler of the whole process (``signal.signal``), outside the spans
        where the event loop handles signals itself (:meth:`_set_signal_handlers`).

        Before the plan is made it only notes the interrupt: the run ends (exit 130,
        one line) once the plan is made, before anything starts. Not raising here
        keeps a Ctrl-C from landing inside an import or the solver. After the plan (the
        last clean-up, once the loop's handlers are gone) it says that rosterd is
        stopping and changes nothing.
        """
        if self._signals_taken:
            self._say_stopping()
        else:
            self._interrupted = True

    def stop(self) -> None:
        """Stop serving: in-flight requests get ``limits.drain_s``, then every backend stops.
        Safe to call at any time, and more than once."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True

    async def serving(self) -> str:
        """Wait until the router listens; its URL (``http://HOST:PORT``).

        Raises:
            EndedBeforeServingError: the run ended before it served (its own error is
                raised by :meth:`run`).
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
        """Import, plan, start and serve until :meth:`stop`; then drain and stop every backend.

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
        roster, fleet = read_config(options)
        for warning in roster.warnings:  # the import's notes, as `rosterd roster import` shows
            self.err.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
        state_dir = options.state_dir or default_state_dir()
        try:
            # Held for the whole run: a second `up` on this folder would otherwise
            # take this one's live backends for leftovers of an earlier run. Taken
            # before the plan is printed, so a refused second `up` prints only why.
            state_lock = lock_state_dir(state_dir)
        except OSError as exc:
            raise StateDirError(_os_message(exc)) from None
        ray: UpFleet | None = None
        try:
            # Every role counts the largest of ram_gb, its estimate and its last measured peak.
            memory = gather_memory(roster, fleet, state_dir)
            self._warn_memory(memory)
            specs = memory.planning_specs(s.spec for s in roster.specs)
            result = plan(specs, fleet, memory_notes=memory.reason_notes())
            if not options.auto_backend_ports:  # the roster's ports are used: may they be?
                result = check_ports(result, roster, fleet, router_port=options.port)
            if options.ray_address is None:
                local_nodes = [n for n in fleet.nodes if is_local_address(n.address)]
                print_plan(
                    result, fleet, roster, [n.name for n in local_nodes], self.out, memory=memory
                )
                say_remote_nodes(fleet, local_nodes, self.out)
            else:
                # Joining blocks for a moment; it comes before any signal handler is set.
                from rosterd.up.ray_fleet import UpFleet

                ray = UpFleet.join(options.ray_address, fleet, self.out)
                result = ray.plan(specs, result, memory_notes=memory.reason_notes()).plan
                local_nodes = ray.local_nodes()
                where = ray.served.where if ray.served else None
                local = (n.name for n in local_nodes)
                print_plan(result, fleet, roster, local, self.out, where=where, memory=memory)
                ray.print_not_connected()
            if not local_nodes and ray is None:
                raise NothingToServeError("no node of the fleet is this machine; nothing to serve")
            if not options.api_keys and not is_loopback_host(options.host):
                warn_open_listener(options.host, self.err)
            await self._serve(roster, fleet, result, local_nodes, state_dir, ray, memory)
        except OSError as exc:  # e.g. the state folder's logs cannot be created
            raise SystemRefusedError(_os_message(exc)) from None
        finally:
            try:
                if ray is not None:
                    await ray.close()  # after the schedulers stopped: ends the agents, leaves Ray
            finally:
                state_lock.release()

    async def _serve(
        self,
        roster: ImportedRoster,
        fleet: Fleet,
        result: Plan,
        local_nodes: list[Node],
        state_dir: Path,
        ray: UpFleet | None,
        memory: RosterMemory,
    ) -> None:
        options = self.options
        raised = raise_open_files_limit(open_files_wanted(options.limits, len(result.placements)))
        if raised is not None:
            self.out.print(raised)
        sock = bind_listener(options.host, options.port)
        loop = asyncio.get_running_loop()
        if self.stop_on_signals:
            # Only now, after the plan (the solver is told not to take SIGINT, and is
            # set after each plan all the same, so no library's handler outlives it).
            self._set_signal_handlers()
            if self._interrupted:  # Ctrl-C before the plan was made: stop before any start
                sock.close()
                self.err.print("interrupted before serving; nothing was started")
                raise KeyboardInterrupt
        scheduler: Scheduler | None = None

        def on_backend_event(event: BackendEvent) -> None:
            print_backend_event(self.out, event)
            if scheduler is not None:  # crashes and restarts change what the scheduler serves
                scheduler.backend_event(event)

        supervisor = Supervisor(state_dir, grace_s=options.grace_s, on_event=on_backend_event)
        background: list[asyncio.Task[None]] = []
        serving: asyncio.Task[None] | None = None
        recorders: list[PeakRecorder] = []
        try:
            reaped = await supervisor.reap_leftovers()
            if reaped:
                self.out.print(f"stopped {len(reaped)} backend(s) left by an earlier run: {reaped}")
            metrics = RosterdMetrics()

            fleet_nodes = {n.name: n for n in fleet.nodes}

            def new_node(config: NodeConfig) -> NodeScheduler:
                node = fleet_nodes.get(config.name)
                return NodeScheduler(
                    config.name,
                    config.capacity_bytes,
                    config.specs,
                    config.backends,
                    limits=options.limits,
                    metrics=metrics,
                    unavailable=config.unavailable,
                    backend_events=config.backend_events,
                    # a node agent's pids are processes of its node, not of this machine
                    pids_are_local=isinstance(config.backends, SupervisorBackends),
                    concurrency=config.concurrency
                    or NodeConcurrency(
                        node.max_concurrency if node is not None else None, memory.slots()
                    ),
                    memory=config.memory,
                )

            async def serve_config(roster: ImportedRoster, fleet: Fleet, previous: Plan) -> Served:
                # The files changed: every role's figures are gathered again.
                memory = await asyncio.to_thread(gather_memory, roster, fleet, state_dir)
                self._warn_memory(memory)
                after_plan = self._set_signal_handlers if self.stop_on_signals else lambda: None
                if ray is not None:
                    from rosterd.up.ray_reload import serve_fleet_config

                    return await serve_fleet_config(
                        ray,
                        roster,
                        fleet,
                        previous,
                        memory,
                        options=options,
                        supervisor=supervisor,
                        on_event=on_backend_event,
                        state_root=str(state_dir) if options.state_dir is not None else None,
                        out=self.out,
                        after_plan=after_plan,
                    )
                result = await plan_config(
                    roster, fleet, previous, options, memory, after_plan=after_plan
                )
                return served_config(
                    roster,
                    fleet,
                    result,
                    supervisor,
                    auto_ports=options.auto_backend_ports,
                    out=self.out,
                    memory=memory,
                )

            served = served_config(
                roster,
                fleet,
                result,
                supervisor,
                auto_ports=options.auto_backend_ports,
                out=self.out,
                local_nodes=local_nodes if ray is not None else None,
                memory=memory,
            )
            nodes = {name: new_node(c) for name, c in served.nodes.items()}
            if ray is not None:
                by_role = first_by_role(roster)
                nodes |= await ray.node_schedulers(
                    {role: s.spec for role, s in by_role.items()},
                    repos={role: s.repo or None for role, s in by_role.items()},
                    on_event=on_backend_event,
                    options=options,
                    metrics=metrics,
                    state_root=str(state_dir) if options.state_dir is not None else None,
                    memory=memory,
                    model_names={role: s.name for role, s in by_role.items()},
                )
            self._take_peak_sources(served, ray)
            recorders = self._follow_peaks(nodes, [], served.fingerprints(), state_dir)
            scheduler = Scheduler(nodes, new_node=new_node)
            routes = RouteTable(
                role_routes(scheduler.roles, roster, result),
                unserved_reasons(result, roster, nodes),
            )
            running = scheduler

            def warm_up_added(served: Served, change: Mapping[str, object]) -> None:
                # The new backends report the peaks of what they start, under the new
                # settings' fingerprints; a node the reload added gets its recorder.
                self._take_peak_sources(served, ray)
                recorders.extend(
                    self._follow_peaks(running.nodes, recorders, served.fingerprints(), state_dir)
                )
                if options.warm_up:
                    added = added_roles(change)
                    task = asyncio.create_task(warm_up(running, served.nodes, added, self.out))
                    background.append(task)

            reloader = self.reloader = ConfigReloader(
                options,
                served,
                scheduler=scheduler,
                routes=routes,
                serve_config=serve_config,
                on_applied=warm_up_added,
            )
            streams = LiveStreams()  # followed logs and the page's stream end as serving stops
            router = create_app(
                scheduler,
                routes,
                config=RouterConfig(
                    api_keys=options.api_keys,
                    max_body_bytes=options.max_body_bytes,
                    cors_origins=options.cors_origins,
                    first_byte_timeout_s=options.first_byte_timeout_s,
                    chunk_timeout_s=options.chunk_timeout_s,
                    request_read_timeout_s=options.request_read_timeout_s,
                ),
                metrics=metrics,
                status_extra=lambda: status_extra(reloader, ray),
                reload=reloader.reload,
                log_path=supervisor.log_path,
                streams=streams,
                node_views=ray.node_views if ray is not None else None,
            )
            scheduler.start()
            if ray is not None:
                ray.watch(
                    scheduler,
                    after_plan=self._set_signal_handlers if self.stop_on_signals else None,
                    # a lost node back on the cluster is taken back by a reload
                    on_back=lambda node: self._reload_soon(),
                )
            config = uvicorn.Config(
                router,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=max(1, int(options.limits.drain_s)),
                # uvicorn listens again on the socket it is given, with its own backlog.
                backlog=LISTEN_BACKLOG,
                # deadlines for slow clients (its module says why)
                http=bounded_http_protocol(min(HEADER_TIMEOUT_S, options.request_read_timeout_s)),
            )
            server = self._server = NoSignalServer(config)
            if self._stop.is_set():
                return
            serving = asyncio.create_task(server.serve(sockets=[sock]), name="rosterd-http")
            shown_host = f"[{options.host}]" if ":" in options.host else options.host
            self.url = f"http://{shown_host}:{options.port}"
            self.out.print(
                f"[bold]rosterd serving {len(scheduler.roles)} role(s) on {self.url}/v1[/bold]"
                f" ({'API key required' if options.api_keys else 'no API key'}; Ctrl-C to stop)"
            )
            self._serving.set()
            if options.warm_up:
                background.append(
                    asyncio.create_task(
                        warm_up(scheduler, served.nodes, None, self.out), name="rosterd-warm-up"
                    )
                )
            if options.watch:
                background.append(asyncio.create_task(reloader.watch(), name="rosterd-watch"))
            await self._stop.wait()
            self.out.print(f"stopping: {self._stopping_what()} …")
            streams.close()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            server.should_exit = True
            # The scheduler's shutdown runs beside uvicorn's: waiting requests fail at
            # once and a load under way is aborted, instead of holding the HTTP drain
            # until a readiness poll reached its own deadline.
            stopping = asyncio.create_task(scheduler.shutdown(), name="rosterd-shutdown")
            await serving
            await stopping
        finally:
            for task in background:
                task.cancel()
            if serving is not None and not serving.done():
                # Left early (cancelled, or an error): uvicorn ends its lifespan here, not
                # as a cancelled task once the event loop closes (a traceback per task).
                if self._server is not None:
                    self._server.should_exit = self._server.force_exit = True
                with contextlib.suppress(asyncio.CancelledError):
                    await serving
            if scheduler is not None:
                await scheduler.shutdown()
            for recorder in recorders:  # the backends sampled their peaks before they stopped
                await recorder.finish()
            await supervisor.stop_all()
            sock.close()
            if self.stop_on_signals:
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
                # Not Python's default (KeyboardInterrupt in the last clean-up): this
                # run's own, which says it is stopping.
                signal.signal(signal.SIGINT, self.interrupted)
            self.out.print("rosterd stopped; no backend left running")

    def _warn_memory(self, memory: RosterMemory) -> None:
        """Say each memory warning (a figure far from ``ram_gb``, an ignored peaks file) once
        per run: at start, and on a reload only what is new."""
        for warning in [*memory.notes, *memory.warnings()]:
            if warning not in self._memory_warned:
                self._memory_warned.add(warning)
                self.err.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)

    def _set_signal_handlers(self) -> None:
        """SIGINT and SIGTERM stop, SIGHUP reloads (set again after each plan, so that no
        handler a library set while planning outlives it)."""
        loop = asyncio.get_running_loop()
        self._signals_taken = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._reload_soon)

    def _stop_signal(self) -> None:
        """SIGINT or SIGTERM while serving: stop; again while stopping, say so and go on (the
        drain and the stops are bounded by --drain and --grace, and every backend must
        still be stopped)."""
        if self._stop.is_set():
            self._say_stopping()
        else:
            self.stop()

    def _stopping_what(self) -> str:
        return (
            f"draining requests (up to --drain {self.options.limits.drain_s:g} s), "
            "then stopping every backend"
        )

    def _say_stopping(self) -> None:
        self.out.print(f"already stopping: {self._stopping_what()}")

    def _reload_soon(self) -> None:
        """SIGHUP: reload in the background (a refusal is logged and kept for /status)."""
        if self.reloader is not None:
            task = asyncio.get_running_loop().create_task(self.reloader.try_reload())
            self._reloads.add(task)
            task.add_done_callback(self._reloads.discard)

    def _take_peak_sources(self, served: Served, ray: UpFleet | None) -> None:
        """Each node's backends measure its peaks where they run: this machine's supervisor
        for its nodes, a node agent on its node (the peaks are kept here all the same)."""
        self._backends.update(
            {
                name: c.backends
                for name, c in served.nodes.items()
                if isinstance(c.backends, SupervisorBackends)
            }
        )
        if ray is not None:
            self._backends.update(ray.agents)

    def _follow_peaks(
        self,
        nodes: Mapping[str, NodeScheduler],
        recorders: Sequence[PeakRecorder],
        fingerprints: Mapping[str, str],
        state_dir: Path,
    ) -> list[PeakRecorder]:
        """:func:`~rosterd.memory.watch.follow_peaks` over this run's backends, a peak that
        cannot be stored said as a warning."""
        return follow_peaks(
            nodes,
            self._backends,
            recorders,
            fingerprints,
            MeasuredPeaks(state_dir),
            on_error=lambda message: self.err.print(
                Text(f"warning: {message}", style="yellow"), soft_wrap=True
            ),
        )


def _os_message(exc: OSError) -> str:
    """``strerror: filename`` of an OSError, as the operator can act on it."""
    return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
