"""Placement by pool: each placed role's device on its node (layer 3: pure; no I/O, clock,
logging or environment; ties broken by sorting).

The node planner (:mod:`rosterd.placement.planner`) holds every role to its node's host
RAM, as before. :func:`place_on_devices` then holds the roles that use a device to that
device's pool, node by node, with the same rule the host follows: per pool, the
interactive roles (always resident) plus the largest batch role fit its capacity, so
batch roles swap on a device as they swap in RAM, one resident at a time when two do not
fit together. Which roles use a device is their flavor's ``devices`` fact
(``rosterd.flavors.DeviceUse``):

- llama.cpp's, on a node with devices: one GPU (``--device``), or the Mac's GPU share;
  llama.cpp on a node without devices runs on the CPU, as before;
- mlx_lm's, on a Mac: its GPU share, declared or, where the fleet declares none, the
  default one (``rosterd.devices.pools.with_default_gpu_shares``), which llama.cpp's roles
  leave alone;
- ollama's size their GPU use themselves and stay host-only here.

A role is placed on the device with room for it (its previous device first when it is
sticky; else the one that leaves the most room, then the first declared). When no device
has room, its ``offload: partial`` entry places the layers that fit on the device with the
most room (the rest on the CPU, shown with the layer count); otherwise it is unplaced,
with the reason naming each device, what the role needs and what is free there. Roles
are taken interactive first, then sticky roles with a previous device, then the biggest,
then by id.

A role unplaced here leaves the plan whole (its further copies too); a further copy
that finds no device is dropped and named in ``copies_short``. The node planner does not
yet see device pools: a role that fits no device on its node is not moved to another
node whose device has room (the static check, :func:`device_eligibility`, keeps a role
off nodes where no device could ever hold it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rosterd.flavors import DeviceUse
from rosterd.fleet import Fleet, Node
from rosterd.placement.device_need import DeviceNeed, devices_for, gb_text, uses_device
from rosterd.placement.problem import NodePlan, Plan
from rosterd.spec import InferenceSpec


@dataclass(frozen=True)
class DeviceChoice:
    """Where a placed role runs on its node: ``device`` (``None``: the host's CPU alone),
    ``gpu_layers`` (llama.cpp's ``-ngl``; ``None``: every layer), ``layers`` (repeating
    layers, ``None`` when unknown) and ``device_bytes`` counted on the device."""

    device: str | None
    gpu_layers: int | None
    layers: int | None
    device_bytes: int

    @property
    def partial(self) -> bool:
        """Whether only some layers are on the device (``offload: partial``)."""
        return self.device is not None and self.gpu_layers is not None


@dataclass(frozen=True)
class PoolPlan:
    """One device pool of a node in a plan: its capacity, its always-resident roles and
    its swapped ones (sorted), each role's bytes on it, and where its capacity comes from
    (``source``: ``declared``, or ``default`` for a Mac's GPU share the fleet does not
    declare, ``DeviceSpec.default_share``: Metal's default rule where nothing probed it)."""

    capacity_bytes: int
    always_resident: tuple[str, ...]
    swappable: tuple[str, ...]
    bytes_by_role: Mapping[str, int] = field(default_factory=dict, hash=False)
    source: str = "declared"

    @property
    def peak_bytes(self) -> int:
        """The interactive roles plus the largest batch role: what the pool must hold."""
        interactive = sum(self.bytes_by_role[r] for r in self.always_resident)
        largest = max((self.bytes_by_role[r] for r in self.swappable), default=0)
        return interactive + largest


@dataclass(frozen=True)
class DevicePlan:
    """A node plan with each placed copy's device.

    ``plan``: the node plan less the roles no device could take (they are in its
    ``unplaced`` with the reason). ``choices``: ``(role, node)`` -> the copy's device.
    ``pools``: node -> device id -> :class:`PoolPlan`, for nodes with devices.
    """

    plan: Plan
    choices: Mapping[tuple[str, str], DeviceChoice] = field(hash=False)
    pools: Mapping[str, Mapping[str, PoolPlan]] = field(hash=False)

    def device_of(self, role: str, node: str) -> DeviceChoice | None:
        """The device of ``role``'s copy on ``node``; ``None`` for a host-only copy."""
        return self.choices.get((role, node))


class _PoolLoad:
    """Mutable totals of one device pool while roles are placed on it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.interactive = 0
        self.batch_max = 0
        self.roles: dict[str, tuple[int, bool]] = {}

    def room_for(self, interactive: bool) -> int:
        """Bytes one more role of that class may take."""
        if interactive:
            return self.capacity - self.interactive - self.batch_max
        return self.capacity - self.interactive

    def add(self, role: str, need: int, interactive: bool) -> None:
        if interactive:
            self.interactive += need
        else:
            self.batch_max = max(self.batch_max, need)
        self.roles[role] = (need, interactive)


def place_on_devices(
    specs: Sequence[InferenceSpec],
    fleet: Fleet,
    node_plan: Plan,
    needs: Mapping[str, DeviceNeed],
    previous: DevicePlan | None = None,
) -> DevicePlan:
    """Each placed copy's device (see the module docstring for the rules).

    ``specs`` as given to the node planner (first of a duplicate id wins); ``needs``:
    role -> its :class:`DeviceNeed` (a device-using role without one needs its whole
    counted memory, ``resident_bytes``, on the device, every layer); ``previous``: the
    device plan in force (sticky roles keep their device when it has room). Never raises.
    """
    by_role: dict[str, InferenceSpec] = {}
    for s in specs:
        by_role.setdefault(s.role, s)
    choices: dict[tuple[str, str], DeviceChoice] = {}
    failed: dict[str, str] = {}
    dropped_copies: dict[str, list[str]] = {}
    pools: dict[str, dict[str, PoolPlan]] = {}
    for node in fleet.nodes:
        if not node.devices or node.name not in node_plan.nodes:
            continue
        loads = {d.id: _PoolLoad(d.capacity_bytes) for d in node.devices}
        here = [
            by_role[r]
            for r in (
                *node_plan.nodes[node.name].always_resident,
                *node_plan.nodes[node.name].swappable,
            )
            if r in by_role and uses_device(by_role[r], node)
        ]

        def prior(s: InferenceSpec, node_name: str = node.name) -> str | None:
            if previous is None or not s.sticky:
                return None
            choice = previous.device_of(s.role, node_name)
            return choice.device if choice is not None else None

        def need_of(s: InferenceSpec) -> DeviceNeed:
            return needs.get(s.role) or DeviceNeed(full_bytes=s.memory.resident_bytes)

        here.sort(
            key=lambda s: (
                0 if s.interactive else 1,
                0 if prior(s) is not None else 1,
                -need_of(s).full_bytes,
                s.role,
            )
        )
        for s in here:
            need = need_of(s)
            allowed = [d.id for d in devices_for(s, node)]
            fits = [i for i in allowed if need.full_bytes <= loads[i].room_for(s.interactive)]
            choice: DeviceChoice | None = None
            if fits:
                was = prior(s)
                pick = (
                    was
                    if was in fits
                    else max(
                        fits,
                        key=lambda i: (loads[i].room_for(s.interactive), -allowed.index(i)),
                    )
                )
                choice = DeviceChoice(pick, None, need.layers, need.full_bytes)
            elif need.offload == "partial" and need.by_layers:
                pick = max(
                    allowed, key=lambda i: (loads[i].room_for(s.interactive), -allowed.index(i))
                )
                room = loads[pick].room_for(s.interactive)
                ngl = max((n for n, b in enumerate(need.by_layers) if b <= room), default=0)
                if ngl >= 1:
                    choice = DeviceChoice(pick, ngl, need.layers, need.by_layers[ngl])
                else:
                    choice = DeviceChoice(None, 0, need.layers, 0)
            if choice is None:
                reason = _no_device_reason(s, node, need, loads)
                if node_plan.placements.get(s.role) == node.name:
                    failed[s.role] = reason
                else:
                    dropped_copies.setdefault(s.role, []).append(f"{node.name}: {reason}")
                continue
            if choice.device is not None:
                loads[choice.device].add(s.role, choice.device_bytes, s.interactive)
            choices[(s.role, node.name)] = choice
        pools[node.name] = {
            d.id: PoolPlan(
                capacity_bytes=d.capacity_bytes,
                always_resident=tuple(sorted(r for r, (_, i) in loads[d.id].roles.items() if i)),
                swappable=tuple(sorted(r for r, (_, i) in loads[d.id].roles.items() if not i)),
                bytes_by_role={r: b for r, (b, _) in loads[d.id].roles.items()},
                source="default" if d.default_share else "declared",
            )
            for d in node.devices
        }
    # A role whose first copy found no device leaves the plan with all its copies.
    for role in failed:
        for node_name in node_plan.nodes_of(role):
            choice = choices.pop((role, node_name), None)
            if choice is not None and choice.device is not None:
                pool = pools[node_name][choice.device]
                pools[node_name][choice.device] = _without(pool, role)
    return DevicePlan(
        plan=_plan_without(node_plan, failed, dropped_copies),
        choices=choices,
        pools=pools,
    )


def _without(pool: PoolPlan, role: str) -> PoolPlan:
    return replace(
        pool,
        always_resident=tuple(r for r in pool.always_resident if r != role),
        swappable=tuple(r for r in pool.swappable if r != role),
        bytes_by_role={r: b for r, b in pool.bytes_by_role.items() if r != role},
    )


def _no_device_reason(
    s: InferenceSpec, node: Node, need: DeviceNeed, loads: Mapping[str, _PoolLoad]
) -> str:
    kind = "interactive" if s.interactive else "batch"
    rule = (
        "the interactive roles plus the largest batch role"
        if s.interactive
        else "the interactive roles plus this one"
    )
    details = []
    for d in devices_for(s, node):
        load = loads[d.id]
        free = max(load.room_for(s.interactive), 0)
        held = ", ".join(sorted(r for r, (_, i) in load.roles.items() if i or s.interactive))
        details.append(
            f"{d.id}: {gb_text(free)} free of {gb_text(load.capacity)}"
            + (f" (held by {held})" if held else "")
        )
    partial = (
        "; `offload: partial` in its fleet entry would run the layers that fit there"
        if need.offload == "full"
        else "; `offload: partial` needs the GGUF's facts to count layers, and they are unknown"
        if not need.by_layers
        else ""
    )
    if s.flavor.facts.devices is DeviceUse.GPU_SHARE:
        # All of it is in the Mac's GPU share: no layer split to offer.
        partial = ""
        if any(d.default_share for d in devices_for(s, node)):
            partial = (
                "; the share is Metal's default for the Mac's memory: declare gpu_share_gb "
                "where the Mac runs with a larger one (iogpu.wired_limit_mb)"
            )
    return (
        f"no device on {node.name} has room for this {kind} role: it needs "
        f"{gb_text(need.full_bytes)} on one device, and on each device {rule} must fit; "
        + "; ".join(details)
        + partial
    )


def _plan_without(
    plan: Plan, failed: Mapping[str, str], dropped: Mapping[str, Sequence[str]]
) -> Plan:
    """``plan`` less the roles of ``failed`` (unplaced with their reasons) and the copies of
    ``dropped`` (named in ``copies_short``)."""
    if not failed and not dropped:
        return plan
    gone_copies = {
        (role, text.split(":", 1)[0]) for role, texts in dropped.items() for text in texts
    }
    nodes = {}
    for name, node in plan.nodes.items():

        def keep(role: str, node_name: str = name) -> bool:
            return role not in failed and (role, node_name) not in gone_copies

        nodes[name] = NodePlan(
            capacity_bytes=node.capacity_bytes,
            always_resident=tuple(r for r in node.always_resident if keep(r)),
            swappable=tuple(r for r in node.swappable if keep(r)),
        )
    placements = {r: n for r, n in plan.placements.items() if r not in failed}
    copies = {
        role: tuple(n for n in nodes_ if (role, n) not in gone_copies)
        for role, nodes_ in plan.copies.items()
        if role not in failed
    }
    unplaced = list(plan.unplaced)
    order = list(plan.placements)
    unplaced.extend((r, failed[r]) for r in order if r in failed)
    short = list(plan.copies_short)
    short.extend((r, "; ".join(dropped[r])) for r in order if r in dropped and r not in failed)
    return replace(
        plan,
        placements=placements,
        nodes=nodes,
        copies={r: c for r, c in copies.items() if c},
        unplaced=tuple(unplaced),
        copies_short=tuple(short),
    )
