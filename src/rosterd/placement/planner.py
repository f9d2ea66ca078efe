"""The placement entry points (layer 3: pure): :func:`plan`, :func:`greedy_plan`,
:func:`score` and :func:`violations`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rosterd.fleet import Fleet
from rosterd.placement.copies import place_copies
from rosterd.placement.device_need import devices_for
from rosterd.placement.greedy import best_greedy
from rosterd.placement.problem import (
    NodeLoad,
    Plan,
    PlanScore,
    Problem,
    build_plan,
    fill,
    score_of,
)
from rosterd.spec import InferenceSpec

if TYPE_CHECKING:
    from rosterd.placement.device_need import DeviceNeed


def plan(
    specs: Sequence[InferenceSpec],
    fleet: Fleet,
    previous: Plan | None = None,
    *,
    time_limit_s: float = 1.5,
    memory_notes: Mapping[str, str] | None = None,
    device_needs: Mapping[str, DeviceNeed] | None = None,
) -> Plan:
    """Place ``specs`` on ``fleet``'s nodes (see the module docstring for the rules).

    ``previous`` is the plan in force (its sticky roles stay put when they can);
    ``time_limit_s`` bounds the solver's wall time in seconds (greedy and checks add
    a few milliseconds); ``memory_notes`` (role -> words) follow a role's figure in
    its unplaced reason, e.g. that it was counted from a measured peak and what the
    roster's ``ram_gb`` says; ``device_needs`` (role -> what it needs on a device) keep
    a role off nodes whose devices could never hold it (its device is chosen after, by
    ``rosterd.placement.devices.place_on_devices``, which moves a role whose node's
    devices are full to another node's device). Never raises for
    unplaceable roles: each is in ``Plan.unplaced`` with its reason.
    """
    from rosterd.placement import cpsat  # OR-Tools: only when a plan is solved

    problem = Problem(specs, fleet, previous, memory_notes, device_needs)
    greedy = best_greedy(problem)
    greedy_score = score_of(problem, greedy)
    if not problem.eligible:
        return _with_copies(problem, greedy, "trivial", previous)
    candidates = cpsat.narrow(problem, greedy)
    solved = cpsat.solve(problem, greedy, time_limit_s, candidates)
    if solved is not None:
        assignment, optimal = solved
        assignment = fill(problem, assignment)
        if score_of(problem, assignment).key() >= greedy_score.key():
            if candidates is not None:
                how = "cp-sat (narrowed)"
            else:
                how = "cp-sat (optimal)" if optimal else "cp-sat (time limit)"
            return _with_copies(problem, assignment, how, previous)
    return _with_copies(problem, greedy, "greedy", previous)


def _with_copies(
    problem: Problem, assignment: Mapping[str, int], solver: str, previous: Plan | None
) -> Plan:
    """The plan of ``assignment`` with the further copies of roles with replicas."""
    copies, short = place_copies(problem, assignment, previous.copies if previous else {})
    return build_plan(problem, assignment, solver, copies, short)


def greedy_plan(specs: Sequence[InferenceSpec], fleet: Fleet, previous: Plan | None = None) -> Plan:
    """The greedy fallback alone (same constraints and reasons, no solver): the best,
    by the plan objective, of four passes (interactive roles first or all roles by
    size; nodes spread or packed), each putting sticky roles back on their previous
    node when they fit and biggest roles first. For benchmarks and tests;
    :func:`plan` uses it as the solver's hint and as its fallback."""
    problem = Problem(specs, fleet, previous)
    return _with_copies(problem, best_greedy(problem), "greedy", previous)


def score(
    specs: Sequence[InferenceSpec], fleet: Fleet, result: Plan, previous: Plan | None = None
) -> PlanScore:
    """The objective levels of ``result`` for these inputs (see the module docstring)."""
    problem = Problem(specs, fleet, previous)
    assignment = {
        role: problem.node_index[node]
        for role, node in result.placements.items()
        if role in problem.spec and node in problem.node_index
    }
    return score_of(problem, assignment)


def violations(specs: Sequence[InferenceSpec], fleet: Fleet, result: Plan) -> list[str]:
    """Hard constraints ``result`` breaks, as sentences (empty when the plan is valid):
    unknown node, flavor not run, interactive + largest batch over capacity, an
    interactive role sharing a node with a role it excludes, two copies of a role on one
    node (more than one only where the node has a device for each)."""
    problem = Problem(specs, fleet, None)
    loads = [NodeLoad(n) for n in problem.nodes]
    problems: list[str] = []
    for role, copy_nodes in result.copies.items():
        held = result.nodes_of(role)
        s = problem.spec.get(role)
        for name in sorted(set(held)):
            node = problem.nodes[problem.node_index[name]] if name in problem.node_index else None
            devices = len(devices_for(s, node)) if s is not None and node is not None else 0
            if held.count(name) > max(1, devices):
                problems.append(
                    f"{role} has more copies on {name} than devices for them: "
                    f"{', '.join(copy_nodes)}"
                )
    for role, node_name in result.copy_pairs():
        s = problem.spec.get(role)
        idx = problem.node_index.get(node_name)
        if s is None or idx is None:
            problems.append(f"{role} placed on unknown node or unknown role: {node_name}")
            continue
        if s.flavor not in problem.nodes[idx].flavors:
            problems.append(f"{role} ({s.flavor.value}) on {node_name}, which does not run it")
        clash = loads[idx].excluded_by(s)
        if clash:
            problems.append(f"{role} shares {node_name} with excluded {', '.join(clash)}")
        loads[idx].add(s)
    for node, load in zip(problem.nodes, loads, strict=True):
        if load.interactive + load.batch_max > load.capacity:
            problems.append(
                f"{node.name}: interactive {load.interactive} + largest batch "
                f"{load.batch_max} > capacity {load.capacity}"
            )
    return problems


# -- internals -------------------------------------------------------------------
