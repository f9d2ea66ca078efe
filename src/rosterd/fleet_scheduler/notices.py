"""What the fleet tells the operator (DESIGN.md layer 6, pure): the words of the fleet
machine's ``Say``, ``ShowPlan`` and ``Record`` effects, as functions of its values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rosterd.fleet_scheduler.effects import FleetEffect, Level, Record, Say, ShowPlan
from rosterd.fleet_scheduler.values import NodeRun, NodeServing, NodeStatus, ServedConfig
from rosterd.placement.problem import Plan


def where(status: NodeStatus) -> str:
    """How a node is run, in words, for the printed plan."""
    if status.run is NodeRun.AGENT:
        return f"on Ray: {status.reason}"
    if status.run is NodeRun.LOCAL:
        return "this machine, no Ray node"
    if status.run is NodeRun.LOST:
        return status.reason
    return f"not connected: {status.reason}"


def start_notices(
    plan: Plan,
    full: Plan,
    config: ServedConfig,
    nodes: Mapping[str, NodeStatus],
    moved: Mapping[str, str],
    *,
    on_ray: bool,
) -> list[FleetEffect]:
    """What the start shows: the plan, then each node nothing runs, with its roles' fate."""
    local = tuple(n for n, s in nodes.items() if s.run is NodeRun.LOCAL)
    shown = {name: where(s) for name, s in nodes.items()} if on_ray else None
    effects: list[FleetEffect] = [ShowPlan(plan, config, local, shown, dict(moved))]
    for name, status in nodes.items():
        if status.run is not NodeRun.ABSENT:
            continue
        if not on_ray:
            effects.append(
                Say(
                    Level.NOTICE,
                    f"node {name} at {status.address} is not this machine: its roles are "
                    "planned but not started here (to run them too, serve the fleet on "
                    "Ray: --ray-address)",
                )
            )
            continue
        said = f"node {name} is not connected to the Ray cluster: {status.reason}"
        effects.append(Say(Level.NOTICE, said))
        for role, was in full.placements.items():
            if was == name and role in moved:
                effects.append(Say(Level.INFO, f"  role {role}: {moved[role]}"))
    return effects


def unavailable_notices(
    before: Mapping[str, NodeServing], after: Mapping[str, NodeServing]
) -> list[FleetEffect]:
    """Each role ``after`` serves as unavailable that ``before`` did not, once."""
    known = {r for s in before.values() for r in s.unavailable}
    return [
        Say(Level.ERROR, f"role {role} is unavailable (requests get 503): {why}")
        for serving in after.values()
        for role, why in sorted(serving.unavailable.items())
        if role not in known
    ]


def loss_records(
    lost: Mapping[str, str], plan: Plan, moved: Mapping[str, object]
) -> list[FleetEffect]:
    """What a re-plan after losing the nodes ``lost`` (node -> why) did, role by role:
    each role ``moved`` (role -> ``[from, to]``, as ``PlanChange.as_json`` gives it) and
    each role that stays lost on its node in ``plan`` (no remaining node could take it)."""
    effects: list[FleetEffect] = []
    after = "a re-plan after " + "; ".join(lost[n] for n in sorted(lost))
    for role, pair in sorted(moved.items()):
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        old, to = str(pair[0]), str(pair[1])
        cause = f"moved to node {to}: " + lost.get(old, after)
        effects.append(Record(old if old in lost else to, "moved", role, cause))
    unplaced = dict(plan.unplaced)
    for role, was in sorted(plan.placements.items()):
        if was in lost:
            cause = f"{lost[was]}, and it does not fit on the remaining nodes: " + unplaced.get(
                role, "no remaining node runs it"
            )
            effects.append(Record(was, "unplaced", role, cause))
    return effects


def failures(what: str, failed: Mapping[str, str]) -> str:
    """The failures of some nodes, in one sentence."""
    return "; ".join(f"node {node} {what}: {why}" for node, why in sorted(failed.items()))


def lost_weights_refusal(lost: Mapping[str, str]) -> str:
    """Why a change that takes usable weights from a served role is refused."""
    said = "; ".join(
        why if why.startswith(f"role {role}:") else f"role {role}: {why}"
        for role, why in sorted(lost.items())
    )
    return f"{said}; the running configuration stays"


def empty_lab_refusal(config: ServedConfig, unplaced: Sequence[tuple[str, str]] = ()) -> str:
    """Why a configuration that serves no role is refused: the roster's own warnings (the
    cause: no ``roster:`` key, no entries, ...) in full, the overlay's settings that now
    name no entry (a consequence) only counted, and why the new plan leaves each role out
    (``unplaced``: role, reason; a device made too small, say), the first three in full."""
    said = "the new configuration serves no role"
    causes = [w for w in config.roster.warnings if not w.startswith("overlay")]
    consequences = len(config.roster.warnings) - len(causes)
    if consequences:
        causes.append(f"and {consequences} overlay warnings of settings that name no entry")
    causes += [f"{role} is unplaced: {reason}" for role, reason in unplaced[:3]]
    if len(unplaced) > 3:
        causes.append(f"and {len(unplaced) - 3} more roles unplaced (rosterd plan says why)")
    if causes:
        said += ": " + "; ".join(causes)
    return (
        f"{said}. The running configuration stays; to serve nothing on purpose, "
        "reload with --force (rosterd reload --force, or POST /rosterd/reload?force=true)"
    )
