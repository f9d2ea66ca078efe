"""What ``/status``, ``rosterd ps`` and ``/metrics`` show of the fleet (DESIGN.md layer 6,
pure): read from the fleet machine's state for display only, never to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rosterd.fleet.model import Node
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import NodeRun
from rosterd.scheduler.views import LATENCY_CLASS_NAME, LatencyClassName


def fleet_status(machine: FleetMachine) -> dict[str, object]:
    """What ``/status`` adds to the node schedulers' view: ``unplaced`` (``[role,
    reason]`` of the plan in force), ``remote_nodes`` (fleet nodes no scheduler of this
    process runs: ``{"node", "address", "served_here": false}``), ``plan_solver``, and
    with Ray ``ray_address`` and ``moved`` (role -> why it is not where the whole
    fleet's plan put it), ``replicas`` (role -> the nodes of its copies in the plan, for
    each role with more than one) and ``replicas_short`` (role -> why fewer copies than its
    ``replicas:`` asks were placed). ``{}`` before the first configuration is served."""
    config, result = machine.config, machine.plan
    if config is None or result is None:
        return {}
    extra: dict[str, object] = {
        "unplaced": [list(u) for u in result.unplaced],
        "remote_nodes": [
            {"node": n.name, "address": n.address, "served_here": False}
            for n in config.fleet.nodes
            if n.name not in machine.serving
        ],
        "plan_solver": result.solver,
        "replicas": {role: list(result.nodes_of(role)) for role in result.copies},
        "replicas_short": dict(result.copies_short),
    }
    if machine.ray_address is not None:
        extra["ray_address"] = machine.ray_address
        extra["moved"] = dict(machine.moved)
    return extra


@dataclass(frozen=True, slots=True)
class PlannedRole:
    """A role the whole fleet's plan put on a node that does not run: ``moved`` to
    ``moved_to`` (``reason``: why) or ``not_connected`` (it fits nowhere else), with the
    spec's figures it was planned with."""

    phase: Literal["moved", "not_connected"]
    moved_to: str | None
    reason: str | None
    latency_class: LatencyClassName
    sticky: bool
    resident_bytes: int


@dataclass(frozen=True, slots=True)
class FleetNodeView:
    """A fleet node as a run on Ray sees it: its ``address``, whether it is ``connected``
    and how it is run (``connection``: on Ray, this machine, or why not); for a node that
    does not run, its budget (``capacity_bytes``) and the roles the whole fleet's plan put
    there (``planned``; ``None`` for a node that runs, whose scheduler shows its own)."""

    address: str
    connected: bool
    connection: str
    capacity_bytes: int | None = None
    planned: Mapping[str, PlannedRole] | None = None


def node_views(machine: FleetMachine) -> dict[str, FleetNodeView]:
    """Per fleet node (fleet order), for a run on Ray: see :class:`FleetNodeView`."""
    config = machine.config
    if config is None:
        return {}
    views: dict[str, FleetNodeView] = {}
    for node in config.fleet.nodes:
        status = machine.nodes.get(node.name)
        if status is None or status.run is NodeRun.ABSENT:
            reason = status.reason if status is not None else "not matched"
            view = FleetNodeView(
                node.address,
                connected=False,
                connection=f"not connected: {reason}",
                capacity_bytes=node.capacity_bytes,
                planned=_planned_roles(machine, node),
            )
        elif status.run is NodeRun.LOST:
            view = FleetNodeView(node.address, connected=False, connection=status.reason)
        elif status.run is NodeRun.AGENT:
            view = FleetNodeView(node.address, True, f"on Ray: {status.reason}")
        else:
            view = FleetNodeView(node.address, True, "this machine, no Ray node")
        views[node.name] = view
    return views


def _planned_roles(machine: FleetMachine, node: Node) -> dict[str, PlannedRole]:
    config, full, served = machine.config, machine.full, machine.plan
    assert config is not None
    by_role = config.first_by_role()
    roles: dict[str, PlannedRole] = {}
    for role, was in full.placements.items() if full is not None else ():
        if was != node.name or role not in by_role:
            continue
        moved_to = served.placements.get(role) if served is not None else None
        [spec] = config.memory.planning_specs([by_role[role].spec])
        roles[role] = PlannedRole(
            phase="moved" if moved_to is not None else "not_connected",
            moved_to=moved_to,
            reason=machine.moved.get(role),
            latency_class=LATENCY_CLASS_NAME[spec.latency_class],
            sticky=spec.sticky,
            resident_bytes=spec.memory.resident_bytes,
        )
    return roles
