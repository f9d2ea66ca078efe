"""Placement: which role lives on which node (layer 3: pure; no I/O, clock, logging or
environment).

:func:`plan` assigns roles (inference specs) to the fleet's nodes.

Hard constraints (a plan never breaks them):

- a role goes only to a node whose ``flavors`` include the role's flavor;
- per node, the interactive roles (always resident) plus the largest batch role
  fit the capacity, so every placed role can be served, batch roles swapping in
  turn if needed;
- a role never shares a node with an interactive role it excludes (or that
  excludes it): the interactive one is always resident, so the other could never
  load there. For two interactive roles this is a stated rule of placement; for an
  interactive/batch pair it follows from "every placed role can be served".
  Batch/batch exclusions may share a node: residency swaps them.

Objective, lexicographic (each level matters only among plans equal on the ones
before it):

1. place every interactive role (count of interactive roles placed);
2. place as many roles as possible;
3. keep sticky roles on their node in ``previous``;
4. maximise the batch bytes that can stay resident together: per node
   ``min(batch bytes placed, capacity - interactive bytes)`` summed over nodes
   (a relaxation: it ignores that whole roles, not bytes, are resident, and batch
   exclusions);
5. balance free memory: maximise the smallest per-node share of capacity left free
   after level 4's resident bytes (in permille).

The solver is OR-Tools CP-SAT (a maintained, exact integer solver that handles this
size well; already a dependency), one model with the levels as weighted terms whose
weights make each level dominate the ones after it. It runs single-threaded with a
fixed seed and ``time_limit_s``, starting from the greedy plan as a hint. Memory in
the model is counted in MiB, rounding role sizes up and capacities down, so a
solver plan never exceeds a capacity in bytes. A greedy plan is always computed
too; the better of the two by the exact (byte) objective is returned, so the
result is never worse than greedy, and greedy is the answer if the solver finds
nothing in time. On big fleets (over 2000 role-node pairs) the solver searches a
narrowed model, each role limited to 8 candidate nodes (its greedy node, its
previous node, the nodes with most headroom), which lets it improve on greedy
within the limit where the full model would not. Finally any unplaced role that
fits as the plan stands is added.
The solver stops on its deterministic work clock (scaled from ``time_limit_s``), so
the same inputs give the same plan; only when the machine is so slow or busy that
the wall-clock limit comes first can the answer vary.

Every unplaced role gets a reason naming the constraint and the numbers. Duplicate
role ids: the first spec is placed, the others are reported as unplaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from rosterd.fleet import Fleet, Node
from rosterd.residency import excludes_each_other, gib
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB

MIB = 1 << 20
#: Level 5 resolution: free memory share in permille.
_PERMILLE = 1000
#: Level 4 is counted in at most this many units so the weighted objective fits int64.
_MAX_RESIDENT_UNITS = 1 << 24
#: Above this many (role, node) pairs the solver searches a narrowed model (see ``_narrow``).
_NARROW_ABOVE = 2000
#: Candidate nodes per role in a narrowed model.
_NARROW_TO = 8
#: CP-SAT deterministic work units allowed per second of ``time_limit_s``: on a 2-core
#: machine one worker does about 0.57 units per wall second on these models, so the work
#: limit ends the search at roughly 0.9 x the time limit.
_WORK_PER_SECOND = 0.5


@dataclass(frozen=True)
class NodePlan:
    """One node's share of a plan: its capacity in bytes, the roles always resident
    (interactive) and the roles swapped in on demand (batch), each sorted by id."""

    capacity_bytes: int
    always_resident: tuple[str, ...]
    swappable: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """An assignment of roles to nodes.

    ``placements``: role id -> node name, in the order the specs were given.
    ``unplaced``: ``(role id, reason)`` in the order given. ``nodes``: every fleet
    node by name, in fleet order. ``solver``: how the plan was found, one of
    ``cp-sat (optimal)``, ``cp-sat (time limit)``, ``cp-sat (narrowed)`` (big
    fleet, see the module docstring), ``greedy`` (solver found nothing better in
    time), ``trivial`` (nothing could be placed anywhere).
    """

    placements: Mapping[str, str] = field(hash=False)
    unplaced: tuple[tuple[str, str], ...]
    nodes: Mapping[str, NodePlan] = field(hash=False)
    solver: str


@dataclass(frozen=True)
class PlanScore:
    """The objective of a plan, compared lexicographically (bigger is better)."""

    interactive_placed: int
    placed: int
    sticky_kept: int
    resident_batch_bytes: int
    min_free_permille: int

    def key(self) -> tuple[int, int, int, int, int]:
        """The levels as a tuple, first level first."""
        return (
            self.interactive_placed,
            self.placed,
            self.sticky_kept,
            self.resident_batch_bytes,
            self.min_free_permille,
        )


class _Problem:
    """The planning input after deduplication and eligibility checks."""

    def __init__(self, specs: Sequence[InferenceSpec], fleet: Fleet, previous: Plan | None) -> None:
        self.fleet = fleet
        self.nodes: tuple[Node, ...] = fleet.nodes
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.roles: list[InferenceSpec] = []
        self.order: list[str] = []  # role ids of the specs planned, as given
        self.static_unplaced: dict[str, str] = {}
        #: every spec in the order given: (role id, reason if it is a duplicate)
        self.entries: list[tuple[str, str | None]] = []
        seen: set[str] = set()
        for s in specs:
            if s.role in seen:
                self.entries.append(
                    (
                        s.role,
                        f"duplicate role id {s.role}: the first roster entry with this id is "
                        "the one planned",
                    )
                )
                continue
            self.entries.append((s.role, None))
            seen.add(s.role)
            self.roles.append(s)
            self.order.append(s.role)
        self.spec = {s.role: s for s in self.roles}
        self.eligible: dict[str, list[int]] = {}
        for s in self.roles:
            runs = [i for i, n in enumerate(self.nodes) if s.flavor in n.flavors]
            if not runs:
                self.static_unplaced[s.role] = _no_flavor_reason(s, self.nodes)
                continue
            need = s.memory.resident_bytes
            fits = [i for i in runs if need <= self.nodes[i].capacity_bytes]
            if not fits:
                biggest = max(runs, key=lambda i: (self.nodes[i].capacity_bytes, -i))
                self.static_unplaced[s.role] = (
                    f"needs {gib(need)} but the largest capacity among nodes running "
                    f"{s.flavor.value} is {gib(self.nodes[biggest].capacity_bytes)} "
                    f"(node {self.nodes[biggest].name}; capacity = memory - reserved)"
                )
                continue
            self.eligible[s.role] = fits
        self.conflicts: dict[str, set[str]] = {r: set() for r in self.eligible}
        placeable = [self.spec[r] for r in self.eligible]
        for i, a in enumerate(placeable):
            for b in placeable[i + 1 :]:
                if (a.interactive or b.interactive) and excludes_each_other(a, b):
                    self.conflicts[a.role].add(b.role)
                    self.conflicts[b.role].add(a.role)
        self.previous: dict[str, int] = {}
        if previous is not None:
            for role, node_name in previous.placements.items():
                prev_spec = self.spec.get(role)
                idx = self.node_index.get(node_name)
                if (
                    prev_spec is not None
                    and prev_spec.sticky
                    and idx is not None
                    and idx in self.eligible.get(role, ())
                ):
                    self.previous[role] = idx


class _NodeLoad:
    """Mutable per-node totals used by greedy and by the checks."""

    def __init__(self, node: Node) -> None:
        self.capacity = node.capacity_bytes
        self.interactive = 0
        self.batch_sum = 0
        self.batch_max = 0
        self.roles: list[InferenceSpec] = []

    def fits(self, s: InferenceSpec) -> bool:
        need = s.memory.resident_bytes
        if s.interactive:
            return self.interactive + need + self.batch_max <= self.capacity
        return self.interactive + max(self.batch_max, need) <= self.capacity

    def excluded_by(self, s: InferenceSpec) -> list[str]:
        return sorted(
            o.role
            for o in self.roles
            if (o.interactive or s.interactive) and excludes_each_other(o, s)
        )

    def add(self, s: InferenceSpec) -> None:
        need = s.memory.resident_bytes
        if s.interactive:
            self.interactive += need
        else:
            self.batch_sum += need
            self.batch_max = max(self.batch_max, need)
        self.roles.append(s)

    def resident_batch(self) -> int:
        return min(self.batch_sum, self.capacity - self.interactive)

    def headroom(self) -> int:
        return self.capacity - self.interactive - self.batch_max


def plan(
    specs: Sequence[InferenceSpec],
    fleet: Fleet,
    previous: Plan | None = None,
    *,
    time_limit_s: float = 1.5,
) -> Plan:
    """Place ``specs`` on ``fleet``'s nodes (see the module docstring for the rules).

    ``previous`` is the plan in force (its sticky roles stay put when they can);
    ``time_limit_s`` bounds the solver's wall time in seconds (greedy and checks add
    a few milliseconds). Never raises for unplaceable roles: each is in
    ``Plan.unplaced`` with its reason.
    """
    problem = _Problem(specs, fleet, previous)
    greedy = _greedy(problem)
    greedy_score = _score(problem, greedy)
    if not problem.eligible:
        return _build(problem, greedy, "trivial")
    candidates = _narrow(problem, greedy)
    solved = _solve(problem, greedy, time_limit_s, candidates)
    if solved is not None:
        assignment, optimal = solved
        assignment = _fill(problem, assignment)
        if _score(problem, assignment).key() >= greedy_score.key():
            if candidates is not None:
                how = "cp-sat (narrowed)"
            else:
                how = "cp-sat (optimal)" if optimal else "cp-sat (time limit)"
            return _build(problem, assignment, how)
    return _build(problem, greedy, "greedy")


def greedy_plan(specs: Sequence[InferenceSpec], fleet: Fleet, previous: Plan | None = None) -> Plan:
    """The greedy fallback alone (same constraints and reasons, no solver): the best,
    by the plan objective, of four passes (interactive roles first or all roles by
    size; nodes spread or packed), each putting sticky roles back on their previous
    node when they fit and biggest roles first. For benchmarks and tests;
    :func:`plan` uses it as the solver's hint and as its fallback."""
    problem = _Problem(specs, fleet, previous)
    return _build(problem, _greedy(problem), "greedy")


