"""The greedy planner (layer 3: pure): the solver's hint and its fallback.

Six passes (interactive roles first, biggest or smallest of them first, or all roles by
size; nodes spread or packed),
each putting sticky roles back on their previous node when they fit and the biggest
roles first; the best by the plan objective wins.
"""

from __future__ import annotations

from rosterd.placement.problem import NodeLoad, Problem, fill, greedy_order, score_of

#: Greedy variants tried: (interactive roles first?, pack nodes tightly rather than spread,
#: the smallest interactive roles first?). The last two: the biggest interactive role first
#: can take the room of two smaller ones (and of a sticky role), losing the objective's
#: first term, the interactive roles placed (found by tests/fleet_scheduler/test_fleet_machine.py).
_GREEDY_VARIANTS = (
    (True, False, False),
    (True, True, False),
    (False, False, False),
    (False, True, False),
    (True, False, True),
    (True, True, True),
)


def best_greedy(problem: Problem) -> dict[str, int]:
    """The best (by the plan objective) of a few greedy variants; first wins ties."""
    best: dict[str, int] = {}
    best_key: tuple[int, ...] | None = None
    for by_class, pack, small in _GREEDY_VARIANTS:
        variant = _greedy_variant(problem, by_class=by_class, pack=pack, small_interactive=small)
        candidate = fill(problem, variant)
        key = score_of(problem, candidate).key()
        if best_key is None or key > best_key:
            best, best_key = candidate, key
    return best


def _greedy_variant(
    problem: Problem, *, by_class: bool, pack: bool, small_interactive: bool = False
) -> dict[str, int]:
    """One greedy pass: each role in turn on its previous node (sticky) if it fits, else
    on the node that leaves the most headroom (spread) or the least (pack); batch roles
    first where they add the most resident bytes (spread) or raise the node's largest
    batch role the least (pack)."""
    loads = [NodeLoad(n) for n in problem.nodes]
    assignment: dict[str, int] = {}
    sign = -1 if pack else 1
    for s in greedy_order(problem, by_class=by_class, small_interactive=small_interactive):
        options = [
            i for i in problem.eligible[s.role] if loads[i].fits(s) and not loads[i].excluded_by(s)
        ]
        if not options:
            continue
        need = s.memory.resident_bytes
        prev = problem.previous.get(s.role)
        if prev is not None and prev in options:
            choice = prev
        elif s.interactive:
            choice = max(
                options,
                key=lambda i: (sign * (loads[i].headroom() - need) / loads[i].capacity, -i),
            )
        elif pack:
            choice = min(
                options,
                key=lambda i: (max(0, need - loads[i].batch_max), loads[i].headroom(), i),
            )
        else:

            def gain(i: int, need: int = need) -> tuple[int, float, int]:
                load = loads[i]
                room = load.capacity - load.interactive
                added = min(load.batch_sum + need, room) - min(load.batch_sum, room)
                spare = (room - min(load.batch_sum + need, room)) / load.capacity
                return (added, spare, -i)

            choice = max(options, key=gain)
        loads[choice].add(s)
        assignment[s.role] = choice
    return assignment
