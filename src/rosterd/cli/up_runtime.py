"""The runtime of ``rosterd up`` as a plain function (layer 8): import, plan, check the
weights, start the supervisor, the scheduler and the router, serve until stopped, then
drain and stop every backend.

:func:`run_up` is the whole process (SIGINT and SIGTERM stop it);
:class:`UpRun` is one run inside a running event loop, stopped by its own
handle (:meth:`UpRun.stop`), which is how tests run it without a subprocess or
Typer. Both take an :class:`UpOptions` value; ``rosterd up`` only parses its
options into one (:mod:`rosterd.cli.serve_cmd`).

It lives in the CLI layer, not beside the router, because it prints: the plan,
each role it cannot serve, backend crashes and restarts, "serving", "stopped"
(DESIGN.md: only the CLI prints), on the consoles it is given.

uvicorn serves the ASGI router in rosterd's own event loop (so the scheduler,
supervisor and router share one loop); its signal capture is replaced by
rosterd's, so Ctrl-C drains and stops the backends before the process exits.

Errors: every failure a user can act on is a :class:`~rosterd.errors.RosterdError`
(a bad roster, overlay or fleet, a port in use, a locked or unusable state
folder, no node of the fleet on this machine); the CLI edge gives it exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from rich.console import Console
from rich.text import Text

from rosterd.adapters import WeightsSource, adapter_for
from rosterd.cli import DEFAULT_HOST, DEFAULT_PORT
from rosterd.cli.http_protocol import BoundedHttpProtocol
from rosterd.cli.up_plan import (
    first_by_role,
    is_local_address,
    is_loopback_host,
    print_plan,
    unserved_reasons,
    warm_up_order,
)
from rosterd.errors import RosterdError
from rosterd.fleet import Fleet, Node, load_fleet, local_fleet
from rosterd.metrics import RosterdMetrics
from rosterd.placement import Plan, plan
from rosterd.roster import ImportedRoster, load_roster
from rosterd.router import RoleRoute, RouterConfig, create_app
from rosterd.scheduler import (
    NodeScheduler,
    Scheduler,
    SchedulerError,
    SchedulerLimits,
    SupervisorBackends,
)
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, Supervisor, describe_exit, lock_state_dir
from rosterd.weights import resolve_for_fleet

#: The router's listen backlog: connections the kernel accepts before rosterd does (Linux
#: caps it at ``net.core.somaxconn``, 4096 by default since 5.4). Both ``_bind`` and
#: uvicorn (which calls ``listen`` again on the socket it is given) use it.
LISTEN_BACKLOG = 4096

#: Open files ``rosterd up`` needs beside its streams: logs, pipes, probes, the listener.
BASE_OPEN_FILES = 256


def open_files_wanted(limits: SchedulerLimits, roles: int) -> int:
    """The open-files limit one ``up`` wants: two sockets per request it admits (the
    client's and the backend's) for each role's ``max_concurrency + max_queue``, plus
    ``BASE_OPEN_FILES``. Measured: at the usual soft limit of 1,024, 1,000 streams
    through one role got 984 answers 502 (``connect`` to the backend failed with
    EMFILE)."""
    return BASE_OPEN_FILES + 2 * roles * (limits.max_concurrency + limits.max_queue)


def raise_open_files_limit(wanted: int) -> str | None:
    """When this process's soft ``RLIMIT_NOFILE`` is below ``wanted``, raise it to the hard
    limit (idle and slow connections hold descriptors too); what to tell the operator
    (raised, or still too low), or ``None`` when the limit was already enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    target = max(wanted, 2**20) if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target >= wanted:
        return f"raised the open-files limit from {soft} to {target} for the requests admitted"
    return (
        f"warning: the open-files limit is {target} (hard limit), below the {wanted} the "
        "admitted requests may need (two sockets each); raise it (ulimit -Hn) or lower "
        "--max-concurrency / --max-queue, or requests will fail with backend_error"
    )


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rosterd`` (default ``~/.local/state/rosterd``): logs and pid records."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rosterd"


