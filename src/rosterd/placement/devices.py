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
  there are held to too;
- ollama's size their GPU use themselves and stay host-only here.

A role is placed on the device with room for it (its previous device first when it is
sticky; else the one that leaves the most room, then the first declared). When no device
has room, its ``offload: partial`` entry places the layers that fit on the device with the
most room (the rest on the CPU, shown with the layer count); otherwise it is unplaced,
with the reason naming each device, what the role needs and what is free there. Roles
are taken interactive first, then sticky roles with a previous device, then the biggest,
then by id.

A copy that finds no device with room on its node is moved to another node (a repair
after the node-by-node pass; :func:`place_on_devices`): first copies before further
copies, then interactive, biggest, by id; it tries each other node that runs it on a
device and holds no copy of it (a sticky role's node in the plan in force first, then
the most room on a device for its class, then the most host headroom, then fleet order)
and takes the first where host RAM has room and exclusions hold by the node planner's
rules (the interactive roles plus the largest batch role fit; no role shares a node with
an interactive role it excludes or that excludes it) and a device has room by the rule
above. Nothing placed before it moves or changes device, so a sticky role keeps its node
and device where it still fits, and every pool stays within its capacity. What this
guarantees: no role is left unplaced for want of device room while another node that
runs it on a device could take it, with what is placed there when it is tried, in both
host RAM and a device (``tests/placement/test_placement_device_moves.py`` holds it as a
property). A node without devices is not tried: a role meant for a device is not moved
to a CPU behind the operator's back. ``offload: partial`` roles stay on their node with
the layers that fit.