def score(
    specs: Sequence[InferenceSpec], fleet: Fleet, result: Plan, previous: Plan | None = None
) -> PlanScore:
    """The objective levels of ``result`` for these inputs (see the module docstring)."""
    problem = _Problem(specs, fleet, previous)
    assignment = {
        role: problem.node_index[node]
        for role, node in result.placements.items()
        if role in problem.spec and node in problem.node_index
    }
    return _score(problem, assignment)


def violations(specs: Sequence[InferenceSpec], fleet: Fleet, result: Plan) -> list[str]:
    """Hard constraints ``result`` breaks, as sentences (empty when the plan is valid):
    unknown node, flavor not run, interactive + largest batch over capacity, an
    interactive role sharing a node with a role it excludes."""
    problem = _Problem(specs, fleet, None)
    loads = [_NodeLoad(n) for n in problem.nodes]
    problems: list[str] = []
    for role, node_name in result.placements.items():
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


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / GB:.2f} GiB"


def _no_flavor_reason(s: InferenceSpec, nodes: Iterable[Node]) -> str:
    runs = "; ".join(f"{n.name}: {', '.join(sorted(f.value for f in n.flavors))}" for n in nodes)
    return f"no node runs flavor {s.flavor.value} (nodes run: {runs})"


def _greedy_order(problem: _Problem, *, by_class: bool = True) -> list[InferenceSpec]:
    """(``by_class``) interactive before batch, then sticky roles with a previous node,
    then biggest first, then role id."""
    placeable = [problem.spec[r] for r in problem.eligible]
    return sorted(
        placeable,
        key=lambda s: (
            0 if s.interactive or not by_class else 1,
            0 if s.role in problem.previous else 1,
            -s.memory.resident_bytes,
            0 if s.interactive else 1,
            s.role,
        ),
    )


