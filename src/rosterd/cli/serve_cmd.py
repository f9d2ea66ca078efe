"""``rosterd up`` (serve the roster) and ``rosterd ps/load/unload`` (talk to it) (layer 8).

``rosterd up ROSTER [--overlay F] [--fleet F] [--host H] [--port P]`` imports
the roster, plans it on the fleet (printing the plan), starts the supervisor on
this machine, loads the interactive and sticky roles that fit without evicting
anything (showing each load as it happens), and serves the OpenAI-compatible
router until Ctrl-C or SIGTERM; then it lets in-flight requests finish (up to
``--drain``) and stops every backend it started. Nodes of the fleet whose
address is not this machine are planned but not started here (it says so).

``rosterd ps``, ``rosterd load ROLE`` and ``rosterd unload ROLE`` talk to a
running ``rosterd up`` over HTTP (``--url``, default ``http://127.0.0.1:8400``;
``--api-key`` or ``ROSTERD_API_KEY`` when it has keys).

uvicorn serves the ASGI router in rosterd's own event loop (so the scheduler,
supervisor and router share one loop); its signal capture is replaced by
rosterd's, so Ctrl-C drains and stops the backends before the process exits.
Exit status: 0 after a clean stop, 2 on bad input (roster, overlay, fleet,
port in use), 1 when a running rosterd cannot be reached or refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import psutil
import typer
import uvicorn
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rosterd.adapters import WeightsSource, adapter_for
from rosterd.cli import app, make_console
from rosterd.errors import RosterdError
from rosterd.fleet import Fleet, Node, load_fleet, local_fleet
from rosterd.metrics import RosterdMetrics
from rosterd.placement import Plan, plan
from rosterd.roster import ImportedRoster, ImportedSpec, load_roster
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
from rosterd.tokens import GB, valid_token
from rosterd.weights import resolve_for_fleet

#: Where ``rosterd up`` listens unless told otherwise.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8400
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"

EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 1

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


def _use_command_consoles() -> None:
    """Size :data:`console` and :data:`err_console` for where the output goes now: a
    terminal, or (a pipe, a file, nohup) wide, unwrapped lines without trailing spaces."""
    global console, err_console
    console = make_console()
    err_console = make_console(stderr=True)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/rosterd`` (default ``~/.local/state/rosterd``): logs and pid records."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rosterd"


def is_local_address(address: str) -> bool:
    """Whether ``address`` (a node's) is this machine: loopback, ``localhost``, our hostname
    or one of our interface addresses."""
    if address in ("localhost", socket.gethostname()):
        return True
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        return False
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.address.split("%", 1)[0] == address:
                return True
    return False


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` keeps the server on this machine (localhost, 127.x, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_api_keys(given: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The API keys to require, from ``--api-key`` values (``given``) or ``ROSTERD_API_KEY``.

    Raises:
        RosterdError: a key is empty or blank, given as an option or as
            ``ROSTERD_API_KEY`` (an empty key must not silently turn auth off).
    """
    keys = tuple(given)
    if any(not k.strip() for k in keys):
        raise RosterdError(
            "--api-key is empty; an empty key would leave the server open to anyone. "
            "Give a non-empty key, or leave --api-key out to serve without keys"
        )
    env = environ.get("ROSTERD_API_KEY")
    if not keys and env is not None and not env.strip():
        raise RosterdError(
            "ROSTERD_API_KEY is set but empty; an empty key would leave the server open to "
            "anyone. Set it to a non-empty key, or unset it to serve without keys"
        )
    return keys


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GB:.2f}"


def first_by_role(roster: ImportedRoster) -> dict[str, ImportedSpec]:
    """Role id -> its first imported entry: the one planned when an id is given twice
    (placement reports the later ones as unplaced duplicates)."""
    first: dict[str, ImportedSpec] = {}
    for imported in roster.specs:
        first.setdefault(imported.spec.role, imported)
    return first


