"""``rosterd plan ROSTER [--overlay F] [--fleet F] [--state-dir D] [--json] [--port P]
[--auto-backend-ports]``: show the placement before anything starts.

Per node: a Rich table of its roles (resident always / swappable) with each role's
memory (the roster's ``ram_gb``, the estimate from its weights, the peak measured on
its last run, and the figure that counts: the largest; ``rosterd.memory.gathering``) and a
memory bar of the node's peak use (interactive roles plus the largest batch role)
against its capacity; then the roles left unplaced, each with its reason. A role whose
counted figure is more than 20 % away from ``ram_gb`` is named once on stderr. A role
whose roster port is taken on its node by an earlier role, or is the router's
``--port`` (when given) on this machine, is unplaced with a reason naming both, as
``rosterd up`` would leave it (not with ``--auto-backend-ports``, where the roster's
ports are not used). ``--json`` prints ``{"placements": {role: node}, "unplaced":
[[role, reason]], "copies": {role: [node, ...]} (the further copies of roles with
``replicas:``), "copies_short": [[role, reason]], "nodes": {name: {"capacity_bytes": n,
"always_resident": [...], "swappable": [...]}}, "memory": {role: {...}}}`` (``memory`` as
``RoleMemory.as_json``). Measured peaks are read from the state folder ``rosterd up``
writes them to (``--state-dir``, default ``$XDG_STATE_HOME/rosterd``).

A fleet whose nodes declare devices (``devices:``), or whose Macs get a default GPU share
for the roster's llama.cpp and mlx_lm roles (``rosterd.devices.pools.with_default_gpu_shares``), is
planned by pool (``rosterd.placement.devices``): under each such node, one line per device
with its roles (resident always, or swapped one at a time) and a bar of its peak against
its capacity (a default share says so, and how to declare another), and each partially
offloaded role with its layer count; ``--json`` adds ``"devices": {node: {device:
{"capacity_bytes": n, "peak_bytes": n, "always_resident": [...], "swappable": [...],
"source": "declared" or "default"}}}`` and ``"device_of": {role: {node: {"device": id or null,
"gpu_layers": n or null, "layers": n or null, "device_bytes": n}}}``. A role's further
copy on another device of a node holding a copy (``replicas:`` on a node with several
GPUs) is named ``ROLE~N`` (N = 2, 3, ...) in its device's line and in ``device_of`` (``chat~2``),
and the copies line says each such copy's device (``on box (CUDA0), box (CUDA1)``). A
fleet without devices plans, prints and exits exactly as before.

Exit status (decided by :mod:`rosterd.cli.edge`): 0 when a plan was made (even with
unplaced roles); 2 on bad input (a clear message naming the file, field and line; with
``--json``, ``{"error": ...}``). The solver, the file readers and Rich are imported when
the command runs, not when ``rosterd`` starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rosterd.cli import app, make_console
from rosterd.cli.edge import errors_as_json
from rosterd.tokens import GB

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from rosterd.fleet import Fleet
    from rosterd.memory.gathering import RosterMemory
    from rosterd.placement import Plan
    from rosterd.placement.devices import DevicePlan
    from rosterd.roster import ImportedRoster
    from rosterd.spec import InferenceSpec

_BAR_WIDTH = 30


def plan_to_json(
    result: Plan, memory: RosterMemory | None = None, devices: DevicePlan | None = None
) -> dict[str, object]:
    """The ``--json`` document for ``result`` (shape in the module docstring; ``memory``
    and ``devices`` only when given)."""
    doc: dict[str, object] = {
        "placements": dict(result.placements),
        "unplaced": [[role, reason] for role, reason in result.unplaced],
        "copies": {role: list(nodes) for role, nodes in result.copies.items()},
        "copies_short": [[role, reason] for role, reason in result.copies_short],
        "nodes": {
            name: {
                "capacity_bytes": node.capacity_bytes,
                "always_resident": list(node.always_resident),
                "swappable": list(node.swappable),
            }
            for name, node in result.nodes.items()
        },
    }
    if memory is not None:
        doc["memory"] = {role: m.as_json() for role, m in memory.roles.items()}
    if devices is not None:
        doc["devices"] = {
            node: {
                device: {
                    "capacity_bytes": pool.capacity_bytes,
                    "peak_bytes": pool.peak_bytes,
                    "always_resident": list(pool.always_resident),
                    "swappable": list(pool.swappable),
                    "source": pool.source,
                }
                for device, pool in pools.items()
            }
            for node, pools in devices.pools.items()
        }
        device_of: dict[str, dict[str, object]] = {}
        for (role, node), choice in devices.choices.items():
            device_of.setdefault(role, {})[node] = {
                "device": choice.device,
                "gpu_layers": choice.gpu_layers,
                "layers": choice.layers,
                "device_bytes": choice.device_bytes,
            }
        doc["device_of"] = device_of
    return doc


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GB:.1f}"


def memory_bar(used: int, capacity: int, width: int = _BAR_WIDTH) -> Text:
    """A bar ``[█████░░░░░]`` of ``used`` over ``capacity`` bytes, then ``used / capacity
    GiB``; green up to 80 %, yellow up to 100 %, red above."""
    from rich.text import Text

    share = used / capacity if capacity > 0 else 1.0
    filled = min(width, round(share * width))
    style = "green" if share <= 0.8 else "yellow" if share <= 1.0 else "red"
    bar = Text("[")
    bar.append("█" * filled, style=style)
    bar.append("░" * (width - filled), style="dim")
    bar.append(f"] {_gib(used)} / {_gib(capacity)} GiB ({share:.0%})")
    return bar


def _render(
    console: Console,
    result: Plan,
    fleet: Fleet,
    roster: ImportedRoster,
    planned: list[InferenceSpec],
    memory: RosterMemory,
    devices: DevicePlan | None = None,
    summary: str = "",
) -> None:
    from rich.table import Table
    from rich.text import Text

    from rosterd.backends.copy_names import unit_names
    from rosterd.memory.gathering import describe

    specs: dict[str, InferenceSpec] = {}
    names: dict[str, str] = {}  # the roster's display name (spec.model drops some, e.g. a:b)
    for s in planned:
        specs.setdefault(s.role, s)
    for imported in roster.specs:
        names.setdefault(imported.spec.role, imported.name)
    console.print(summary, markup=False)
    console.print(f"[bold]{len(fleet.nodes)}[/] node(s); planned by {result.solver}")
    console.print()
    for node in fleet.nodes:
        node_plan = result.nodes[node.name]
        always = [specs[r] for r in node_plan.always_resident]
        swappable = [specs[r] for r in node_plan.swappable]
        interactive_bytes = sum(s.memory.resident_bytes for s in always)
        largest = max((s.memory.resident_bytes for s in swappable), default=0)
        table = Table(
            title=Text(f"{node.name} ({node.platform.value}, {node.address})"),
            title_justify="left",
            expand=False,
        )
        table.add_column("role")
        table.add_column("residency")
        table.add_column("flavor")
        table.add_column("model")
        for column in ("ram_gb", "estimate", "measured", "counts"):
            table.add_column(column, justify="right")
        rows = [(s, "resident always") for s in always] + [(s, "swappable") for s in swappable]
        # a further copy on another of the node's devices: its unit's name, chat~2
        units = unit_names(s.role for s, _ in rows)
        for (s, residency), unit in zip(rows, units, strict=True):
            figures = describe(memory.roles[s.role]) if s.role in memory.roles else ()
            # Text(), not markup: roster names are untrusted and may contain [brackets].
            table.add_row(
                Text(unit),
                residency,
                s.flavor.value,
                Text(names[s.role]),
                *(figures or ("-", "-", "-", _gib(s.memory.resident_bytes))),
            )
        if not always and not swappable:
            table.add_row("[dim](no roles)[/]", "", "", "", "", "", "", "")
        console.print(table)
        console.print(
            Text("peak  ").append(memory_bar(interactive_bytes + largest, node_plan.capacity_bytes))
        )
        console.print(
            f"[dim]peak = resident always {_gib(interactive_bytes)} + largest swappable "
            f"{_gib(largest)} GiB; capacity = {_gib(node.memory_bytes)} - "
            f"{_gib(node.reserved_bytes)} reserved[/]"
        )
        if devices is not None and node.name in devices.pools:
            _render_devices(console, node.name, devices)
        console.print()
    if result.unplaced:
        table = Table(title="unplaced roles", title_justify="left")
        table.add_column("role")
        table.add_column("reason", overflow="fold")
        for role, reason in result.unplaced:
            table.add_row(Text(role), Text(reason))
        console.print(table)
    else:
        console.print("every role is placed")
    for role, nodes in result.copies.items():
        places = devices.copy_places(role) if devices is not None else result.nodes_of(role)
        console.print(Text(f"{role}: {len(nodes) + 1} copies, on {', '.join(places)}"))
    for role, reason in result.copies_short:
        console.print(Text(f"{role}: fewer copies than asked: {reason}"))


def _render_devices(console: Console, node: str, devices: DevicePlan) -> None:
    """Under a node's table: each device pool's roles and peak, then partial offloads."""
    from rich.text import Text

    for device, pool in devices.pools[node].items():
        always = ", ".join(pool.always_resident) or "none"
        swapped = ", ".join(pool.swappable)
        line = Text(f"{device}: ").append(memory_bar(pool.peak_bytes, pool.capacity_bytes))
        line.append(f"; resident always: {always}")
        if swapped:
            line.append(f"; swapped one at a time as room allows: {swapped}")
        if pool.source == "default":
            line.append(
                "; Metal's default GPU share (2/3 of memory up to 36 GiB, 3/4 above; "
                "declare gpu_share_gb to override)"
            )
        console.print(line)
    for (role, where), choice in sorted(devices.choices.items()):
        if where != node:
            continue
        if choice.partial:
            of = f" of {choice.layers}" if choice.layers is not None else ""
            layers = (choice.gpu_layers or 1) - 1
            slowdown = ""
            if choice.layers:
                from rosterd.placement.device_need import partial_slowdown

                times = partial_slowdown(choice.gpu_layers or 0, choice.layers)
                slowdown = f" (expect it about {times:.1f}x slower than all on the device)"
            console.print(
                Text(
                    f"{role}: partial offload (-ngl {choice.gpu_layers}): the output layer and "
                    f"{layers}{of} layers on {choice.device}, the rest on the CPU, which bounds "
                    f"its speed{slowdown}"
                )
            )
        elif choice.device is None:
            console.print(
                Text(f"{role}: on the CPU alone (offload: partial, and no layer fits a device)")
            )


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    roster: Annotated[Path, typer.Argument(help="The roster YAML file (read only).")],
    overlay: Annotated[
        Path | None,
        typer.Option("--overlay", help="Overlay YAML: excludes, latency_class, sticky."),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option("--fleet", help="Fleet YAML (nodes); default: this machine alone."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Solver time limit, seconds.", min=0.01)
    ] = 1.5,
    port: Annotated[
        int | None,
        typer.Option(help="Also check roles against this router port of `rosterd up` (e.g. 8400)."),
    ] = None,
    auto_backend_ports: Annotated[
        bool, typer.Option(help="Plan for `up --auto-backend-ports`: roster ports unused.")
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            help="Where `rosterd up` keeps measured memory peaks "
            "(default: $XDG_STATE_HOME/rosterd).",
        ),
    ] = None,
) -> None:
    """Show which role lives on which node, what stays resident, what swaps, and why any
    role cannot be placed."""
    if as_json:
        errors_as_json(ctx)
    from rosterd.devices.pools import with_default_gpu_shares
    from rosterd.fleet.local import local_fleet
    from rosterd.fleet.reader import load_fleet
    from rosterd.memory.gathering import gather_memory
    from rosterd.placement import plan
    from rosterd.roster.importer import load_roster
    from rosterd.supervisor import default_state_dir
    from rosterd.weights import import_summary, separate_aliases

    out = make_console()  # wide and unwrapped when piped
    nodes = load_fleet(fleet) if fleet is not None else local_fleet()
    as_imported = load_roster(roster, overlay)
    imported = separate_aliases(as_imported, nodes)
    nodes = with_default_gpu_shares(nodes, {s.spec.flavor for s in imported.specs})
    memory = gather_memory(imported, nodes, state_dir or default_state_dir())
    # Warnings go to stderr in both modes, so `--json` keeps stdout one JSON document.
    for warning in [*imported.warnings, *memory.notes, *memory.warnings()]:
        typer.echo(f"warning: {warning}", err=True)
    planned = memory.planning_specs(s.spec for s in imported.specs)
    by_pool = any(n.devices for n in nodes.nodes)
    needs = None
    if by_pool:
        from rosterd.memory.by_pool import device_needs

        needs = device_needs(memory, nodes, {s.spec.role: s.spec.model for s in imported.specs})
    result = plan(
        planned,
        nodes,
        time_limit_s=time_limit,
        memory_notes=memory.reason_notes(),
        device_needs=needs,
    )
    from rosterd.fleet.addresses import is_this_machine

    here = {n.name for n in nodes.nodes if is_this_machine(n.address)}
    if not auto_backend_ports:
        from rosterd.up.config import check_ports

        result = check_ports(result, imported, nodes, router_port=port, router_nodes=here)
    devices = None
    if needs is not None:
        from rosterd.placement.devices import place_on_devices

        devices = place_on_devices(planned, nodes, result, needs)
        result = devices.plan
    for role, node in result.placements.items():
        note = memory.roles[role].estimate_note if role in memory.roles else ""
        if node in here and note.startswith("no estimate: "):
            # What `up` would say at its start: its weights cannot be used on this machine.
            said = note.removeprefix("no estimate: ").removeprefix(f"role {role}: ")
            typer.echo(f"warning: role {role} on node {node}: {said}", err=True)
    if as_json:
        typer.echo(json.dumps(plan_to_json(result, memory, devices), indent=2))
        return
    summary = import_summary(as_imported, imported)
    _render(out, result, nodes, imported, planned, memory, devices, summary)
