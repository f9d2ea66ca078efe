"""What ``rosterd up`` prints while it serves, and its warm-up (layer 8).

:func:`print_backend_event` says when a backend dies by itself and how the
supervisor restarts it (DESIGN.md: only the CLI prints), :func:`say_remote_nodes`
and :func:`warn_open_listener` what ``up`` says at start; :func:`warm_up` loads
each node's interactive, then sticky roles at start (and the roles a reload
added, :func:`added_roles`), evicting nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from rich.console import Console
from rich.text import Text

from rosterd.errors import SchedulerError
from rosterd.fleet import Fleet, Node
from rosterd.scheduler.fleet import NodeConfig, Scheduler
from rosterd.supervisor import BackendEvent, describe_exit
from rosterd.up.plan_view import warm_up_order


def say_remote_nodes(fleet: Fleet, local_nodes: Collection[Node], out: Console) -> None:
    """Say on ``out`` which fleet nodes are not this machine (without Ray nothing runs them)."""
    for node in fleet.nodes:
        if node not in local_nodes:
            out.print(
                f"[yellow]node {node.name} at {node.address} is not this machine: its roles "
                "are planned but not started here (to run them too, serve the fleet on Ray: "
                "--ray-address)[/yellow]"
            )


def warn_open_listener(host: str, err: Console) -> None:
    """Warn on ``err`` that ``host`` (not a loopback address) is served without an API key."""
    err.print(
        Text(
            f"warning: listening on {host} without an API key: anyone who can reach this "
            "address can use every model and load or unload roles. Pass --api-key KEY (or "
            "set ROSTERD_API_KEY) to require one.",
            style="bold yellow",
        ),
        soft_wrap=True,
    )


def print_backend_event(out: Console, event: BackendEvent) -> None:
    """Say on ``out`` when a backend dies by itself and how the supervisor restarts it."""
    if event.kind == "exited":
        code = event.exit_code
        how = (
            describe_exit(code)
            if code is not None and code < 0
            else f"exited by itself (code {code})"
        )
        out.print(Text(f"backend {event.name} {how}"))
    elif event.kind == "restarting":
        out.print(Text(f"restarting {event.name} in {event.delay_s or 0:.1f} s"))
    elif event.kind == "restart_failed":
        out.print(Text(f"restart of {event.name} failed: {event.detail}"))


async def warm_up(
    scheduler: Scheduler,
    nodes: Mapping[str, NodeConfig],
    only: Collection[str] | None,
    out: Console,
) -> None:
    """Load each node's interactive, then sticky roles (those in ``only``, if given: the
    roles a reload added), one by one, evicting nothing; ``out`` gets the roles not loaded.

    Progress is the scheduler's log (``loading``, ``loaded in N s``); a role
    that does not fit (or fails) is named here and loads on demand later.
    """
    for node in nodes.values():
        for role in warm_up_order(node.specs):
            if only is not None and role not in only:
                continue
            if role in node.unavailable:
                continue  # named at start; requests for it get 503 at once
            try:
                await scheduler.load(role, no_evict=True)
            except SchedulerError as exc:
                out.print(Text(f"not loaded at start: {role}: {exc}"))


def added_roles(change: Mapping[str, object]) -> set[str]:
    """The roles a reload's change (``PlanChange.as_json``) added on some node."""
    nodes = change.get("nodes")
    added: set[str] = set()
    for node in (nodes if isinstance(nodes, dict) else {}).values():
        added.update(node.get("added") or ())
    return added
