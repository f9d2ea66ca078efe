"""What a plan serves, node by node, and why a name is not served (DESIGN.md layer 6, pure).

:func:`node_serving` is the one node-config builder: what a plan gives one node
(its roles with their figures on it, the roles it cannot serve, the figures
``/status`` shows, its concurrency), for a node this machine runs and a node
agent's alike. The rest are the words of a change: why a name is not served
(:func:`unserved_reasons`), why a role is not where the whole fleet's plan put it
(:func:`replanned_reasons`), why a reload stopped serving a role
(:func:`retired_reasons`), what a change did (:func:`change_summary`), and what
a change would take from a role that is served (:func:`lost_weights`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

from rosterd.backends.copy_names import copy_unit_name, role_of_copy
from rosterd.fleet.model import Node
from rosterd.fleet_scheduler.values import NodeRun, NodeServing, ServedConfig
from rosterd.placement.problem import Plan
from rosterd.scheduler.values import NodeConcurrency
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB


def node_serving(
    config: ServedConfig,
    placements: Mapping[str, str],
    node: Node,
    run: NodeRun,
    copies: Mapping[str, tuple[str, ...]] | None = None,
) -> NodeServing:
    """What ``placements`` (role -> node) and ``copies`` (role -> the nodes of its further
    copies, ``Plan.copies``) give ``node`` under ``config``: the roles placed
    there, each counting its figure on that node (a node that ``copies`` names more than
    once holds a copy per device: the further ones are units of their own, ``chat~2``);
    on a node this machine runs
    (``run`` ``LOCAL``), the roles whose weights this machine cannot use are
    unavailable (an agent resolves its weights on its own node, at each start)."""
    by_role = config.first_by_role()
    specs = {r: by_role[r].spec for r, n in placements.items() if n == node.name and r in by_role}
    further: dict[str, int] = {}  # role -> its copies here past the first
    for role, nodes in (copies or {}).items():
        if node.name in nodes and role in by_role and role in placements:
            further[role] = nodes.count(node.name) - (0 if role in specs else 1)
            specs[role] = by_role[role].spec
    specs = config.memory.node_specs(specs, node.name)
    # A node holding several copies of a role, each on a device of its own, serves each
    # further one as a unit of its own: chat~2, chat~3 (rosterd.backends.copy_names).
    for role, count in further.items():
        for nth in range(2, count + 2):
            specs[copy_unit_name(role, nth)] = dataclasses.replace(
                specs[role], role=copy_unit_name(role, nth)
            )
    unavailable = (
        {u: why for u in specs if (why := config.unavailable_here.get(role_of_copy(u)))}
        if run is NodeRun.LOCAL
        else {}
    )
    slots = config.memory.slots()
    slots.update({u: slots[role_of_copy(u)] for u in specs if role_of_copy(u) in slots})
    figures: dict[str, Mapping[str, object]] = {}
    for role in specs:
        shown = config.memory.role_json(role_of_copy(role), node.name)
        if shown is not None:
            figures[role] = shown
    return NodeServing(
        node.name,
        node.capacity_bytes,
        specs,
        unavailable,
        figures,
        NodeConcurrency(node.max_concurrency, slots, slot_caps(specs, slots)),
        run,
    )


def slot_caps(specs: Mapping[str, InferenceSpec], slots: Mapping[str, int]) -> dict[str, int]:
    """Role -> the requests in flight its backend serves at once: the ``parallel``
    slots of a llama.cpp role (llama-server queues the rest inside, where rosterd
    cannot count or cut them). Other flavors have no fixed slots rosterd launches
    them with (ollama has its own ``OLLAMA_NUM_PARALLEL``), so they are not named."""
    return {
        role: slots[role]
        for role, spec in specs.items()
        if spec.flavor.facts.launched_slots and role in slots
    }


#: How :func:`unserved_reasons` begins the reason of a roster entry the import skipped (no
#: role at all, a 404), as against a role the plan left unplaced (a 503).
SKIPPED_IN_ROSTER = "skipped in the roster: "


def unserved_reasons(
    result: Plan, config: ServedConfig, served_nodes: Iterable[str]
) -> dict[str, str]:
    """Name (role id, roster model name, alias) -> why it is not served: the plan's reason
    for an unplaced role, the node it is planned on when that node does not run, or why
    the import skipped a roster entry. Roles served are left out."""
    served = set(served_nodes)
    why: dict[str, str] = {}
    for role, reason in result.unplaced:
        if role not in result.placements:  # a duplicate id's first entry is placed
            why.setdefault(role, f"unplaced: {reason}")
    for role, node in result.placements.items():
        if node not in served:
            why[role] = f"planned on node {node}, which this process does not run"
    by_role = config.first_by_role()
    out = dict(why)
    for role, reason in why.items():
        s = by_role.get(role)
        for name in (s.spec.model, s.name) if s is not None else ():
            if name:
                out.setdefault(name, reason)
    for alias, role in config.roster.aliases.items():
        if role in why:
            out.setdefault(alias, why[role])
    for entry_id, reason in config.roster.skipped:
        out.setdefault(entry_id, f"{SKIPPED_IN_ROSTER}{reason}")
    return out


def replanned_reasons(full: Plan, served: Plan, gone: Mapping[str, str]) -> dict[str, str]:
    """Role -> why it is not where the whole fleet's plan (``full``) put it, when ``served``
    (the plan of the nodes that run) puts it elsewhere or nowhere.

    ``gone``: node -> why it does not run. A role of such a node is "planned on node
    Y: node X is not connected (why)" or, when it fits nowhere that runs, "node X is
    not connected (why) and it does not fit on the connected nodes: <the plan's
    reason>"; a role moved between running nodes by the plan without the absent
    ones says so too. Roles that stayed are left out.
    """
    unplaced = dict(served.unplaced)
    absent = ", ".join(sorted(gone))
    why: dict[str, str] = {}
    for role, was in full.placements.items():
        now = served.placements.get(role)
        if now == was:
            continue
        if was in gone:
            reason = f"node {was} is not connected ({gone[was]})"
            if now is not None:
                why[role] = f"planned on node {now}: {reason}"
            else:
                why[role] = f"{reason} and it does not fit on the connected nodes: " + unplaced.get(
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


def copies_after_loss(new: Plan, placements: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Role -> the nodes of its further copies once nodes are lost: ``new``'s copies (made on
    the nodes left), without the node a role is placed on when that is not ``new``'s (a
    role of a lost node kept there); a further copy on another device of the node ``new``
    placed the role on stays."""
    return {
        role: kept
        for role, nodes in new.copies.items()
        if (
            kept := tuple(
                n for n in nodes if n != placements.get(role) or new.placements.get(role) == n
            )
        )
    }


