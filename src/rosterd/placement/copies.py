"""The further copies of roles with replicas (layer 3: pure).

A fleet ``models:`` entry with ``replicas: N`` asks for N copies of its role, each on
its own node. The solver (or greedy) places every role's first copy; then
:func:`place_copies` adds the others, so a second copy never takes the room of a
role that has none. Each copy counts its role's memory on its node and is held to
the node's flavors, budget and exclusions as any role is (``NodeLoad``). Sticky
roles keep their copies' nodes of the plan in force where they still fit; the other
copies go where the most room is left (spread, ties by fleet order). Only when no node
of its own is left may a further copy go on a node that already holds one: where the
role runs on a device and the node has more devices for it than copies of it (the
device step, :mod:`rosterd.placement.devices`, then gives each copy a device of its
own; issue 29: ``replicas: 2`` on a node with two GPUs is one copy per GPU), its host
part counted in the node's RAM again. When fewer than N fit, the plan says why for the
rest (``Plan.copies_short``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rosterd.placement.device_need import devices_for, gb_text, uses_device
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
        # No node of its own left: another device of a node that holds a copy already.
        for i in [*kept, *_by_room(problem, s, loads)]:
            here = [assignment[s.role], *placed]
            while len(placed) < wanted and _spare_device(problem, s, i, here, loads):
                loads[i].add(s)
                placed.append(i)
                here.append(i)
        if placed:
            copies[s.role] = tuple(placed)
        if len(placed) < wanted:
            copies_at = [assignment[s.role], *placed]
            short[s.role] = _short_reason(problem, s, loads, copies_at, wanted + 1)
    return copies, short


def _spare_device(
    problem: Problem,
    s: InferenceSpec,
    i: int,
    copies: Sequence[int],
    loads: Sequence[NodeLoad],
) -> bool:
    """Whether node ``i``, which holds a copy of ``s`` (``copies``: the node indexes of
    its copies so far), may take one more: ``s`` runs on a device there, the node has more
    devices for it than copies of it, and its host RAM and exclusions (other roles')
    allow it."""
    node = problem.nodes[i]
    if i not in copies or i not in problem.eligible[s.role] or not uses_device(s, node):
        return False
    if copies.count(i) >= len(devices_for(s, node)):
        return False
    return loads[i].fits(s) and not [r for r in loads[i].excluded_by(s) if r != s.role]


def _by_room(problem: Problem, s: InferenceSpec, loads: Sequence[NodeLoad]) -> list[int]:
    """The nodes that run ``s``, the most room left first (ties by fleet order)."""
    return sorted(problem.eligible.get(s.role, ()), key=lambda i: (-loads[i].headroom(), i))


def _short_reason(
    problem: Problem, s: InferenceSpec, loads: Sequence[NodeLoad], copies: list[int], asked: int
) -> str:
    """Why only ``len(copies)`` (their node indexes) of ``asked`` copies of ``s`` were
    placed: each other node's reason (no flavor, too small, excluded, full), and for a
    node holding a copy on a device, that it has no other device for one more."""
    notes: list[str] = []
    by_device = False
    for i, node in enumerate(problem.nodes):
        if i in copies and uses_device(s, node):
            by_device = True
            ids = [d.id for d in devices_for(s, node)]
            held = copies.count(i)
            if held >= len(ids):
                notes.append(
                    f"{node.name}: {'each of ' if held > 1 else ''}{', '.join(ids)} holds "
                    f"{'a' if held > 1 else 'its'} copy; no other device on {node.name}"
                )
            else:
                notes.append(f"{node.name}: host RAM has no room for one more copy")
            continue
        if i in copies:
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
    rule = (
        "each copy needs a node of its own, or a device of its own on a node with several"
        if by_device
        else "each copy needs a node of its own"
    )
    return f"{len(copies)} of {asked} copies placed ({rule}): {where}"
