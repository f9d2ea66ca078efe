"""Placement: which role lives on which node (layer 3: pure; no I/O, clock, logging or
environment).

- ``planner``: the entry points;
- ``problem``: plan values, the input, loads, objective, reasons;
- ``greedy``: the hint and the fallback;
- ``cpsat``: the OR-Tools model;
- ``copies``: the further copies of roles with ``replicas:``;
- ``devices`` and ``device_need``: each placed role's device on its node, and what a
  role needs on a device;
- ``plan_edits``: the node plan as the device step leaves it (copies moved, dropped,
  unplaced);
- ``conflicts``: port conflicts of a plan.

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

from rosterd.placement.planner import greedy_plan, plan, score, violations
from rosterd.placement.problem import NodePlan, Plan, PlanScore

__all__ = ["NodePlan", "Plan", "PlanScore", "greedy_plan", "plan", "score", "violations"]
