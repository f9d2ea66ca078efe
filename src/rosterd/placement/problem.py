"""The planning problem and its bookkeeping (layer 3: pure): the plan value types, the
input after deduplication and eligibility checks, per-node loads, the objective and
the reasons for unplaced roles. Shared by the greedy planner and the CP-SAT model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rosterd.fleet import Fleet, Node
from rosterd.memory.count import UNMEASURED_NOTE
from rosterd.placement.device_need import DeviceNeed, device_eligibility, gb_text
from rosterd.residency import excludes_each_other, gib
from rosterd.spec import InferenceSpec

MIB = 1 << 20
#: Level 5 resolution: free memory share in permille.
PERMILLE = 1000


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
    time), ``trivial`` (nothing could be placed anywhere). ``copies``: role -> the nodes
    of its further copies (a fleet ``models:`` entry's ``replicas``; the first copy is
    its placement), each a residency unit of its own there; ``copies_short``:
    ``(role id, reason)`` for each role with fewer copies than asked.
    """

    placements: Mapping[str, str] = field(hash=False)
    unplaced: tuple[tuple[str, str], ...]
    nodes: Mapping[str, NodePlan] = field(hash=False)
    solver: str
    copies: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    copies_short: tuple[tuple[str, str], ...] = ()

    def nodes_of(self, role: str) -> tuple[str, ...]:
        """Every node holding a copy of ``role``: its placement first, then its further
        copies; empty when it is unplaced."""
        first = self.placements.get(role)
        if first is None:
            return ()
        return (first, *self.copies.get(role, ()))

    def copy_pairs(self) -> list[tuple[str, str]]:
        """``(role, node)`` for every copy of every placed role, first copies in order."""
        return [(role, node) for role in self.placements for node in self.nodes_of(role)]


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


class Problem:
    """The planning input after deduplication and eligibility checks.

    ``memory_notes``: role -> words that follow the role's figure in its unplaced
    reason (where the counted figure came from and the roster's ``ram_gb``).
    ``device_needs``: role -> what it needs on a device (``rosterd.placement.devices``):
    a node whose devices could never hold the role is not eligible for it.
    """

    def __init__(
        self,
        specs: Sequence[InferenceSpec],
        fleet: Fleet,
        previous: Plan | None,
        memory_notes: Mapping[str, str] | None = None,
        device_needs: Mapping[str, DeviceNeed] | None = None,
    ) -> None:
        self.fleet = fleet
        self.memory_notes = dict(memory_notes or {})
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
                self.static_unplaced[s.role] = no_flavor_reason(s, self.nodes)
                continue
            need = s.memory.resident_bytes
            fits = [i for i in runs if need <= self.nodes[i].capacity_bytes]
            if not fits:
                biggest = max(runs, key=lambda i: (self.nodes[i].capacity_bytes, -i))
                self.static_unplaced[s.role] = (
                    f"needs {self.need_text(s)} but the largest capacity among nodes running "
                    f"{s.flavor.value} is {gib(self.nodes[biggest].capacity_bytes)} "
                    f"(node {self.nodes[biggest].name}; capacity = memory - reserved)"
                )
                continue
            if any(n.devices for n in self.nodes):
                fits, why = _device_eligible(s, [self.nodes[i] for i in fits], fits, device_needs)
                if not fits:
                    self.static_unplaced[s.role] = why
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
            for role in previous.placements:
                prev_spec = self.spec.get(role)
                if prev_spec is None or not prev_spec.sticky:
                    continue
                # Its first copy's node, else (that node gone) the node of another copy:
                # a role with replicas keeps serving where it still is.
                for node_name in previous.nodes_of(role):
                    idx = self.node_index.get(node_name)
                    if idx is not None and idx in self.eligible.get(role, ()):
                        self.previous[role] = idx
                        break

    def need_text(self, s: InferenceSpec) -> str:
        """The role's figure for a reason: ``1.20 GiB (… bytes)``, then its memory note;
        ``~1.20 GiB (unmeasured; … bytes)`` for the note ``UNMEASURED_NOTE`` (the
        roster's ``"~N"`` counts)."""
        note = self.memory_notes.get(s.role)
        n_bytes = s.memory.resident_bytes
        if note == UNMEASURED_NOTE:
            return f"~{gb_text(n_bytes)} (unmeasured; {n_bytes} bytes)"
        need = gib(n_bytes)
        return f"{need}, {note}" if note else need


class NodeLoad:
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


def _device_eligible(
    s: InferenceSpec,
    nodes: Sequence[Node],
    indexes: Sequence[int],
    device_needs: Mapping[str, DeviceNeed] | None,
) -> tuple[list[int], str]:
    """The nodes of ``indexes`` whose devices could hold ``s`` alone, and if none, why."""
    need = (device_needs or {}).get(s.role) or DeviceNeed(full_bytes=s.memory.resident_bytes)
    kept: list[int] = []
    reasons: list[str] = []
    for node, i in zip(nodes, indexes, strict=True):
        ok, why = device_eligibility(s, node, need)
        if ok:
            kept.append(i)
        else:
            reasons.append(why)
    return kept, "no device could ever hold it: " + "; ".join(reasons[:3]) + (
        f"; and {len(reasons) - 3} more nodes" if len(reasons) > 3 else ""
    )