A role whose first copy finds no device anywhere leaves the plan whole (its further
copies too), with the reason naming each node tried, its devices, what the role needs
and what is free there; a further copy that finds none is dropped and named in
``copies_short``. The node planner itself holds roles to host RAM only (the static
check, :func:`device_eligibility`, keeps a role off nodes where no device could ever
hold it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rosterd.backends.copy_names import copy_unit_name, is_copy_of
from rosterd.flavors import DeviceUse
from rosterd.fleet import Fleet, Node
from rosterd.fleet.model import DeviceSpec
from rosterd.placement.device_need import DeviceNeed, devices_for, gb_text, uses_device
from rosterd.placement.plan_edits import plan_after_moves, plan_less_copies
from rosterd.placement.problem import NodeLoad, Plan
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
    ``unplaced`` with the reason). ``choices``: ``(role, node)`` -> the copy's device; a
    further copy on a node that holds one already is keyed by its internal name
    (``(chat~2, node)``, ``rosterd.backends.copy_names.device_copy_name``), which is
    also its name in the node's pools.
    ``pools``: node -> device id -> :class:`PoolPlan`, for nodes with devices.
    """

    plan: Plan
    choices: Mapping[tuple[str, str], DeviceChoice] = field(hash=False)
    pools: Mapping[str, Mapping[str, PoolPlan]] = field(hash=False)

    def device_of(self, role: str, node: str) -> DeviceChoice | None:
        """The device of ``role``'s copy on ``node`` (``role`` may be a further copy's
        internal name, ``chat~2``); ``None`` for a host-only copy."""
        return self.choices.get((role, node))

    def copies_on(self, role: str, node: str) -> list[tuple[str, DeviceChoice]]:
        """``(unit name, device)`` of each copy of ``role`` on ``node``: ``role`` itself
        first, then its further copies there by device (``chat~2``)."""
        found = [
            (name, choice)
            for (name, where), choice in self.choices.items()
            if where == node and is_copy_of(name, role)
        ]
        return sorted(found, key=lambda c: (c[0] != role, c[0]))

    def copy_places(self, role: str) -> list[str]:
        """Where each copy of ``role`` runs, in words: its node (``box``), or, for copies
        of it on several devices of one node, the node and device (``box (CUDA0)``,
        ``box (CUDA1)``); first copy first."""
        places: list[str] = []
        for node in dict.fromkeys(self.plan.nodes_of(role)):
            here = self.copies_on(role, node)
            if len(here) > 1:
                places.extend(f"{node} ({c.device})" for _, c in here)
            else:
                places.append(node)
        return places


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

    def remove(self, role: str) -> None:
        self.roles.pop(role, None)
        self.interactive = sum(b for b, i in self.roles.values() if i)
        self.batch_max = max((b for b, i in self.roles.values() if not i), default=0)


@dataclass(frozen=True)
class _Miss:
    """A copy of a role that found no device with room on its node: the role, the node,
    whether it is the role's first copy, and the node's devices in words when it missed."""

    role: str
    node: str
    first: bool
    details: str


class _Placer:
    """The device step's shared inputs and its running totals (see :func:`place_on_devices`)."""

    def __init__(
        self,
        specs: Sequence[InferenceSpec],
        fleet: Fleet,
        node_plan: Plan,
        needs: Mapping[str, DeviceNeed],
        previous: DevicePlan | None,
    ) -> None:
        self.by_role: dict[str, InferenceSpec] = {}
        for s in specs:
            self.by_role.setdefault(s.role, s)
        self.fleet = fleet
        self.node_plan = node_plan
        self.needs = needs
        self.previous = previous
        self.loads: dict[str, dict[str, _PoolLoad]] = {}
        self.choices: dict[tuple[str, str], DeviceChoice] = {}

    def need_of(self, s: InferenceSpec) -> DeviceNeed:
        return self.needs.get(s.role) or DeviceNeed(full_bytes=s.memory.resident_bytes)

    def prior(self, s: InferenceSpec, node_name: str) -> str | None:
        """The device ``s`` had on ``node_name`` in the plan in force, if it is sticky."""
        if self.previous is None or not s.sticky:
            return None
        choice = self.previous.device_of(s.role, node_name)
        return choice.device if choice is not None else None

    def held_here(self, role: str, node_name: str) -> bool:
        """Whether a copy of ``role`` has its device on ``node_name`` already."""
        return any(n == node_name and is_copy_of(r, role) for r, n in self.choices)

    def choose(self, s: InferenceSpec, node: Node) -> DeviceChoice | None:
        """``s``'s device on ``node`` as its pools stand (``None``: none has room and no
        partial offload is allowed); added to the pools when found. A further copy of
        ``s`` on ``node`` takes a device that holds no copy of it, whole (no partial
        offload), under its internal name (``chat~2``)."""
        loads = self.loads[node.name]
        need = self.need_of(s)
        further = self.held_here(s.role, node.name)
        allowed = [
            d.id
            for d in devices_for(s, node)
            if not any(is_copy_of(r, s.role) for r in loads[d.id].roles)
        ]
        fits = [i for i in allowed if need.full_bytes <= loads[i].room_for(s.interactive)]
        choice: DeviceChoice | None = None
        if further:
            if not fits:
                return None
            was = self._prior_further(s, node.name)
            pick = (
                was
                if was in fits
                else max(fits, key=lambda i: (loads[i].room_for(s.interactive), -allowed.index(i)))
            )
            nth = 1 + sum(1 for r, n in self.choices if n == node.name and is_copy_of(r, s.role))
            name = copy_unit_name(s.role, nth)
            loads[pick].add(name, need.full_bytes, s.interactive)
            choice = DeviceChoice(pick, None, need.layers, need.full_bytes)
            self.choices[(name, node.name)] = choice
            return choice
        if fits:
            was = self.prior(s, node.name)
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
            pick = max(allowed, key=lambda i: (loads[i].room_for(s.interactive), -allowed.index(i)))
            room = loads[pick].room_for(s.interactive)
            ngl = max((n for n, b in enumerate(need.by_layers) if b <= room), default=0)
            if ngl >= 1:
                choice = DeviceChoice(pick, ngl, need.layers, need.by_layers[ngl])
            else:
                choice = DeviceChoice(None, 0, need.layers, 0)
        if choice is not None:
            if choice.device is not None:
                loads[choice.device].add(s.role, choice.device_bytes, s.interactive)
            self.choices[(s.role, node.name)] = choice
        return choice

    def _prior_further(self, s: InferenceSpec, node_name: str) -> str | None:
        """A device a further copy of sticky ``s`` had on ``node_name`` in the plan in
        force and no copy has taken yet."""
        if self.previous is None or not s.sticky:
            return None
        for name, choice in self.previous.copies_on(s.role, node_name)[1:]:
            if (name, node_name) not in self.choices:
                return choice.device
        return None

    def device_room(self, s: InferenceSpec, node: Node) -> int:
        """The most room one of ``node``'s devices has for ``s``'s class, in bytes."""
        loads = self.loads[node.name]
        return max((loads[d.id].room_for(s.interactive) for d in devices_for(s, node)), default=0)

    def details(self, s: InferenceSpec, node: Node) -> str:
        """``node``'s devices for ``s`` in words: what is free of what, held by whom."""
        loads = self.loads[node.name]
        details = []
        for d in devices_for(s, node):
            load = loads[d.id]
            free = max(load.room_for(s.interactive), 0)
            held = ", ".join(sorted(r for r, (_, i) in load.roles.items() if i or s.interactive))
            details.append(
                f"{d.id}: {gb_text(free)} free of {gb_text(load.capacity)}"
                + (f" (held by {held})" if held else "")
            )
        return "; ".join(details)


