"""The further copies of roles with replicas (layer 3: pure).

A fleet ``models:`` entry with ``replicas: N`` asks for N copies of its role, each on
its own node. The solver (or greedy) places every role's first copy; then
:func:`place_copies` adds the others, so a second copy never takes the room of a
role that has none. Each copy counts its role's memory on its node and is held to
the node's flavors, budget and exclusions as any role is (``NodeLoad``). Sticky
roles keep their copies' nodes of the plan in force where they still fit; the other
copies go where the most room is left (spread, ties by fleet order). When fewer than
N fit, the plan says why for the rest (``Plan.copies_short``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rosterd.placement.device_need import gb_text
from rosterd.placement.problem import NodeLoad, Problem, greedy_order, node_loads
from rosterd.spec import InferenceSpec


def place_copies(
    problem: Problem,
    assignment: Mapping[str, int],
    previous_copies: Mapping[str, Sequence[str]],
) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """The further copies of each placed role that asks for replicas, and why some are missing.

    ``assignment``: role -> node index of its first copy; ``previous_copies``: role ->
    the nodes of its further copies in the plan in force. Returns (role -> node indexes
    of its further copies, in the order placed; role -> why fewer than asked were
    placed). Roles are taken in greedy order (interactive first, biggest first).
    """
    loads = node_loads(problem, assignment)
    copies: dict[str, tuple[int, ...]] = {}
    short: dict[str, str] = {}
    for s in greedy_order(problem):
        wanted = problem.fleet.replicas_of(s.role, s.model) - 1
        if wanted <= 0 or s.role not in assignment:
            continue
        placed: list[int] = []
        held = {assignment[s.role]}
        kept = [
            problem.node_index[n]
            for n in previous_copies.get(s.role, ())
            if s.sticky and n in problem.node_index
        ]
        for i in [*kept, *_by_room(problem, s, loads)]:
            if len(placed) == wanted:
                break
            if i in held or i not in problem.eligible[s.role]:
                continue
            if loads[i].fits(s) and not loads[i].excluded_by(s):
                loads[i].add(s)
                placed.append(i)
                held.add(i)
        if placed:
            copies[s.role] = tuple(placed)
        if len(placed) < wanted:
            short[s.role] = _short_reason(problem, s, loads, held, wanted + 1)
    return copies, short


def _by_room(problem: Problem, s: InferenceSpec, loads: Sequence[NodeLoad]) -> list[int]:
    """The nodes that run ``s``, the most room left first (ties by fleet order)."""
    return sorted(problem.eligible.get(s.role, ()), key=lambda i: (-loads[i].headroom(), i))


def _short_reason(
    problem: Problem, s: InferenceSpec, loads: Sequence[NodeLoad], held: set[int], asked: int
) -> str:
    """Why only ``len(held)`` of ``asked`` copies of ``s`` were placed: each other node's
    reason (no flavor, too small, excluded, full)."""
    notes: list[str] = []
    for i, node in enumerate(problem.nodes):
        if i in held:
            continue
        load = loads[i]
        if s.flavor not in node.flavors:
            notes.append(f"{node.name}: does not run {s.flavor.value}")
        elif clash := load.excluded_by(s):
            notes.append(f"{node.name}: excluded by {', '.join(clash)} placed there")
        elif s.interactive:
            notes.append(
                f"{node.name}: interactive {gb_text(load.interactive)} + this "
                f"{gb_text(s.memory.resident_bytes)} + largest batch {gb_text(load.batch_max)} "
                f"> capacity {gb_text(load.capacity)}"
            )
        else:
            notes.append(
                f"{node.name}: interactive {gb_text(load.interactive)} + this "
                f"{gb_text(s.memory.resident_bytes)} > capacity {gb_text(load.capacity)}"
            )
    where = "; ".join(notes) if notes else "the fleet has no other node"
    return f"{len(held)} of {asked} copies placed (each copy needs a node of its own): {where}"
