"""The nodes of ``/status`` and ``/rosterd/ps`` as JSON, built in this one place (DESIGN.md
layer 7) from the read-only snapshots of the layers below: each node scheduler's
(:class:`~rosterd.scheduler.views.NodeSnapshot`, with the copies of the directory of node
schedulers), the fleet's view of its nodes on a run on Ray
(:class:`~rosterd.fleet_scheduler.views.FleetNodeView`), the backends' measured RSS and
the router's restore checks. Nothing below the router builds or edits this JSON; the live
page (``static/page.js``), ``rosterd ps``, the history's charts and ``/metrics`` read it.

``{name: {"capacity_bytes", "resident_bytes", "resident": [role], "transition",
"lost_reason", "roles": {role: ROLE}, "running", "max_concurrency", "draining"}}``, each
node in fleet order when the fleet's view is given, with its ``address``, ``connected``
and ``connection`` then; ROLE is :class:`~rosterd.scheduler.views.RoleSnapshot`'s fields
(``kv`` as :class:`~rosterd.backends.values.KeptKv`'s plus the last restore check's, see
:meth:`~rosterd.router.restore_check.RestoreCheck.as_json`), ``measured_rss_bytes``
(``None``: not measured), ``kv_summary`` (one cell, :func:`kv_summary`) and, for a role
with more than one copy, ``copies`` (every node holding one) and ``copy_requests``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rosterd.backends.copy_names import role_of_copy
from rosterd.fleet_scheduler.views import FleetNodeView, PlannedRole
from rosterd.router.restore_check import RestoreChecks, kv_summary
from rosterd.scheduler.views import DirectoryNode, RoleSnapshot


@dataclass(frozen=True, slots=True)
class StatusInputs:
    """What the router adds to the schedulers' snapshots: ``measured`` (node -> role ->
    its backend's RSS, bytes), the restore ``checks``, ``visible(role)`` (whether the
    caller's key may see the role) and the fleet's view of its nodes (``None``: a run
    without Ray, where the node schedulers are the whole fleet)."""

    measured: Mapping[str, Mapping[str, int]]
    checks: RestoreChecks | None = None
    visible: Callable[[str], bool] = lambda _role: True
    fleet: Mapping[str, FleetNodeView] | None = None


def nodes_json(
    directory: Mapping[str, DirectoryNode], inputs: StatusInputs
) -> dict[str, dict[str, object]]:
    """``/status``'s ``nodes`` (see the module) from the directory's snapshot and
    ``inputs``."""
    nodes = {name: _node_json(name, entry, inputs) for name, entry in directory.items()}
    if inputs.fleet is None:
        return nodes
    ordered = {
        name: nodes.get(name, _unserved_node_json(view, inputs.visible)) | _fleet_json(view)
        for name, view in inputs.fleet.items()
    }
    return ordered | {name: node for name, node in nodes.items() if name not in ordered}


def _node_json(name: str, entry: DirectoryNode, inputs: StatusInputs) -> dict[str, object]:
    node, visible = entry.node, inputs.visible
    roles: dict[str, object] = {}
    for role, shown in node.roles.items():
        # a key's page lists only the roles it may use (a further copy, chat~2, is its role's)
        if visible(role_of_copy(role)):
            roles[role] = _role_json(name, role, shown, entry, inputs)
    return {
        "capacity_bytes": node.capacity_bytes,
        "resident_bytes": node.resident_bytes,
        "resident": [role for role in node.resident if visible(role_of_copy(role))],
        "transition": node.transition,
        "lost_reason": node.lost_reason,
        "roles": roles,
        "running": node.running,
        "max_concurrency": node.max_concurrency,
        "draining": entry.draining,
        "pools": {
            device: {
                **pool,
                "roles": {r: b for r, b in roles_there.items() if visible(role_of_copy(r))}
                if isinstance(roles_there := pool.get("roles"), dict)
                else roles_there,
            }
            if "roles" in pool
            else dict(pool)
            for device, pool in node.pools.items()
        },
    }


def _role_json(
    node: str, role: str, shown: RoleSnapshot, entry: DirectoryNode, inputs: StatusInputs
) -> dict[str, object]:
    check = inputs.checks.judged(node, role, shown) if inputs.checks is not None else None
    kv: dict[str, object] | None = None
    if shown.kv is not None:
        kv = shown.kv.as_json() | (check.as_json() if check is not None else {})
    out: dict[str, object] = {
        "phase": shown.phase,
        "latency_class": shown.latency_class,
        "sticky": shown.sticky,
        "resident_bytes": shown.resident_bytes,
        "running": shown.running,
        "queued": shown.queued,
        "idle_s": shown.idle_s,
        "loaded_for_s": shown.loaded_for_s,
        "waiting_reason": shown.waiting_reason,
        "waiting_s": shown.waiting_s,
        "last_error": shown.last_error,
        "last_error_age_s": shown.last_error_age_s,
        "load_backoff_s": shown.load_backoff_s,
        "base_url": shown.base_url,
        "pid": shown.pid,
        "restart_pending": shown.restart_pending,
        "unavailable_reason": shown.unavailable_reason,
        "retiring": shown.retiring,
        "memory": dict(shown.memory) if shown.memory is not None else None,
        "kv": kv,
    }
    copies = entry.copies.get(role)
    if copies is not None:
        out["copies"] = list(copies.nodes)
        out["copy_requests"] = copies.requests
    out["measured_rss_bytes"] = inputs.measured.get(node, {}).get(role)
    out["kv_summary"] = kv_summary(shown.kv, check)
    return out


def _fleet_json(view: FleetNodeView) -> dict[str, object]:
    return {"address": view.address, "connected": view.connected, "connection": view.connection}


def _unserved_node_json(view: FleetNodeView, visible: Callable[[str], bool]) -> dict[str, object]:
    """A fleet node no scheduler of this process runs: nothing resident; the roles the
    whole fleet's plan put there, when it is not connected (none known when lost)."""
    if view.planned is None:
        return {}
    return {
        "capacity_bytes": view.capacity_bytes,
        "resident_bytes": 0,
        "resident": [],
        "transition": False,
        "lost_reason": None,
        "roles": {
            role: _planned_role_json(planned)
            for role, planned in view.planned.items()
            if visible(role)
        },
    }


def _planned_role_json(planned: PlannedRole) -> dict[str, object]:
    return {
        "phase": planned.phase,
        "moved_to": planned.moved_to,
        "reason": planned.reason,
        "latency_class": planned.latency_class,
        "sticky": planned.sticky,
        "resident_bytes": planned.resident_bytes,
        "running": 0,
        "queued": 0,
        "idle_s": None,
        "measured_rss_bytes": None,
        "pid": None,
    }