def unserved_reasons(
    result: Plan, roster: ImportedRoster, served_nodes: Iterable[str]
) -> dict[str, str]:
    """Name (role id, roster model name, alias) -> why this process does not serve it:
    the plan's reason for an unplaced role, the node it is planned on when this
    process does not run that node, or why the import skipped a roster entry.
    Roles served here are left out."""
    served = set(served_nodes)
    why: dict[str, str] = {}
    for role, reason in result.unplaced:
        if role not in result.placements:  # a duplicate id's first entry is placed
            why.setdefault(role, f"unplaced: {reason}")
    for role, node in result.placements.items():
        if node not in served:
            why[role] = f"planned on node {node}, which this process does not run"
    by_role = first_by_role(roster)
    out = dict(why)
    for role, reason in why.items():
        s = by_role.get(role)
        for name in (s.spec.model, s.name) if s is not None else ():
            if name:
                out.setdefault(name, reason)
    for alias, role in roster.aliases.items():
        if role in why:
            out.setdefault(alias, why[role])
    for entry_id, reason in roster.skipped:
        out.setdefault(entry_id, f"skipped in the roster: {reason}")
    return out


def print_plan(
    result: Plan, fleet: Fleet, roster: ImportedRoster, local: Iterable[str], out: Console
) -> None:
    """The plan as people read it: per node its roles and memory, then unplaced roles."""
    specs = {role: s.spec for role, s in first_by_role(roster).items()}
    local = set(local)
    for node in fleet.nodes:
        node_plan = result.nodes.get(node.name)
        roles = [r for r, n in result.placements.items() if n == node.name]
        where = "this machine" if node.name in local else "remote: not started here"
        table = Table(
            title=f"node {node.name} ({node.address}, {where}): capacity "
            f"{_gib(node.capacity_bytes)} GiB",
            title_justify="left",
        )
        for column in ("role", "flavor", "model", "GiB", "class", "sticky", "residency"):
            table.add_column(
                column,
                justify="right" if column == "GiB" else "left",
                no_wrap=column not in ("role", "model"),
                overflow="fold",  # a long name wraps, never cut to "gemma-3-2…"
            )
        always = set(node_plan.always_resident) if node_plan else set()
        for role in roles:
            s = specs[role]
            table.add_row(
                Text(role),
                s.flavor.id,
                Text(s.model or "-"),
                _gib(s.memory.resident_bytes),
                s.latency_class.value,
                "yes" if s.sticky else "no",
                "always" if role in always else "on demand",
            )
        out.print(table)
    if result.unplaced:
        out.print(f"[bold]unplaced roles ({len(result.unplaced)}):[/bold]")
        for role, reason in result.unplaced:
            out.print(Text(f"  {role}: {reason}"))
    if roster.skipped:
        out.print(f"skipped roster entries: {len(roster.skipped)} (see `rosterd roster import`)")


