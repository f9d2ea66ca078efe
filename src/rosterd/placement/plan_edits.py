"""A device plan's edits of the node plan (layer 3: pure): the copies the device step
moved to another node, dropped or left unplaced (:mod:`rosterd.placement.devices`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from rosterd.placement.problem import NodePlan, Plan
from rosterd.spec import InferenceSpec


def plan_after_moves(
    plan: Plan,
    by_role: Mapping[str, InferenceSpec],
    moved: Mapping[tuple[str, str], str],
    failed: Mapping[str, str],
    dropped: Mapping[str, Sequence[tuple[str, str]]],
) -> Plan:
    """``plan`` with the copies of ``moved`` on their new nodes, less the roles of ``failed``
    (unplaced with their reasons) and the copies of ``dropped`` (named in ``copies_short``)."""
    if not moved and not failed and not dropped:
        return plan
    gone = {(role, node) for role, misses in dropped.items() for node, _ in misses}

    def where(role: str, node: str) -> str | None:
        if role in failed or (role, node) in gone:
            return None
        return moved.get((role, node), node)

    held: dict[str, list[str]] = {name: [] for name in plan.nodes}
    for role, node in plan.copy_pairs():
        now = where(role, node)
        if now is not None:
            held[now].append(role)
    nodes = {
        name: NodePlan(
            capacity_bytes=node.capacity_bytes,
            always_resident=tuple(sorted(r for r in held[name] if _interactive(r, by_role, node))),
            swappable=tuple(sorted(r for r in held[name] if not _interactive(r, by_role, node))),
        )
        for name, node in plan.nodes.items()
    }
    placements = {r: now for r, n in plan.placements.items() if (now := where(r, n)) is not None}
    copies = {
        role: tuple(now for n in nodes_ if (now := where(role, n)) is not None)
        for role, nodes_ in plan.copies.items()
        if role not in failed
    }
    unplaced = list(plan.unplaced)
    order = list(plan.placements)
    unplaced.extend((r, failed[r]) for r in order if r in failed)
    short = list(plan.copies_short)
    short.extend(
        (r, "; ".join(f"{node}: {reason}" for node, reason in dropped[r]))
        for r in order
        if r in dropped and r not in failed
    )
    return replace(
        plan,
        placements=placements,
        nodes=nodes,
        copies={r: c for r, c in copies.items() if c},
        unplaced=tuple(unplaced),
        copies_short=tuple(short),
    )


def plan_less_copies(plan: Plan, extras: Mapping[str, Sequence[tuple[str, str]]]) -> Plan:
    """``plan`` less one further copy on each ``(node, why)`` of ``extras`` (role -> the
    copies no device of a node holding a copy could take), named in ``copies_short``."""
    if not extras:
        return plan
    copies = {role: list(nodes) for role, nodes in plan.copies.items()}
    lists = {
        name: (list(node.always_resident), list(node.swappable))
        for name, node in plan.nodes.items()
    }
    for role, misses in extras.items():
        for node, _ in misses:
            held = copies.get(role, [])
            if node in held:
                del held[len(held) - 1 - held[::-1].index(node)]
            for names in lists[node]:
                if role in names:
                    names.remove(role)
                    break
    nodes = {
        name: replace(node, always_resident=tuple(lists[name][0]), swappable=tuple(lists[name][1]))
        for name, node in plan.nodes.items()
    }
    short = dict(plan.copies_short)
    for role, misses in extras.items():
        said = "; ".join(f"{node}: {why}" for node, why in misses)
        short[role] = f"{short[role]}; {said}" if role in short else said
    order = [r for r in plan.placements if r in short]
    order += [r for r in short if r not in order]
    return replace(
        plan,
        copies={r: tuple(c) for r, c in copies.items() if c},
        nodes=nodes,
        copies_short=tuple((r, short[r]) for r in order),
    )


def _interactive(role: str, by_role: Mapping[str, InferenceSpec], node: NodePlan) -> bool:
    """Whether ``role`` is always resident: its spec's class, else as the node plan had it."""
    s = by_role.get(role)
    return s.interactive if s is not None else role in node.always_resident
