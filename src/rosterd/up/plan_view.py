"""What a plan means for one ``rosterd up`` process (layer 8): which fleet nodes are this
machine, the plan as it prints it, which roles it loads at start, and why it does not
serve a name.

Functions of values (a plan, a roster, a fleet) except :func:`is_local_address`,
which asks the machine's interfaces (psutil): also the routes of the served roles
(:func:`role_routes`) and what ``/status`` adds to the scheduler's view
(:func:`status_extra`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rosterd.adapters import adapter_for
from rosterd.fleet import Fleet
from rosterd.roster import ImportedRoster, ImportedSpec
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB

if TYPE_CHECKING:
    from rosterd.memory.gathering import RosterMemory
    from rosterd.placement import Plan
    from rosterd.router import RoleRoute


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
    import psutil  # the interfaces: only when the address is not obviously local

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


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GB:.2f}"


def check_ports(
    result: Plan, roster: ImportedRoster, fleet: Fleet, *, router_port: int | None
) -> Plan:
    """``result`` with every role whose roster port collides (with an earlier role on its
    node, or with the router's ``router_port`` on a node of this machine) unplaced, with
    a reason naming both (``rosterd.placement.conflicts``)."""
    from rosterd.adapters import adapter_for
    from rosterd.placement.conflicts import without_port_conflicts
    from rosterd.spec import InferFlavor

    return without_port_conflicts(
        result,
        [s.spec for s in roster.specs],
        router_port=router_port,
        router_nodes=[n.name for n in fleet.nodes if is_local_address(n.address)],
        shared_flavors=[f for f in InferFlavor if adapter_for(f).shared_server is not None],
    )


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


def replanned_reasons(full: Plan, served: Plan, not_connected: Mapping[str, str]) -> dict[str, str]:
    """Role -> why it is not where the whole fleet's plan (``full``) put it, when ``served``
    (the plan of the nodes that run) puts it elsewhere or nowhere.

    ``not_connected``: node -> why it does not run. A role of a node that does
    not run is "planned on node Y: node X is not connected (why)" or, when it
    fits nowhere that runs, "node X is not connected (why) and it does not fit
    on the connected nodes: <the plan's reason>"; a role moved between running
    nodes by the plan without the absent ones says so too. Roles that stayed
    are left out.
    """
    unplaced = dict(served.unplaced)
    absent = ", ".join(sorted(not_connected))
    why: dict[str, str] = {}
    for role, was in full.placements.items():
        now = served.placements.get(role)
        if now == was:
            continue
        if was in not_connected:
            gone = f"node {was} is not connected ({not_connected[was]})"
            if now is not None:
                why[role] = f"planned on node {now}: {gone}"
            else:
                why[role] = f"{gone} and it does not fit on the connected nodes: " + unplaced.get(
                    role, "no connected node runs it"
                )
        elif now is not None:
            why[role] = f"planned on node {now}, not {was}: planned without {absent}"
        else:
            why[role] = f"planned without {absent}: {unplaced.get(role, 'unplaced')}"
    return why


def with_unplaced_reasons(served: Plan, reasons: Mapping[str, str]) -> Plan:
    """``served`` with the reason of each unplaced role in ``reasons`` replaced by it."""
    unplaced = tuple((role, reasons.get(role, why)) for role, why in served.unplaced)
    return dataclasses.replace(served, unplaced=unplaced)


def warm_up_order(specs: Mapping[str, InferenceSpec]) -> list[str]:
    """Roles to load at start: interactive first, then sticky batch roles, biggest first."""
    chosen = [s for s in specs.values() if s.interactive or s.sticky]
    chosen.sort(key=lambda s: (not s.interactive, -s.memory.resident_bytes, s.role))
    return [s.role for s in chosen]


def print_plan(
    result: Plan,
    fleet: Fleet,
    roster: ImportedRoster,
    local: Iterable[str],
    out: Console,
    *,
    where: Mapping[str, str] | None = None,
    memory: RosterMemory | None = None,
) -> None:
    """The plan as people read it: per node its roles and memory, then unplaced roles.

    ``local``: the nodes this machine runs; ``where``: node -> how it is run, in
    words, instead of "this machine" / "remote: not started here". With ``memory``,
    a role's GiB is its counted figure on its node and ``ram_gb`` is the roster's
    (``~`` for an unmeasured one); else the roster's figure.
    """
    specs = {role: s.spec for role, s in first_by_role(roster).items()}
    local = set(local)
    for node in fleet.nodes:
        node_plan = result.nodes.get(node.name)
        roles = [r for r, n in result.placements.items() if n == node.name]
        if where is not None and node.name in where:
            run_by = where[node.name]
        else:
            run_by = "this machine" if node.name in local else "remote: not started here"
        table = Table(
            title=f"node {node.name} ({node.address}, {run_by}): capacity "
            f"{_gib(node.capacity_bytes)} GiB",
            title_justify="left",
        )
        columns = ("role", "flavor", "model", "ram_gb", "GiB", "class", "sticky", "residency")
        for column in columns:
            table.add_column(
                column,
                justify="right" if column in ("ram_gb", "GiB") else "left",
                no_wrap=column not in ("role", "model"),
                overflow="fold",  # a long name wraps, never cut to "gemma-3-2…"
            )
        always = set(node_plan.always_resident) if node_plan else set()
        guessed = False
        for role in roles:
            s = specs[role]
            figures = memory.roles.get(role) if memory is not None else None
            counted = s.memory.resident_bytes
            declared = _gib(counted)
            if figures is not None:
                counted = figures.counted(node.name).counted_bytes
                declared = ("~" if figures.declared_unmeasured else "") + _gib(
                    figures.declared_bytes
                )
                guessed = guessed or figures.declared_unmeasured
            table.add_row(
                Text(role),
                s.flavor.id,
                Text(s.model or "-"),
                declared,
                _gib(counted),
                s.latency_class.value,
                "yes" if s.sticky else "no",
                "always" if role in always else "on demand",
            )
        if guessed:
            table.caption = "~: the roster's guess (unmeasured); GiB: what counts"
            table.caption_justify = "left"
        out.print(table)
    if result.unplaced:
        out.print(f"[bold]unplaced roles ({len(result.unplaced)}):[/bold]")
        for role, reason in result.unplaced:
            out.print(Text(f"  {role}: {reason}"))
    if roster.skipped:
        out.print(f"skipped roster entries: {len(roster.skipped)} (see `rosterd roster import`)")


def role_routes(roles: Iterable[str], roster: ImportedRoster, result: Plan) -> dict[str, RoleRoute]:
    """Role -> its route: the names a request may give it (model name, aliases), the
    flavor's request rewrite, and what ``/v1/models`` says of it."""
    by_role = first_by_role(roster)
    aliases: dict[str, list[str]] = {}
    for alias, role in roster.aliases.items():
        aliases.setdefault(role, []).append(alias)
    from rosterd.router import RoleRoute  # the router (Starlette) only when up serves

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