def no_flavor_reason(s: InferenceSpec, nodes: Iterable[Node]) -> str:
    runs = "; ".join(f"{n.name}: {', '.join(sorted(f.value for f in n.flavors))}" for n in nodes)
    return f"no node runs flavor {s.flavor.value} (nodes run: {runs})"


def greedy_order(
    problem: Problem, *, by_class: bool = True, small_interactive: bool = False
) -> list[InferenceSpec]:
    """(``by_class``) interactive before batch, then sticky roles with a previous node,
    then biggest first (``small_interactive``: the interactive roles smallest first, which
    places the most of them when the biggest would take a node's room alone), then role
    id."""
    placeable = [problem.spec[r] for r in problem.eligible]

    def size(s: InferenceSpec) -> int:
        bytes_ = s.memory.resident_bytes
        return bytes_ if small_interactive and s.interactive else -bytes_

    return sorted(
        placeable,
        key=lambda s: (
            0 if s.interactive or not by_class else 1,
            0 if s.role in problem.previous else 1,
            size(s),
            0 if s.interactive else 1,
            s.role,
        ),
    )


def fill(problem: Problem, assignment: Mapping[str, int]) -> dict[str, int]:
    """Add any unplaced role that fits as the assignment stands (greedy order)."""
    out = dict(assignment)
    loads = node_loads(problem, out)
    for s in greedy_order(problem):
        if s.role in out:
            continue
        for i in problem.eligible[s.role]:
            if loads[i].fits(s) and not loads[i].excluded_by(s):
                loads[i].add(s)
                out[s.role] = i
                break
    return out


def node_loads(problem: Problem, assignment: Mapping[str, int]) -> list[NodeLoad]:
    loads = [NodeLoad(n) for n in problem.nodes]
    for role in problem.order:
        if role in assignment:
            loads[assignment[role]].add(problem.spec[role])
    return loads


def score_of(problem: Problem, assignment: Mapping[str, int]) -> PlanScore:
    loads = node_loads(problem, assignment)
    interactive = sum(1 for r in assignment if problem.spec[r].interactive)
    kept = sum(1 for r, i in assignment.items() if problem.previous.get(r) == i)
    resident = sum(load.resident_batch() for load in loads)
    free = min(
        (
            (load.capacity - load.interactive - load.resident_batch()) * PERMILLE // load.capacity
            for load in loads
            if load.capacity > 0
        ),
        default=PERMILLE,
    )
    return PlanScore(interactive, len(assignment), kept, resident, free)


def unplaced_reason(problem: Problem, s: InferenceSpec, loads: Sequence[NodeLoad]) -> str:
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
                f"{name}: interactive {gb_text(load.interactive)} + this {gb_text(need)} + largest "
                f"batch {gb_text(load.batch_max)} > capacity {gb_text(load.capacity)}"
            )
        else:
            detail = (
                f"{name}: interactive {gb_text(load.interactive)} + this {gb_text(need)} "
                f"> capacity {gb_text(load.capacity)}"
            )
        notes.append((load.headroom(), detail))
    notes.sort(key=lambda n: -n[0])
    shown = "; ".join(text for _, text in notes[:3])
    more = f"; and {len(notes) - 3} more nodes" if len(notes) > 3 else ""
    kind = "interactive" if s.interactive else "batch"
    return (
        f"no room for this {kind} role ({problem.need_text(s)}): on each node the interactive "
        f"roles plus the largest batch role must fit the capacity; {shown}{more}"
    )


def build_plan(
    problem: Problem,
    assignment: Mapping[str, int],
    solver: str,
    copies: Mapping[str, tuple[int, ...]] | None = None,
    copies_short: Mapping[str, str] | None = None,
) -> Plan:
    copies = copies or {}
    loads = node_loads(problem, assignment)
    for role, indexes in copies.items():
        for i in indexes:
            loads[i].add(problem.spec[role])
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
            unplaced.append((role, unplaced_reason(problem, problem.spec[role], loads)))
    nodes = {
        node.name: NodePlan(
            capacity_bytes=node.capacity_bytes,
            always_resident=tuple(sorted(s.role for s in load.roles if s.interactive)),
            swappable=tuple(sorted(s.role for s in load.roles if not s.interactive)),
        )
        for node, load in zip(problem.nodes, loads, strict=True)
    }
    return Plan(
        placements=placements,
        unplaced=tuple(unplaced),
        nodes=nodes,
        solver=solver,
        copies={
            role: tuple(problem.nodes[i].name for i in copies[role])
            for role in problem.order
            if role in copies
        },
        copies_short=tuple(
            (role, (copies_short or {})[role])
            for role in problem.order
            if role in (copies_short or {})
        ),
    )