def place_on_devices(
    specs: Sequence[InferenceSpec],
    fleet: Fleet,
    node_plan: Plan,
    needs: Mapping[str, DeviceNeed],
    previous: DevicePlan | None = None,
) -> DevicePlan:
    """Each placed copy's device, moving a copy whose node's devices are full to another
    node's device (see the module docstring for the rules and what they guarantee).

    ``specs`` as given to the node planner (first of a duplicate id wins); ``needs``:
    role -> its :class:`DeviceNeed` (a device-using role without one needs its whole
    counted memory, ``resident_bytes``, on the device, every layer); ``previous``: the
    device plan in force (sticky roles keep their device when it has room). Never raises.
    """
    placer = _Placer(specs, fleet, node_plan, needs, previous)
    by_role = placer.by_role
    misses: list[_Miss] = []
    extras: dict[str, list[tuple[str, str]]] = {}  # role -> (node, why) of a dropped copy
    for node in fleet.nodes:
        if not node.devices or node.name not in node_plan.nodes:
            continue
        placer.loads[node.name] = {d.id: _PoolLoad(d.capacity_bytes) for d in node.devices}
        roles = [
            r
            for r in (
                *node_plan.nodes[node.name].always_resident,
                *node_plan.nodes[node.name].swappable,
            )
            if r in by_role and uses_device(by_role[r], node)
        ]
        # (spec, nth copy on this node): every role's copy before any role's second one, and
        # a role's first copy before another role's further copy, so that a further copy
        # never takes the device a role with no other copy needs.
        here = [(by_role[r], roles[:i].count(r)) for i, r in enumerate(roles)]

        def order(
            unit: tuple[InferenceSpec, int], node_name: str = node.name
        ) -> tuple[int, int, int, int, int, str]:
            s, nth = unit
            return (
                nth,
                0 if node_plan.placements.get(s.role) == node_name else 1,
                0 if s.interactive else 1,
                0 if placer.prior(s, node_name) is not None else 1,
                -placer.need_of(s).full_bytes,
                s.role,
            )

        for s, nth in sorted(here, key=order):
            if nth:
                # A further copy on a node holding one: another device here, or none.
                if not placer.held_here(s.role, node.name) or placer.choose(s, node) is None:
                    extras.setdefault(s.role, []).append(
                        (node.name, _no_other_device(s, placer, node))
                    )
            elif placer.choose(s, node) is None:
                first = node_plan.placements.get(s.role) == node.name
                misses.append(_Miss(s.role, node.name, first, placer.details(s, node)))
    node_plan = plan_less_copies(node_plan, extras)
    placer.node_plan = node_plan
    moved, failed, dropped = _move_missed(placer, misses)
    # A role whose first copy found no device anywhere leaves the plan with all its copies.
    for role in failed:
        for name, node_name in [k for k in placer.choices if is_copy_of(k[0], role)]:
            choice = placer.choices.pop((name, node_name))
            if choice.device is not None:
                placer.loads[node_name][choice.device].remove(name)
    pools = {
        node.name: {d.id: _pool_plan(d, placer.loads[node.name][d.id]) for d in node.devices}
        for node in fleet.nodes
        if node.name in placer.loads
    }
    return DevicePlan(
        plan=plan_after_moves(node_plan, by_role, moved, failed, dropped),
        choices=placer.choices,
        pools=pools,
    )


