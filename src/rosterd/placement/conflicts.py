"""Port conflicts of a plan (layer 3: pure; no I/O, clock, logging or environment).

Two backends cannot listen on one port of one machine, and no backend can
listen on the port rosterd's own router serves. The roster gives each entry a
port, so two entries with different models on the same port, or a role on the
router's port, used to be imported and planned without a word and fail only at
load time. :func:`without_port_conflicts` finds them in a plan: walking the
placements in roster order, the first role keeps its port and each later one
that collides is moved to the plan's unplaced roles with a reason naming both.

Roles of a flavor with one shared server per node (ollama) share that server's
port by design: they collide only with other flavors. With
``rosterd up --auto-backend-ports`` the roster's ports are not used, so the
caller does not check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from rosterd.placement.problem import NodePlan, Plan
from rosterd.spec import InferenceSpec, InferFlavor

_FIX = "or run rosterd up with --auto-backend-ports"


def port_conflicts(
    result: Plan,
    specs: Iterable[InferenceSpec],
    *,
    router_port: int | None,
    router_nodes: Collection[str],
    shared_flavors: Collection[InferFlavor] = (),
) -> list[tuple[str, str]]:
    """``(role, reason)`` for each placed role whose port collides, in placement order.

    ``specs``: the roles planned (the first spec of a role id counts);
    ``router_port``: the port rosterd's router listens on (``None``: not
    checked), on the nodes named in ``router_nodes`` (the nodes of this
    machine); ``shared_flavors``: flavors whose roles share one server per node.
    """
    by_role: dict[str, InferenceSpec] = {}
    for given in specs:
        by_role.setdefault(given.role, given)
    taken: dict[tuple[str, int], InferenceSpec] = {}
    conflicts: list[tuple[str, str]] = []
    for role, node in result.placements.items():
        spec = by_role.get(role)
        port = spec.serve.port if spec is not None else None
        if spec is None or port is None:
            continue
        if router_port is not None and port == router_port and node in router_nodes:
            conflicts.append(
                (
                    role,
                    f"port {port} on node {node} is rosterd's own router port (--port); "
                    f"give {role} another port, {_FIX}",
                )
            )
            continue
        holder = taken.get((node, port))
        if holder is None:
            taken[(node, port)] = spec
            continue
        if holder.flavor == spec.flavor and spec.flavor in shared_flavors:
            continue  # one shared server serves both
        conflicts.append(
            (
                role,
                f"port {port} on node {node} is taken by role {holder.role}, placed before it; "
                f"two backends cannot listen on one port: give {role} or {holder.role} "
                f"another port, {_FIX}",
            )
        )
    return conflicts


def without_port_conflicts(
    result: Plan,
    specs: Iterable[InferenceSpec],
    *,
    router_port: int | None,
    router_nodes: Collection[str],
    shared_flavors: Collection[InferFlavor] = (),
) -> Plan:
    """``result`` with every role of :func:`port_conflicts` unplaced, with its reason (added
    after the plan's own unplaced roles); ``result`` itself when nothing collides."""
    conflicts = port_conflicts(
        result,
        specs,
        router_port=router_port,
        router_nodes=router_nodes,
        shared_flavors=shared_flavors,
    )
    if not conflicts:
        return result
    dropped = {role for role, _ in conflicts}
    nodes = {
        name: NodePlan(
            node.capacity_bytes,
            tuple(r for r in node.always_resident if r not in dropped),
            tuple(r for r in node.swappable if r not in dropped),
        )
        for name, node in result.nodes.items()
    }
    return dataclasses.replace(
        result,
        placements={r: n for r, n in result.placements.items() if r not in dropped},
        unplaced=(*result.unplaced, *conflicts),
        nodes=nodes,
    )