#: Greedy variants tried: (interactive roles first?, pack nodes tightly rather than spread).
_GREEDY_VARIANTS = ((True, False), (True, True), (False, False), (False, True))


def _greedy(problem: _Problem) -> dict[str, int]:
    """The best (by the plan objective) of a few greedy variants; first wins ties."""
    best: dict[str, int] = {}
    best_key: tuple[int, ...] | None = None
    for by_class, pack in _GREEDY_VARIANTS:
        candidate = _fill(problem, _greedy_variant(problem, by_class=by_class, pack=pack))
        key = _score(problem, candidate).key()
        if best_key is None or key > best_key:
            best, best_key = candidate, key
    return best


def _greedy_variant(problem: _Problem, *, by_class: bool, pack: bool) -> dict[str, int]:
    """One greedy pass: each role in turn on its previous node (sticky) if it fits, else
    on the node that leaves the most headroom (spread) or the least (pack); batch roles
    first where they add the most resident bytes (spread) or raise the node's largest
    batch role the least (pack)."""
    loads = [_NodeLoad(n) for n in problem.nodes]
    assignment: dict[str, int] = {}
    sign = -1 if pack else 1
    for s in _greedy_order(problem, by_class=by_class):
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


def _fill(problem: _Problem, assignment: Mapping[str, int]) -> dict[str, int]:
    """Add any unplaced role that fits as the assignment stands (greedy order)."""
    out = dict(assignment)
    loads = _loads(problem, out)
    for s in _greedy_order(problem):
        if s.role in out:
            continue
        for i in problem.eligible[s.role]:
            if loads[i].fits(s) and not loads[i].excluded_by(s):
                loads[i].add(s)
                out[s.role] = i
                break
    return out


def _loads(problem: _Problem, assignment: Mapping[str, int]) -> list[_NodeLoad]:
    loads = [_NodeLoad(n) for n in problem.nodes]
    for role in problem.order:
        if role in assignment:
            loads[assignment[role]].add(problem.spec[role])
    return loads


def _score(problem: _Problem, assignment: Mapping[str, int]) -> PlanScore:
    loads = _loads(problem, assignment)
    interactive = sum(1 for r in assignment if problem.spec[r].interactive)
    kept = sum(1 for r, i in assignment.items() if problem.previous.get(r) == i)
    resident = sum(load.resident_batch() for load in loads)
    free = min(
        (
            (load.capacity - load.interactive - load.resident_batch()) * _PERMILLE // load.capacity
            for load in loads
            if load.capacity > 0
        ),
        default=_PERMILLE,
    )
    return PlanScore(interactive, len(assignment), kept, resident, free)


def _narrow(problem: _Problem, hint: Mapping[str, int]) -> dict[str, list[int]] | None:
    """Candidate nodes per role for a big model, else ``None`` (search them all).

    With thousands of (role, node) pairs CP-SAT spends its time limit on presolve and
    barely moves from the hint. Each role keeps its hinted node, its previous node and
    the nodes with the most headroom in the hint, up to ``_NARROW_TO``: a model small
    enough to improve on greedy within the limit (measured with bench/plan_bench.py).
    """
    if sum(len(nodes) for nodes in problem.eligible.values()) <= _NARROW_ABOVE:
        return None
    loads = _loads(problem, hint)
    narrowed: dict[str, list[int]] = {}
    for role, nodes in problem.eligible.items():
        keep = {i for i in (hint.get(role), problem.previous.get(role)) if i is not None}
        for i in sorted(nodes, key=lambda i: (-loads[i].headroom(), i)):
            if len(keep) >= _NARROW_TO:
                break
            keep.add(i)
        narrowed[role] = sorted(keep)
    return narrowed