def _no_other_device(s: InferenceSpec, placer: _Placer, node: Node) -> str:
    """Why a further copy of ``s`` on ``node``, which holds a copy, found no device there."""
    need = gb_text(placer.need_of(s).full_bytes)
    return (
        f"no other device has room for this copy ({need} on one device that holds no "
        f"copy of it): {placer.details(s, node)}"
    )


def _pool_plan(device: DeviceSpec, load: _PoolLoad) -> PoolPlan:
    """The plan of one device pool from its totals once every role is placed."""
    return PoolPlan(
        capacity_bytes=device.capacity_bytes,
        always_resident=tuple(sorted(r for r, (_, i) in load.roles.items() if i)),
        swappable=tuple(sorted(r for r, (_, i) in load.roles.items() if not i)),
        bytes_by_role={r: b for r, (b, _) in load.roles.items()},
        source="default" if device.default_share else "declared",
    )


def _move_missed(
    placer: _Placer, misses: Sequence[_Miss]
) -> tuple[dict[tuple[str, str], str], dict[str, str], dict[str, list[tuple[str, str]]]]:
    """Each missed copy on another node whose devices and host RAM have room (first copies
    first, then interactive, biggest, by id): ``(role, node missed) -> node moved to``;
    the first copies that found none (role -> reason); the further copies that found none
    (role -> ``(node, reason)``)."""
    node_plan, by_role = placer.node_plan, placer.by_role
    nodes = {n.name: n for n in placer.fleet.nodes}
    missed = {(m.role, m.node) for m in misses}
    holding = {
        role: {n for n in node_plan.nodes_of(role) if (role, n) not in missed}
        for role in {m.role for m in misses}
    }
    host: dict[str, NodeLoad] = {}
    for name, share in node_plan.nodes.items():
        if name not in nodes:
            continue
        host[name] = NodeLoad(nodes[name])
        for role in (*share.always_resident, *share.swappable):
            if role in by_role and (role, name) not in missed:
                host[name].add(by_role[role])
    moved: dict[tuple[str, str], str] = {}
    failed: dict[str, str] = {}
    dropped: dict[str, list[tuple[str, str]]] = {}
    order = sorted(
        misses,
        key=lambda m: (
            0 if m.first else 1,
            0 if by_role[m.role].interactive else 1,
            -placer.need_of(by_role[m.role]).full_bytes,
            m.role,
            placer.fleet.nodes.index(nodes[m.node]),
        ),
    )
    for miss in order:
        s = by_role[miss.role]
        tried: list[tuple[str, str]] = [(miss.node, miss.details)]
        elsewhere: list[str] = []
        target: str | None = None
        for node in _candidates(placer, s, miss.node, holding[s.role], host):
            clash = host[node.name].excluded_by(s)
            if clash:
                elsewhere.append(f"{node.name}: excluded by {', '.join(clash)} placed there")
            elif not host[node.name].fits(s):
                elsewhere.append(
                    f"{node.name}: host RAM has no room ({_host_words(s, host[node.name])})"
                )
            elif placer.choose(s, node) is None:
                tried.append((node.name, placer.details(s, node)))
            else:
                target = node.name
                break
        if target is not None:
            moved[(s.role, miss.node)] = target
            holding[s.role].add(target)
            host[target].add(s)
            continue
        reason = _no_device_reason(s, placer, tried, elsewhere)
        if miss.first:
            failed[s.role] = reason
        else:
            dropped.setdefault(s.role, []).append((miss.node, reason))
    return moved, failed, dropped