def _warm_up_order(specs: Mapping[str, InferenceSpec]) -> list[str]:
    """Roles to load at start: interactive first, then sticky batch roles, biggest first."""
    chosen = [s for s in specs.values() if s.interactive or s.sticky]
    chosen.sort(key=lambda s: (not s.interactive, -s.memory.resident_bytes, s.role))
    return [s.role for s in chosen]


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
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def _serve(
    *,
    roster: ImportedRoster,
    fleet: Fleet,
    result: Plan,
    local_nodes: list[Node],
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    max_body_bytes: int,
    state_dir: Path,
    limits: SchedulerLimits,
    grace_s: float,
    auto_ports: bool,
    warm_up: bool,
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    server: _Server | None = None

    def on_signal(sig: signal.Signals) -> None:
        # A second Ctrl-C changes nothing: the drain and the stops are bounded
        # (--drain, --grace), and every backend must still be stopped.
        stop.set()
        if server is not None:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    sock = _bind(host, port)
    scheduler: Scheduler | None = None

    def on_backend_event(event: BackendEvent) -> None:
        _print_backend_event(event)
        if scheduler is not None:  # crashes and restarts change what the scheduler serves
            scheduler.backend_event(event)

    supervisor = Supervisor(state_dir, grace_s=grace_s, on_event=on_backend_event)
    try:
        reaped = await supervisor.reap_leftovers()
        if reaped:
            console.print(f"stopped {len(reaped)} backend(s) left by an earlier run: {reaped}")
        by_role = first_by_role(roster)
        repos = {role: s.repo for role, s in by_role.items()}
        metrics = RosterdMetrics()

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
            unavailable = _check_weights(specs.values(), weights_for)
            backends = SupervisorBackends(
                supervisor,
                specs,
                host=node.address if node.address != "localhost" else "127.0.0.1",
                resolve_weights=weights_for,
                auto_ports=auto_ports,
                node=node.name,
            )
            nodes[node.name] = NodeScheduler(
                node.name,
                node.capacity_bytes,
                specs,
                backends,
                limits=limits,
                metrics=metrics,
                unavailable=unavailable,
            )
        scheduler = Scheduler(nodes)

        aliases: dict[str, list[str]] = {}
        for alias, role in roster.aliases.items():
            aliases.setdefault(role, []).append(alias)
        routes: dict[str, RoleRoute] = {}
        for role in scheduler.roles:
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
        remote = [
            {"node": n.name, "address": n.address, "served_here": False}
            for n in fleet.nodes
            if n.name not in nodes
        ]

        def status_extra() -> dict[str, object]:
            return {
                "unplaced": [list(u) for u in result.unplaced],
                "remote_nodes": remote,
                "plan_solver": result.solver,
            }

        router = create_app(
            scheduler,
            routes,
            config=RouterConfig(api_keys=api_keys, max_body_bytes=max_body_bytes),
            metrics=metrics,
            status_extra=status_extra,
            unserved=unserved_reasons(result, roster, nodes),
        )
        scheduler.start()
        config = uvicorn.Config(
            router,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=max(1, int(limits.drain_s)),
        )
        server = _Server(config)
        if stop.is_set():
            return
        serving = asyncio.create_task(server.serve(sockets=[sock]), name="rosterd-http")
        shown_host = f"[{host}]" if ":" in host else host
        console.print(
            f"[bold]rosterd serving {len(routes)} role(s) on http://{shown_host}:{port}/v1[/bold]"
            f" ({'API key required' if api_keys else 'no API key'}; Ctrl-C to stop)"
        )
        warm: asyncio.Task[None] | None = None
        if warm_up:
            warm = asyncio.create_task(_warm_up(scheduler, nodes), name="rosterd-warm-up")
        await stop.wait()
        console.print("stopping: draining requests, then stopping every backend …")
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
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        console.print("rosterd stopped; no backend left running")


def _check_weights(
    specs: Iterable[InferenceSpec], weights_for: Callable[[InferenceSpec], WeightsSource]
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
            console.print(
                Text(f"role {spec.role} is unavailable (requests get 503): {exc}", style="red")
            )
    return unavailable


async def _warm_up(scheduler: Scheduler, nodes: Mapping[str, NodeScheduler]) -> None:
    """Load each node's interactive, then sticky roles, one by one, evicting nothing.

    Progress is the scheduler's log (``loading``, ``loaded in N s``); a role
    that does not fit (or fails) is named here and loads on demand later.
    """
    for node in nodes.values():
        for role in _warm_up_order(node.specs):
            if role in node.unavailable:
                continue  # named at start; requests for it get 503 at once
            try:
                await scheduler.load(role, no_evict=True)
            except SchedulerError as exc:
                console.print(Text(f"not loaded at start: {role}: {exc}"))


def _print_backend_event(event: BackendEvent) -> None:
    """Say when a backend dies by itself and how the supervisor restarts it."""
    if event.kind == "exited":
        code = event.exit_code
        how = (
            describe_exit(code)
            if code is not None and code < 0
            else f"exited by itself (code {code})"
        )
        console.print(Text(f"backend {event.name} {how}"))
    elif event.kind == "restarting":
        console.print(Text(f"restarting {event.name} in {event.delay_s or 0:.1f} s"))
    elif event.kind == "restart_failed":
        console.print(Text(f"restart of {event.name} failed: {event.detail}"))


def _configure_logging(verbose: bool) -> None:
    """Plain timestamped lines on stderr: rosterd's own at INFO (``-v``: DEBUG), others WARNING.

    The scheduler logs every load and eviction with its cause at INFO, so an
    operator sees them without ``-v``; plain lines (not Rich) stay readable
    when redirected to a file.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("rosterd").setLevel(logging.DEBUG if verbose else logging.INFO)


def _fail(message: str, code: int) -> typer.Exit:
    err_console.print(Text(f"rosterd: {message}"), soft_wrap=True)
    return typer.Exit(code)


@app.command("up")
def up_cmd(
    roster_path: Annotated[Path, typer.Argument(metavar="ROSTER", help="The roster YAML file.")],
    overlay: Annotated[Path | None, typer.Option(help="Overlay YAML (excludes, …).")] = None,
    fleet_path: Annotated[
        Path | None, typer.Option("--fleet", help="Fleet YAML (default: this machine).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = DEFAULT_PORT,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            envvar="ROSTERD_API_KEY",
            help="Require 'Authorization: Bearer KEY' (repeat for several keys).",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="Backend logs and pid records (default: XDG state dir).")
    ] = None,
    idle_ttl: Annotated[
        float,
        typer.Option(
            min=0, help="Unload idle non-sticky batch roles after this many seconds (0: never)."
        ),
    ] = 600.0,
    min_residency: Annotated[
        float, typer.Option(min=0, help="Seconds a loaded role is safe from batch evictions.")
    ] = 10.0,
    drain: Annotated[
        float, typer.Option(min=0, help="Seconds to let in-flight requests finish before evicting.")
    ] = 30.0,
    queue_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may wait for its role (then 503).")
    ] = 300.0,
    max_queue: Annotated[
        int, typer.Option(min=1, help="Waiting requests per role (then 429).")
    ] = 64,
    max_concurrency: Annotated[int, typer.Option(min=1, help="Requests per role at once.")] = 4,
    grace: Annotated[
        float, typer.Option(min=0, help="Seconds between SIGTERM and SIGKILL.")
    ] = 10.0,
    max_body: Annotated[
        int, typer.Option(min=1, help="Largest request body in bytes (then 413).")
    ] = 8 * 2**20,
    auto_backend_ports: Annotated[
        bool, typer.Option(help="Let the OS choose backend ports instead of the roster's.")
    ] = False,
    warm_up: Annotated[
        bool, typer.Option(help="Load interactive and sticky roles that fit at start.")
    ] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Plan the roster on the fleet, start what must be resident, serve one OpenAI endpoint."""
    _configure_logging(verbose)
    _use_command_consoles()
    if not 1 <= port <= 65535:
        raise _fail(f"--port {port} is not a usable port (1..65535)", EXIT_BAD_INPUT)
    try:
        keys = check_api_keys(api_key or [], os.environ)
    except RosterdError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    try:
        roster = load_roster(roster_path, overlay)
        fleet = load_fleet(fleet_path) if fleet_path is not None else local_fleet()
    except RosterdError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    for warning in roster.warnings:  # the import's notes, as `rosterd roster import` shows them
        err_console.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
    state = state_dir or default_state_dir()
    try:
        # Held for the whole run: a second `up` on this folder would otherwise
        # take this one's live backends for leftovers of an earlier run. Taken
        # before the plan is printed, so a refused second `up` prints only why.
        state_lock = lock_state_dir(state)
    except RosterdError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    except OSError as exc:
        raise _fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), 1) from None
    result = plan([s.spec for s in roster.specs], fleet)
    local_nodes = [n for n in fleet.nodes if is_local_address(n.address)]
    print_plan(result, fleet, roster, (n.name for n in local_nodes), console)
    for node in fleet.nodes:
        if node not in local_nodes:
            console.print(
                f"[yellow]node {node.name} at {node.address} is not this machine: its roles are "
                "planned but not started here (remote nodes are not run yet)[/yellow]"
            )
    if not local_nodes:
        raise _fail("no node of the fleet is this machine; nothing to serve", EXIT_BAD_INPUT)
    limits = SchedulerLimits(
        max_concurrency=max_concurrency,
        max_queue=max_queue,
        queue_timeout_s=queue_timeout,
        drain_s=drain,
        idle_ttl_s=idle_ttl if idle_ttl > 0 else float("inf"),
        min_residency_s=min_residency,
    )
    if not keys and not is_loopback_host(host):
        err_console.print(
            Text(
                f"warning: listening on {host} without an API key: anyone who can reach this "
                "address can use every model and load or unload roles. Pass --api-key KEY "
                "(or set ROSTERD_API_KEY) to require one.",
                style="bold yellow",
            ),
            soft_wrap=True,
        )
    try:
        asyncio.run(
            _serve(
                roster=roster,
                fleet=fleet,
                result=result,
                local_nodes=local_nodes,
                host=host,
                port=port,
                api_keys=keys,
                max_body_bytes=max_body,
                state_dir=state,
                limits=limits,
                grace_s=grace,
                auto_ports=auto_backend_ports,
                warm_up=warm_up,
            )
        )
    except RosterdError as exc:
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    except OSError as exc:  # e.g. the state folder cannot be created
        raise _fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), 1) from None
    finally:
        state_lock.release()


# --------------------------------------------------------------------------- clients

UrlOption = Annotated[str, typer.Option(help="Where rosterd up listens.")]
KeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="ROSTERD_API_KEY", help="API key, if any.")
]


def _call(method: str, url: str, path: str, api_key: str | None, timeout_s: float) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.request(
            method, url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False
        )
    except httpx.HTTPError as exc:
        raise _fail(
            f"no rosterd up answers at {url} ({type(exc).__name__}); start one with "
            "`rosterd up ROSTER` or pass --url",
            EXIT_UNREACHABLE,
        ) from None
    try:
        data = response.json()
    except ValueError:
        data = {"error": {"message": response.text[:300]}}
    if response.status_code >= 400:
        message = data.get("error", {}).get("message") if isinstance(data, dict) else None
        raise _fail(f"{response.status_code}: {message or response.text[:300]}", EXIT_UNREACHABLE)
    return data


def _role_path(action: str, role: str) -> str:
    """``/rosterd/{action}/{role}`` with ``role`` percent-encoded as one path segment.

    Raises:
        typer.Exit: code 2 (with a message on stderr) when ``role`` is not a plain
            token of at most 64 bytes, such as ``../load/x`` or ``x?y=1``.
    """
    if not valid_token(role, 64):
        raise _fail(
            f"ROLE {role!r} is not a plain token (1 to 64 ASCII letters, digits, '.', '_' "
            "or '-', starting with a letter or digit); give a role id, an alias id or a "
            "model name that is one (`rosterd ps` lists the roles)",
            EXIT_BAD_INPUT,
        )
    return f"/rosterd/{action}/{urllib.parse.quote(role, safe='')}"