@dataclass(frozen=True)
class UpOptions:
    """What one ``rosterd up`` serves and how (the command's options, parsed).

    ``api_keys``: the keys requests must carry (empty: none, checked non-blank by
    the caller); ``state_dir``: backend logs, pid records and the lock (``None``:
    :func:`default_state_dir`); ``grace_s``: SIGTERM to SIGKILL, seconds;
    ``max_body_bytes``: the largest request body; ``auto_backend_ports``: let the
    OS choose backend ports; ``warm_up``: load interactive and sticky roles that
    fit at start.
    """

    roster_path: Path
    overlay_path: Path | None = None
    fleet_path: Path | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_keys: tuple[str, ...] = ()
    state_dir: Path | None = None
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    grace_s: float = 10.0
    max_body_bytes: int = 8 * 2**20
    auto_backend_ports: bool = False
    warm_up: bool = True


def run_up(options: UpOptions, *, out: Console, err: Console) -> None:
    """Serve ``options`` in this process until SIGINT or SIGTERM, then stop every backend.

    ``out`` gets the plan and progress, ``err`` the warnings.

    Raises:
        RosterdError: bad input or an unusable port or state folder (see the module).
    """
    asyncio.run(UpRun(options, out=out, err=err, stop_on_signals=True).run())


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
        self._server: _Server | None = None

    def stop(self) -> None:
        """Stop serving: in-flight requests get ``limits.drain_s``, then every backend stops.
        Safe to call at any time, and more than once."""
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True

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
            raise RosterdError("rosterd up ended before it served")
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
            raise RosterdError(f"--port {options.port} is not a usable port (1..65535)")
        roster = load_roster(options.roster_path, options.overlay_path)
        fleet = load_fleet(options.fleet_path) if options.fleet_path is not None else local_fleet()
        for warning in roster.warnings:  # the import's notes, as `rosterd roster import` shows
            self.err.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
        state_dir = options.state_dir or default_state_dir()
        try:
            # Held for the whole run: a second `up` on this folder would otherwise
            # take this one's live backends for leftovers of an earlier run. Taken
            # before the plan is printed, so a refused second `up` prints only why.
            state_lock = lock_state_dir(state_dir)
        except OSError as exc:
            raise RosterdError(_os_message(exc)) from None
        try:
            result = plan([s.spec for s in roster.specs], fleet)
            local_nodes = [n for n in fleet.nodes if is_local_address(n.address)]
            print_plan(result, fleet, roster, (n.name for n in local_nodes), self.out)
            for node in fleet.nodes:
                if node not in local_nodes:
                    self.out.print(
                        f"[yellow]node {node.name} at {node.address} is not this machine: its "
                        "roles are planned but not started here (remote nodes are not run "
                        "yet)[/yellow]"
                    )
            if not local_nodes:
                raise RosterdError("no node of the fleet is this machine; nothing to serve")
            if not options.api_keys and not is_loopback_host(options.host):
                self.err.print(
                    Text(
                        f"warning: listening on {options.host} without an API key: anyone who "
                        "can reach this address can use every model and load or unload roles. "
                        "Pass --api-key KEY (or set ROSTERD_API_KEY) to require one.",
                        style="bold yellow",
                    ),
                    soft_wrap=True,
                )
            await self._serve(roster, fleet, result, local_nodes, state_dir)
        except OSError as exc:  # e.g. the state folder's logs cannot be created
            raise RosterdError(_os_message(exc)) from None
        finally:
            state_lock.release()

    async def _serve(
        self,
        roster: ImportedRoster,
        fleet: Fleet,
        result: Plan,
        local_nodes: list[Node],
        state_dir: Path,
    ) -> None:
        options = self.options
        raised = raise_open_files_limit(open_files_wanted(options.limits, len(result.placements)))
        if raised is not None:
            self.out.print(raised)
        sock = _bind(options.host, options.port)
        loop = asyncio.get_running_loop()
        if self.stop_on_signals:
            # Only now, after the plan: OR-Tools' solver takes SIGINT over while it
            # runs, and a handler set before it no longer gets Ctrl-C afterwards.
            for sig in (signal.SIGINT, signal.SIGTERM):
                # A second Ctrl-C changes nothing: the drain and the stops are bounded
                # (--drain, --grace), and every backend must still be stopped.
                loop.add_signal_handler(sig, self.stop)
        scheduler: Scheduler | None = None

        def on_backend_event(event: BackendEvent) -> None:
            self._print_backend_event(event)
            if scheduler is not None:  # crashes and restarts change what the scheduler serves
                scheduler.backend_event(event)

        supervisor = Supervisor(state_dir, grace_s=options.grace_s, on_event=on_backend_event)
        try:
            reaped = await supervisor.reap_leftovers()
            if reaped:
                self.out.print(f"stopped {len(reaped)} backend(s) left by an earlier run: {reaped}")
            metrics = RosterdMetrics()
            nodes = self._node_schedulers(roster, fleet, result, local_nodes, supervisor, metrics)
            scheduler = Scheduler(nodes)
            router = create_app(
                scheduler,
                _routes(scheduler.roles, roster, result),
                config=RouterConfig(
                    api_keys=options.api_keys, max_body_bytes=options.max_body_bytes
                ),
                metrics=metrics,
                status_extra=_status_extra(result, fleet, nodes),
                unserved=unserved_reasons(result, roster, nodes),
            )
            scheduler.start()
            config = uvicorn.Config(
                router,
                log_level="warning",
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=max(1, int(options.limits.drain_s)),
                # uvicorn listens again on the socket it is given, with its own backlog.
                backlog=LISTEN_BACKLOG,
                http=BoundedHttpProtocol,  # deadlines for slow clients (its module says why)
            )
            server = self._server = _Server(config)
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
            warm: asyncio.Task[None] | None = None
            if options.warm_up:
                warm = asyncio.create_task(self._warm_up(scheduler, nodes), name="rosterd-warm-up")
            await self._stop.wait()
            self.out.print("stopping: draining requests, then stopping every backend …")
            if warm is not None:
                warm.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warm
            server.should_exit = True
            await serving
        finally:
            if scheduler is not None:
                await scheduler.shutdown()
            await supervisor.stop_all()
            sock.close()
            if self.stop_on_signals:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
            self.out.print("rosterd stopped; no backend left running")

    def _node_schedulers(
        self,
        roster: ImportedRoster,
        fleet: Fleet,
        result: Plan,
        local_nodes: list[Node],
        supervisor: Supervisor,
        metrics: RosterdMetrics,
    ) -> dict[str, NodeScheduler]:
        """One scheduler per local node, over the roles planned there; each role's weights
        resolved now (a role without them is named and served as unavailable)."""
        by_role = first_by_role(roster)
        repos = {role: s.repo for role, s in by_role.items()}

        def weights_for(spec: InferenceSpec) -> WeightsSource:
            found = resolve_for_fleet(spec, fleet, repo=repos.get(spec.role) or None)
            if found is None:
                raise RosterdError(f"role {spec.role}: its flavor keeps its own weights")
            return found

        nodes: dict[str, NodeScheduler] = {}
        for node in local_nodes:
            specs = {
                role: by_role[role].spec
                for role, name in result.placements.items()
                if name == node.name
            }
            unavailable = self._check_weights(specs.values(), weights_for)
            backends = SupervisorBackends(
                supervisor,
                specs,
                host=node.address if node.address != "localhost" else "127.0.0.1",
                resolve_weights=weights_for,
                auto_ports=self.options.auto_backend_ports,
                node=node.name,
            )
            nodes[node.name] = NodeScheduler(
                node.name,
                node.capacity_bytes,
                specs,
                backends,
                limits=self.options.limits,
                metrics=metrics,
                unavailable=unavailable,
            )
        return nodes

    def _check_weights(
        self, specs: Iterable[InferenceSpec], weights_for: Callable[[InferenceSpec], WeightsSource]
    ) -> dict[str, str]:
        """Resolve every role's weights now; role -> why it cannot be served, printed.

        Flavors that keep their own weights (ollama) need none and always pass.
        """
        unavailable: dict[str, str] = {}
        for spec in specs:
            if adapter_for(spec.flavor).shared_server:
                continue
            try:
                weights_for(spec)
            except RosterdError as exc:
                unavailable[spec.role] = str(exc)
                self.out.print(
                    Text(f"role {spec.role} is unavailable (requests get 503): {exc}", style="red")
                )
        return unavailable

    async def _warm_up(self, scheduler: Scheduler, nodes: Mapping[str, NodeScheduler]) -> None:
        """Load each node's interactive, then sticky roles, one by one, evicting nothing.

        Progress is the scheduler's log (``loading``, ``loaded in N s``); a role
        that does not fit (or fails) is named here and loads on demand later.
        """
        for node in nodes.values():
            for role in warm_up_order(node.specs):
                if role in node.unavailable:
                    continue  # named at start; requests for it get 503 at once
                try:
                    await scheduler.load(role, no_evict=True)
                except SchedulerError as exc:
                    self.out.print(Text(f"not loaded at start: {role}: {exc}"))

    def _print_backend_event(self, event: BackendEvent) -> None:
        """Say when a backend dies by itself and how the supervisor restarts it."""
        if event.kind == "exited":
            code = event.exit_code
            how = (
                describe_exit(code)
                if code is not None and code < 0
                else f"exited by itself (code {code})"
            )
            self.out.print(Text(f"backend {event.name} {how}"))
        elif event.kind == "restarting":
            self.out.print(Text(f"restarting {event.name} in {event.delay_s or 0:.1f} s"))
        elif event.kind == "restart_failed":
            self.out.print(Text(f"restart of {event.name} failed: {event.detail}"))


