"""The CP-SAT model of placement (layer 3: pure; see :mod:`rosterd.placement` for the
objective). OR-Tools is imported only here, and this module only when a plan is solved:
it takes about a second to import, which commands that do not plan should not pay.
"""

from __future__ import annotations

from collections.abc import Mapping

from ortools.sat.python import cp_model

from rosterd.placement.problem import MIB, PERMILLE, Problem, node_loads

#: Level 4 is counted in at most this many units so the weighted objective fits int64.
_MAX_RESIDENT_UNITS = 1 << 24
#: Above this many (role, node) pairs the solver searches a narrowed model (see ``narrow``).
_NARROW_ABOVE = 2000
#: Candidate nodes per role in a narrowed model.
_NARROW_TO = 8
#: CP-SAT deterministic work units allowed per second of ``time_limit_s``: on a 2-core
#: machine one worker does about 0.57 units per wall second on these models, so the work
#: limit ends the search at roughly 0.9 x the time limit.
_WORK_PER_SECOND = 0.5


def narrow(problem: Problem, hint: Mapping[str, int]) -> dict[str, list[int]] | None:
    """Candidate nodes per role for a big model, else ``None`` (search them all).

    With thousands of (role, node) pairs CP-SAT spends its time limit on presolve and
    barely moves from the hint. Each role keeps its hinted node, its previous node and
    the nodes with the most headroom in the hint, up to ``_NARROW_TO``: a model small
    enough to improve on greedy within the limit (measured with bench/plan_bench.py).
    """
    if sum(len(nodes) for nodes in problem.eligible.values()) <= _NARROW_ABOVE:
        return None
    loads = node_loads(problem, hint)
    narrowed: dict[str, list[int]] = {}
    for role, nodes in problem.eligible.items():
        keep = {i for i in (hint.get(role), problem.previous.get(role)) if i is not None}
        for i in sorted(nodes, key=lambda i: (-loads[i].headroom(), i)):
            if len(keep) >= _NARROW_TO:
                break
            keep.add(i)
        narrowed[role] = sorted(keep)
    return narrowed


def solve(
    problem: Problem,
    hint: Mapping[str, int],
    time_limit_s: float,
    candidates: Mapping[str, list[int]] | None = None,
) -> tuple[dict[str, int], bool] | None:
    """CP-SAT over the (role, node) pairs in ``candidates`` (default: every eligible
    pair); ``None`` when no solution in time, or when the solver fails (then greedy plans).
    The flag is whether it proved optimal."""
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
    free_share = model.new_int_var(0, PERMILLE, "min_free_permille")
    # The greedy plan is a complete hint: placements and every derived value, so the
    # solver starts from greedy's objective rather than from zero.
    hint_resident_total = 0
    hint_free = PERMILLE
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
                cap[i] * free_share + PERMILLE * (interactive_mib + resident) <= PERMILLE * cap[i]
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
            free_i = (cap[i] - hinted_inter - hinted_resident) * PERMILLE // cap[i]
            hint_free = min(hint_free, max(free_i, 0))
    total_cap = max(sum(cap), 1)
    n_roles = len(problem.eligible)
    # Count level 4 coarsely enough that the weighted objective stays inside int64.
    w4 = PERMILLE + 1
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
    # rosterd owns SIGINT (a drain, then every backend stopped); a reload solves in a
    # worker thread, where CP-SAT's own process-wide handler would take it over.
    solver.parameters.catch_sigint_signal = False
    if candidates is not None:
        # On big fleets full presolve (probing, symmetry) takes much of the time limit
        # before the search starts; the greedy hint plus a light presolve does better.
        solver.parameters.symmetry_level = 0
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
    try:
        status = solver.solve(model)
    except (IndexError, RuntimeError):
        # OR-Tools 9.15 raises (IndexError "absl::btree_map::at") on some models whose
        # complete hint is feasible: four roles of 1, 2, 3 and 3 GiB on three 5 GiB nodes
        # are one. The hint only speeds the search, so solve once more without it; should
        # that fail too, the caller plans greedily.
        model.clear_hints()  # type: ignore[no-untyped-call]  # OR-Tools leaves it untyped
        try:
            status = solver.solve(model)
        except (IndexError, RuntimeError):
            return None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    assignment = {r: i for (r, i), var in x.items() if solver.boolean_value(var)}
    return assignment, status == cp_model.OPTIMAL