def _age(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


@app.command("ps")
def ps_cmd(url: UrlOption = DEFAULT_URL, api_key: KeyOption = None) -> None:
    """What is resident where: memory (planned and measured), requests, idle time."""
    _use_command_consoles()
    data = _call("GET", url, "/rosterd/ps", api_key, 10.0)
    for name, node in data.get("nodes", {}).items():
        table = Table(
            title=f"node {name}: {_gib(node['resident_bytes'])} of "
            f"{_gib(node['capacity_bytes'])} GiB resident",
            title_justify="left",
            caption="GiB: planned (roster); RSS: measured; idle: since the last request",
            caption_justify="left",
        )
        table.add_column("role", no_wrap=True)
        table.add_column("state", no_wrap=True)
        for column in ("class", "GiB", "RSS GiB", "busy", "queue", "idle"):
            table.add_column(column, justify="right", no_wrap=True)
        for role, info in node.get("roles", {}).items():
            rss = info.get("measured_rss_bytes")
            table.add_row(
                Text(role),
                info["phase"],
                info["latency_class"],
                _gib(info["resident_bytes"]),
                _gib(rss) if isinstance(rss, int) else "-",
                str(info["in_flight"]),
                str(info["queued"]),
                _age(info.get("idle_s")),
            )
        console.print(table)


@app.command("load")
def load_cmd(
    role: Annotated[str, typer.Argument(help="Role (or model name / alias) to make resident.")],
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Make ROLE resident now (evicting idle roles if the policy allows)."""
    _use_command_consoles()
    started = time.monotonic()
    data = _call("POST", url, _role_path("load", role), api_key, 3600.0)
    console.print(
        Text(
            f"{data['role']} is resident on {data['node']} at {data['base_url']} "
            f"({time.monotonic() - started:.1f} s)"
        )
    )


@app.command("unload")
def unload_cmd(
    role: Annotated[str, typer.Argument(help="Role (or model name / alias) to stop.")],
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Stop ROLE's backend once its requests finished; its memory is free when this returns."""
    _use_command_consoles()
    data = _call("POST", url, _role_path("unload", role), api_key, 3600.0)
    console.print(Text(f"{data['role']} is no longer resident"))