def _routes(roles: Iterable[str], roster: ImportedRoster, result: Plan) -> dict[str, RoleRoute]:
    """Role -> its route: the names a request may give it (model name, aliases), the
    flavor's request rewrite, and what ``/v1/models`` says of it."""
    by_role = first_by_role(roster)
    aliases: dict[str, list[str]] = {}
    for alias, role in roster.aliases.items():
        aliases.setdefault(role, []).append(alias)
    routes: dict[str, RoleRoute] = {}
    for role in roles:
        s = by_role[role]
        names = [n for n in (s.spec.model, s.name) if n and n != role]
        names += aliases.get(role, [])
        routes[role] = RoleRoute(
            role=role,
            names=tuple(dict.fromkeys(names)),
            rewrite=adapter_for(s.spec.flavor).rewrite_request,
            info={
                "node": result.placements[role],
                "latency_class": s.spec.latency_class.value,
                "sticky": s.spec.sticky,
                "resident_bytes": s.spec.memory.resident_bytes,
            },
        )
    return routes


def _status_extra(
    result: Plan, fleet: Fleet, served: Mapping[str, object]
) -> Callable[[], dict[str, object]]:
    """What ``/status`` adds to the scheduler's view: unplaced roles, remote nodes, solver."""
    remote = [
        {"node": n.name, "address": n.address, "served_here": False}
        for n in fleet.nodes
        if n.name not in served
    ]

    def status_extra() -> dict[str, object]:
        return {
            "unplaced": [list(u) for u in result.unplaced],
            "remote_nodes": remote,
            "plan_solver": result.solver,
        }

    return status_extra


def _os_message(exc: OSError) -> str:
    """``strerror: filename`` of an OSError, as the operator can act on it."""
    return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: ``rosterd up`` handles signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
    # and without it small responses wait ~40 ms on the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RosterdError(
            f"cannot listen on {host}:{port}: {exc.strerror}; "
            "is another rosterd up running? choose another --port"
        ) from None
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock
