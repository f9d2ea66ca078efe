"""What a run on Ray shows of its fleet's nodes (layer 8): one view per fleet node, connected
or not, for ``/status``, ``rosterd ps`` and ``/metrics`` (beside the node schedulers' own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rosterd.fleet import Node

if TYPE_CHECKING:
    from rosterd.up.ray_fleet import ServedPlan, UpFleet


def node_views(ray: UpFleet) -> dict[str, dict[str, object]]:
    """Per fleet node (fleet order): ``address``, ``connected``, ``connection`` (how it is
    run, or why not); a node that does not run also gets ``capacity_bytes``,
    ``resident_bytes`` (0), ``resident``, ``roles`` (the whole fleet's plan's roles
    for it: ``moved`` with ``moved_to``, or ``not_connected``) and ``lost_reason``."""
    views: dict[str, dict[str, object]] = {}
    absent = ray.not_connected()
    served = ray.served
    for node in ray.fleet.nodes:
        conn = ray.ray_fleet.connection(node.name)
        view: dict[str, object] = {"address": node.address}
        if node.name in ray.lost:
            view |= {"connected": False, "connection": ray.lost[node.name]}
        elif node.name in absent:
            view |= {"connected": False, "connection": f"not connected: {conn.reason}"}
            view |= _absent_node(node, served)
        elif conn.connected:
            view |= {"connected": True, "connection": f"on Ray: {conn.reason}"}
        else:
            view |= {"connected": True, "connection": "this machine, no Ray node"}
        views[node.name] = view
    return views


def _absent_node(node: Node, served: ServedPlan | None) -> dict[str, object]:
    roles: dict[str, object] = {}
    for role, was in served.full.placements.items() if served else ():
        if was != node.name:
            continue
        assert served is not None
        moved_to = served.plan.placements.get(role)
        spec = served.specs[role]
        roles[role] = {
            "phase": "moved" if moved_to is not None else "not_connected",
            "moved_to": moved_to,
            "reason": served.moved.get(role),
            "latency_class": spec.latency_class.value,
            "sticky": spec.sticky,
            "resident_bytes": spec.memory.resident_bytes,
            "in_flight": 0,
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