def _solve(
    problem: _Problem,
    hint: Mapping[str, int],
    time_limit_s: float,
    candidates: Mapping[str, list[int]] | None = None,
) -> tuple[dict[str, int], bool] | None:
    """CP-SAT over the (role, node) pairs in ``candidates`` (default: every eligible
    pair); ``None`` when no solution in time. The flag is whether it proved optimal."""
    model = cp_model.CpModel()
    need = {r: -(-problem.spec[r].memory.resident_bytes // MIB) for r in problem.eligible}
    cap = [max(n.capacity_bytes // MIB, 0) for n in problem.nodes]
    x: dict[tuple[str, int], cp_model.IntVar] = {}
    for role, nodes in (candidates or problem.eligible).items():
        for i in nodes:
            x[role, i] = model.new_bool_var(f"x[{role},{i}]")
        model.add_at_most_one(x[role, i] for i in nodes)
    on_node: list[list[str]] = [[] for _ in problem.nodes]
    for role, i in x:
        on_node[i].append(role)
    resident_terms = []
    free_share = model.new_int_var(0, _PERMILLE, "min_free_permille")
    # The greedy plan is a complete hint: placements and every derived value, so the
    # solver starts from greedy's objective rather than from zero.
    hint_resident_total = 0
    hint_free = _PERMILLE
    for i, roles in enumerate(on_node):
        inter = [r for r in roles if problem.spec[r].interactive]
        batch = [r for r in roles if not problem.spec[r].interactive]
        interactive_mib = sum(need[r] * x[r, i] for r in inter)
        largest = model.new_int_var(0, cap[i], f"largest_batch[{i}]")
        for r in batch:
            model.add(largest >= need[r] * x[r, i])
        model.add(interactive_mib + largest <= cap[i])
        resident = model.new_int_var(0, cap[i], f"resident_batch[{i}]")
        model.add(resident <= sum(need[r] * x[r, i] for r in batch))
        model.add(resident + interactive_mib <= cap[i])
        resident_terms.append(resident)
        if cap[i] > 0:
            model.add(
                cap[i] * free_share + _PERMILLE * (interactive_mib + resident) <= _PERMILLE * cap[i]
            )
        for r in inter:
            for other in problem.conflicts[r]:
                if (other, i) in x and (problem.spec[other].interactive is False or other > r):
                    model.add(x[r, i] + x[other, i] <= 1)
        hinted_inter = sum(need[r] for r in inter if hint.get(r) == i)
        hinted_batch = [need[r] for r in batch if hint.get(r) == i]
        hinted_resident = max(0, min(sum(hinted_batch), cap[i] - hinted_inter))
        model.add_hint(largest, min(max(hinted_batch, default=0), cap[i]))
        model.add_hint(resident, min(hinted_resident, cap[i]))
        hint_resident_total += hinted_resident
        if cap[i] > 0:
            free_i = (cap[i] - hinted_inter - hinted_resident) * _PERMILLE // cap[i]
            hint_free = min(hint_free, max(free_i, 0))
    total_cap = max(sum(cap), 1)
    n_roles = len(problem.eligible)
    # Count level 4 coarsely enough that the weighted objective stays inside int64.
    w4 = _PERMILLE + 1
    budget = (1 << 62) // (w4 * (len(problem.previous) + 1) * (n_roles + 1) * (n_roles + 1))
    unit = max(1, -(-total_cap // max(1, min(_MAX_RESIDENT_UNITS, budget - 1))))
    resident_units = model.new_int_var(0, total_cap // unit, "resident_units")
    model.add(resident_units * unit <= sum(resident_terms))
    model.add_hint(resident_units, min(hint_resident_total // unit, total_cap // unit))
    model.add_hint(free_share, hint_free)
    placed = sum(x.values())
    interactive_placed = sum(v for (r, _), v in x.items() if problem.spec[r].interactive)
    kept = sum(x[r, i] for r, i in problem.previous.items() if (r, i) in x)
    w3 = w4 * (total_cap // unit + 1)
    w2 = w3 * (len(problem.previous) + 1)
    w1 = w2 * (n_roles + 1)
    model.maximize(
        w1 * interactive_placed + w2 * placed + w3 * kept + w4 * resident_units + free_share
    )
    for (r, i), var in x.items():
        model.add_hint(var, hint.get(r) == i)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    # Stop on CP-SAT's deterministic work clock first, so the same inputs give the same
    # plan; the wall limit only guards a slow or busy machine.
    solver.parameters.max_deterministic_time = max(time_limit_s, 0.01) * _WORK_PER_SECOND
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    if candidates is not None:
        # On big fleets full presolve (probing, symmetry) takes much of the time limit
        # before the search starts; the greedy hint plus a light presolve does better.
        solver.parameters.symmetry_level = 0
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    assignment = {r: i for (r, i), var in x.items() if solver.boolean_value(var)}
    return assignment, status == cp_model.OPTIMAL


def _unplaced_reason(problem: _Problem, s: InferenceSpec, loads: Sequence[_NodeLoad]) -> str:
    need = s.memory.resident_bytes
    notes: list[tuple[int, str]] = []
    for i in problem.eligible[s.role]:
        load = loads[i]
        name = problem.nodes[i].name
        clash = load.excluded_by(s)
        if clash:
            notes.append(
                (
                    load.headroom(),
                    f"{name}: excluded by {', '.join(clash)} placed there "
                    "(an interactive role never shares a node with a role it excludes)",
                )
            )
            continue
        if s.interactive:
            detail = (
                f"{name}: interactive {_gb(load.interactive)} + this {_gb(need)} + largest "
                f"batch {_gb(load.batch_max)} > capacity {_gb(load.capacity)}"
            )
        else:
            detail = (
                f"{name}: interactive {_gb(load.interactive)} + this {_gb(need)} "
                f"> capacity {_gb(load.capacity)}"
            )
        notes.append((load.headroom(), detail))
    notes.sort(key=lambda n: -n[0])
    shown = "; ".join(text for _, text in notes[:3])
    more = f"; and {len(notes) - 3} more nodes" if len(notes) > 3 else ""
    kind = "interactive" if s.interactive else "batch"
    return (
        f"no room for this {kind} role ({gib(need)}): on each node the interactive roles "
        f"plus the largest batch role must fit the capacity; {shown}{more}"
    )


def _build(problem: _Problem, assignment: Mapping[str, int], solver: str) -> Plan:
    loads = _loads(problem, assignment)
    placements = {
        role: problem.nodes[assignment[role]].name for role in problem.order if role in assignment
    }
    unplaced: list[tuple[str, str]] = []
    for role, duplicate in problem.entries:
        if duplicate is not None:
            unplaced.append((role, duplicate))
        elif role in assignment:
            continue
        elif role in problem.static_unplaced:
            unplaced.append((role, problem.static_unplaced[role]))
        else:
            unplaced.append((role, _unplaced_reason(problem, problem.spec[role], loads)))
    nodes = {
        node.name: NodePlan(
            capacity_bytes=node.capacity_bytes,
            always_resident=tuple(sorted(s.role for s in load.roles if s.interactive)),
            swappable=tuple(sorted(s.role for s in load.roles if not s.interactive)),
        )
        for node, load in zip(problem.nodes, loads, strict=True)
    }
    return Plan(placements=placements, unplaced=tuple(unplaced), nodes=nodes, solver=solver)