def placements_after_loss(in_force: Plan, new: Plan, lost: Collection[str]) -> dict[str, str]:
    """Role -> node once the nodes ``lost`` are gone: where ``new`` (the plan of the nodes
    left, made with ``in_force`` as the plan to keep) puts each role; a role of a lost
    node that ``new`` places nowhere stays lost there (its requests wait for it, naming
    the loss). A role ``new`` leaves out from a node that runs is left out: the plan
    made room there for what moved in (an interactive role before a batch one)."""
    placements = dict(new.placements)
    for role, was in in_force.placements.items():
        if role not in placements and was in lost:
            placements[role] = was
    return placements


def retired_reasons(
    change: Mapping[str, object], config: ServedConfig, result: Plan
) -> dict[str, str]:
    """Role -> why a reload stopped serving it, for each role it retired and did not place
    elsewhere: the import's reason for skipping it, or the plan's for leaving it unplaced;
    for a further copy of a role still placed (``chat~2``), that the plan no longer places
    it, with the plan's ``copies_short`` reason."""
    nodes = change.get("nodes")
    retired = {
        role
        for node in (nodes.values() if isinstance(nodes, dict) else ())
        if isinstance(node, dict)
        for role in node.get("retired", ())
    }
    skipped, unplaced = dict(config.roster.skipped), dict(result.unplaced)
    short = dict(result.copies_short)
    why: dict[str, str] = {}
    for role in sorted(retired - set(result.placements)):
        of = role_of_copy(role)
        if of != role:  # a further copy on another device of its node (chat~2)
            if of in result.placements:
                lost = f": {short[of]}" if of in short else ""
                why[role] = f"a copy of {of} the new plan no longer places{lost}"
            continue  # the role itself left: its own reason says why
        if role in skipped:
            why[role] = f"the roster import skips it: {skipped[role]}"
        elif role in unplaced:
            why[role] = f"unplaced: {unplaced[role]}"
        else:
            why[role] = "no longer in the roster"
    return why


def restarted_roles(old: ServedConfig, new: ServedConfig) -> tuple[str, ...]:
    """Roles of both whose launch changed outside their spec (weights, ``ctx_size``,
    ``parallel``, ``extra_args``: their ``launch`` words), so they restart once idle."""
    before, after = old.launch, new.launch
    return tuple(sorted(r for r, words in after.items() if r in before and before[r] != words))


def lost_weights(old: Mapping[str, NodeServing], new: Mapping[str, NodeServing]) -> dict[str, str]:
    """Role -> why, for each role ``new`` serves as unavailable (weights it cannot use)
    that ``old`` did not: a change that would stop a running backend for a role that
    cannot start again (at start such a role is served as unavailable instead)."""
    before = {r for serving in old.values() for r in serving.unavailable}
    return {
        role: why
        for serving in new.values()
        for role, why in serving.unavailable.items()
        if role not in before
    }


def warm_up_order(specs: Mapping[str, InferenceSpec]) -> list[str]:
    """Roles to load at start: interactive first, then sticky batch roles, biggest first."""
    chosen = [s for s in specs.values() if s.interactive or s.sticky]
    chosen.sort(key=lambda s: (not s.interactive, -s.memory.resident_bytes, s.role))
    return [s.role for s in chosen]


def change_summary(change: Mapping[str, object]) -> str:
    """What a change (``PlanChange.as_json``) did, in words for the log."""
    if not change.get("changed"):
        return "nothing changed"
    parts: list[str] = []
    nodes = change.get("nodes")
    for name, node in (nodes if isinstance(nodes, dict) else {}).items():
        said = [
            f"{k} {', '.join(node[k])}"
            for k in ("added", "retired", "restarted", "updated")
            if node.get(k)
        ]
        capacity = node.get("capacity_bytes")
        if isinstance(capacity, list):
            said.append(f"capacity {capacity[0] / GB:.2f} -> {capacity[1] / GB:.2f} GiB")
        devices = node.get("device_capacity_bytes")
        for device, (before, after) in (devices if isinstance(devices, dict) else {}).items():
            said.append(f"device {device} capacity {before / GB:.2f} -> {after / GB:.2f} GiB")
        if said:
            parts.append(f"node {name}: {'; '.join(said)}")
    for key in ("added_nodes", "drained_nodes"):
        value = change.get(key)
        if isinstance(value, list) and value:
            parts.append(f"{key.replace('_', ' ')}: {', '.join(value)}")
    return "; ".join(parts)


def added_roles(change: Mapping[str, object]) -> set[str]:
    """The roles a change (``PlanChange.as_json``) added on some node."""
    nodes = change.get("nodes")
    added: set[str] = set()
    for node in (nodes if isinstance(nodes, dict) else {}).values():
        if isinstance(node, dict):
            added.update(node.get("added") or ())
    return added
