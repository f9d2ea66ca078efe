"""What ``/status``, ``rosterd ps`` and ``/metrics`` show of the fleet (DESIGN.md layer 6,
pure): read from the fleet machine's state for display only, never to decide.
"""

from __future__ import annotations

from rosterd.fleet.model import Node
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import NodeRun


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


def node_views(machine: FleetMachine) -> dict[str, dict[str, object]]:
    """Per fleet node (fleet order), for a run on Ray: ``address``, ``connected``,
    ``connection`` (how it is run, or why not); a node that does not run also gets
    ``capacity_bytes``, ``resident_bytes`` (0), ``resident``, ``transition``,
    ``lost_reason`` and ``roles`` (the whole fleet's plan's roles for it: ``moved``
    with ``moved_to``, or ``not_connected``)."""
    config = machine.config
    if config is None:
        return {}
    views: dict[str, dict[str, object]] = {}
    for node in config.fleet.nodes:
        status = machine.nodes.get(node.name)
        view: dict[str, object] = {"address": node.address}
        if status is None or status.run is NodeRun.ABSENT:
            reason = status.reason if status is not None else "not matched"
            view |= {"connected": False, "connection": f"not connected: {reason}"}
            view |= _absent_node(machine, node)
        elif status.run is NodeRun.LOST:
            view |= {"connected": False, "connection": status.reason}
        elif status.run is NodeRun.AGENT:
            view |= {"connected": True, "connection": f"on Ray: {status.reason}"}
        else:
            view |= {"connected": True, "connection": "this machine, no Ray node"}
        views[node.name] = view
    return views


def _absent_node(machine: FleetMachine, node: Node) -> dict[str, object]:
    config, full, served = machine.config, machine.full, machine.plan
    assert config is not None
    by_role = config.first_by_role()
    roles: dict[str, object] = {}
    for role, was in full.placements.items() if full is not None else ():
        if was != node.name or role not in by_role:
            continue
        moved_to = served.placements.get(role) if served is not None else None
        [spec] = config.memory.planning_specs([by_role[role].spec])
        roles[role] = {
            "phase": "moved" if moved_to is not None else "not_connected",
            "moved_to": moved_to,
            "reason": machine.moved.get(role),
            "latency_class": spec.latency_class.value,
            "sticky": spec.sticky,
            "resident_bytes": spec.memory.resident_bytes,
            "running": 0,
            "queued": 0,
            "idle_s": None,
            "measured_rss_bytes": None,
            "pid": None,
        }
    return {
        "capacity_bytes": node.capacity_bytes,
        "resident_bytes": 0,
        "resident": [],
        "transition": False,
        "lost_reason": None,
        "roles": roles,
    }