def _candidates(
    placer: _Placer,
    s: InferenceSpec,
    missed_on: str,
    holding: set[str],
    host: Mapping[str, NodeLoad],
) -> list[Node]:
    """The other nodes where ``s`` would run on a device and that hold no copy of it: a
    sticky role's node in the plan in force first, then the most room on a device for its
    class, then the most host headroom, then fleet order."""
    before = set(placer.previous.plan.nodes_of(s.role)) if placer.previous and s.sticky else set()
    options = [
        (i, node)
        for i, node in enumerate(placer.fleet.nodes)
        if node.name != missed_on
        and node.name not in holding
        and node.name in placer.loads
        and node.name in host
        and s.flavor in node.flavors
        and uses_device(s, node)
    ]
    options.sort(
        key=lambda o: (
            0 if o[1].name in before else 1,
            -placer.device_room(s, o[1]),
            -host[o[1].name].headroom(),
            o[0],
        )
    )
    return [node for _, node in options]


def _host_words(s: InferenceSpec, load: NodeLoad) -> str:
    """Why ``load``'s host RAM cannot take ``s`` too, with the numbers."""
    need = gb_text(s.memory.resident_bytes)
    if s.interactive:
        return (
            f"interactive {gb_text(load.interactive)} + this {need} + largest batch "
            f"{gb_text(load.batch_max)} > capacity {gb_text(load.capacity)}"
        )
    return (
        f"interactive {gb_text(load.interactive)} + this {need} > capacity {gb_text(load.capacity)}"
    )


def _no_device_reason(
    s: InferenceSpec,
    placer: _Placer,
    tried: Sequence[tuple[str, str]],
    elsewhere: Sequence[str],
) -> str:
    """Why no device has room for ``s``: ``tried``, ``(node, its devices in words)`` for
    each node whose devices lacked room; ``elsewhere``, the other nodes
    with a device for it that could not take it for another reason (host RAM, exclusions)."""
    need = placer.need_of(s)
    kind = "interactive" if s.interactive else "batch"
    rule = (
        "the interactive roles plus the largest batch role"
        if s.interactive
        else "the interactive roles plus this one"
    )
    index = {n.name: i for i, n in enumerate(placer.fleet.nodes)}
    tried = sorted(tried, key=lambda t: index[t[0]])  # in fleet order, as plans list nodes
    if len(tried) == 1:
        where, details = tried[0][0], tried[0][1]
    else:
        where = ", ".join(n for n, _ in tried[:-1]) + f" or {tried[-1][0]}"
        details = "; ".join(f"on {n}: {text}" for n, text in tried)
    if elsewhere:
        details += "; nor elsewhere: " + "; ".join(elsewhere)
    partial = (
        "; `offload: partial` in its fleet entry would run the layers that fit there"
        if need.offload == "full"
        else "; `offload: partial` needs the GGUF's facts to count layers, and they are unknown"
        if not need.by_layers
        else ""
    )
    if s.flavor.facts.devices is DeviceUse.GPU_SHARE:
        partial = ""  # all of it is in the Mac's GPU share: no layer split to offer
    nodes = {n.name: n for n in placer.fleet.nodes}
    if any(d.default_share for n, _ in tried for d in devices_for(s, nodes[n])):
        partial += (
            "; the share is Metal's default for the Mac's memory: declare gpu_share_gb "
            "where the Mac runs with a larger one (iogpu.wired_limit_mb)"
        )
    return (
        f"no device on {where} has room for this {kind} role: it needs "
        f"{gb_text(need.full_bytes)} on one device, and on each device {rule} must fit; "
        + details
        + partial
    )
