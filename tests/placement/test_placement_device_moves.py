"""A role whose node's devices are full is placed on another node's device (issue 29): the
device step's repair after the node-by-node pass, held to host RAM, exclusions,
stickiness and copies as the node planner holds them. Devices here are declared ones (the
planner only counts; no GPU is needed)."""

from __future__ import annotations

from hypothesis import given, settings

from rosterd.fleet import Fleet, Node, Platform
from rosterd.placement.device_need import DeviceNeed, uses_device
from rosterd.placement.devices import DevicePlan, place_on_devices
from rosterd.placement.problem import NodeLoad, NodePlan, Plan
from rosterd.residency import excludes_each_other
from rosterd.spec import InferenceSpec
from rosterd.tokens import GB
from support.gpu_nodes import FLAVORS, fleet_of, fleets_and_roles, gpus_node, planned
from support.specs import spec


def all_on(node: str, specs: list[InferenceSpec], fleet: Fleet) -> Plan:
    """A node plan that puts every role on ``node`` (host RAM holds them all there), as a
    node planner blind to devices may: the case the device step must repair."""
    nodes = {
        n.name: NodePlan(
            n.capacity_bytes,
            tuple(sorted(s.role for s in specs if s.interactive)) if n.name == node else (),
            tuple(sorted(s.role for s in specs if not s.interactive)) if n.name == node else (),
        )
        for n in fleet.nodes
    }
    return Plan({s.role: node for s in specs}, (), nodes, "test")


def test_three_interactive_14_gib_roles_on_two_24_gib_gpus_one_per_node_the_third_says_why() -> (
    None
):
    fleet = Fleet(nodes=(gpus_node("a"), gpus_node("b")))
    specs = [spec(f"r{i}", 14, interactive=True) for i in range(3)]
    result = planned(specs, fleet)
    assert len(result.plan.placements) == 2
    assert sorted(result.plan.placements.values()) == ["a", "b"]
    ((role, reason),) = result.plan.unplaced
    assert role not in result.plan.placements
    assert reason.startswith("no device on a or b has room for this interactive role")
    assert "needs 14.00 GiB on one device" in reason
    on_a = result.pools["a"]["CUDA0"].always_resident[0]
    on_b = result.pools["b"]["CUDA0"].always_resident[0]
    assert f"on a: CUDA0: 10.00 GiB free of 24.00 GiB (held by {on_a})" in reason
    assert f"on b: CUDA0: 10.00 GiB free of 24.00 GiB (held by {on_b})" in reason
    for name in ("a", "b"):
        assert result.pools[name]["CUDA0"].peak_bytes == 14 * GB


def test_a_role_whose_nodes_gpu_is_full_goes_to_the_other_nodes_gpu() -> None:
    fleet = Fleet(nodes=(gpus_node("a"), gpus_node("b")))
    specs = [spec("x", 14, interactive=True), spec("y", 14, interactive=True)]
    result = place_on_devices(specs, fleet, all_on("a", specs, fleet), {})
    assert result.plan.placements == {"x": "a", "y": "b"}
    assert result.plan.unplaced == ()
    assert result.plan.nodes["a"].always_resident == ("x",)
    assert result.plan.nodes["b"].always_resident == ("y",)
    y = result.device_of("y", "b")
    assert y is not None
    assert (y.device, y.gpu_layers) == ("CUDA0", None)
    assert result.device_of("y", "a") is None
    assert result.pools["b"]["CUDA0"].always_resident == ("y",)


def test_a_moved_sticky_role_stays_on_its_new_node_at_the_next_plan() -> None:
    fleet = Fleet(nodes=(gpus_node("a"), gpus_node("b")))
    specs = [spec("x", 14, interactive=True), spec("y", 14, interactive=True)]
    first = place_on_devices(specs, fleet, all_on("a", specs, fleet), {})
    again = planned(specs, fleet, previous=first)
    assert again.plan.placements == {"x": "a", "y": "b"}


def test_a_role_is_not_moved_where_host_ram_or_an_exclusion_keeps_it_out() -> None:
    fleet = Fleet(nodes=(gpus_node("a"), gpus_node("b", memory_gb=20), gpus_node("c")))
    specs = [
        spec("x", 14, interactive=True),
        spec("y", 14, interactive=True),
        spec("guard", 1, interactive=True, excludes=("y",)),
    ]
    node_plan = all_on("a", specs[:2], fleet)
    node_plan = Plan(
        {**node_plan.placements, "guard": "c"},
        (),
        {**node_plan.nodes, "c": NodePlan(120 * GB, ("guard",), ())},
        "test",
    )
    result = place_on_devices(specs, fleet, node_plan, {})
    assert result.plan.placements == {"x": "a", "guard": "c"}
    ((role, reason),) = result.plan.unplaced
    assert role == "y"
    assert "no device on a has room" in reason
    assert "b: host RAM has no room (interactive 0.00 GiB + this 14.00 GiB" in reason
    assert "c: excluded by guard placed there" in reason


def test_a_node_without_devices_is_not_tried() -> None:
    cpu = Node("cpu", 128 * GB, 8 * GB, Platform.LINUX_X86_64, FLAVORS)
    fleet = Fleet(nodes=(gpus_node("a"), cpu))
    specs = [spec("x", 14, interactive=True), spec("y", 14, interactive=True)]
    result = place_on_devices(specs, fleet, all_on("a", specs, fleet), {})
    assert result.plan.placements == {"x": "a"}
    assert dict(result.plan.unplaced)["y"].startswith("no device on a has room")


def test_a_further_copy_whose_gpu_is_full_goes_to_a_node_holding_no_copy() -> None:
    fleet = fleet_of(gpus_node("a"), gpus_node("b"), gpus_node("c"), chat=2)
    specs = [spec("chat", 14, interactive=True), spec("big", 14, interactive=True)]
    nodes = {
        "a": NodePlan(120 * GB, ("chat",), ()),
        "b": NodePlan(120 * GB, ("big", "chat"), ()),
        "c": NodePlan(120 * GB, (), ()),
    }
    node_plan = Plan({"chat": "a", "big": "b"}, (), nodes, "test", copies={"chat": ("b",)})
    result = place_on_devices(specs, fleet, node_plan, {})
    assert result.plan.nodes_of("chat") == ("a", "c")
    assert result.plan.placements["big"] == "b"
    assert result.plan.copies_short == ()
    assert result.pools["c"]["CUDA0"].always_resident == ("chat",)


def test_a_further_copy_never_takes_the_gpu_a_role_with_no_copy_needs() -> None:
    # Two nodes with one 24 GiB GPU each, coder-0 asking for two copies and coder-1 for
    # one, each 14 GiB: coder-1 gets the second GPU and coder-0 one copy, with the reason
    # (the further copy took it, and coder-1 was left unplaced, in fleet order of names).
    fleet = fleet_of(gpus_node("a"), gpus_node("b"), **{"coder-0": 2})
    specs = [spec("coder-0", 14, interactive=True), spec("coder-1", 14, interactive=True)]
    result = planned(specs, fleet)
    assert sorted(result.plan.placements) == ["coder-0", "coder-1"]
    assert result.plan.nodes_of("coder-0") == (result.plan.placements["coder-0"],)
    assert result.plan.placements["coder-1"] != result.plan.placements["coder-0"]
    ((role, why),) = result.plan.copies_short
    assert role == "coder-0"
    assert "held by coder-1" in why, why


def test_a_partial_offload_is_not_moved() -> None:
    fleet = Fleet(nodes=(gpus_node("a"), gpus_node("b")))
    specs = [spec("x", 14, interactive=True), spec("y", 14, interactive=True)]
    layers = tuple(i * GB for i in range(16))  # -ngl 0..15: 1 GiB a layer, 14 in all
    needs = {"y": DeviceNeed(14 * GB, layers, "partial")}
    result = place_on_devices(specs, fleet, all_on("a", specs, fleet), needs)
    assert result.plan.placements == {"x": "a", "y": "a"}
    y = result.device_of("y", "a")
    assert y is not None
    assert y.partial
    assert y.gpu_layers == 10


# -- properties ------------------------------------------------------------------------


CASES = fleets_and_roles(max_nodes=4, max_gpu_gb=32, max_memory_gb=96, max_roles=8, max_role_gb=30)


def _check(fleet: Fleet, specs: list[InferenceSpec], result: DevicePlan) -> None:
    """No pool over its capacity, exclusions held, and no role unplaced for want of device
    room while a node that runs it on a device could hold it, with what is placed there,
    in host RAM and on a device."""
    by_id = {s.role: s for s in specs}
    hosts = {}
    for node in fleet.nodes:
        here = result.plan.nodes[node.name]
        roles = [by_id[r] for r in (*here.always_resident, *here.swappable)]
        hosts[node.name] = NodeLoad(node)
        for s in roles:
            hosts[node.name].add(s)
        assert hosts[node.name].headroom() >= 0, node.name
        for a in roles:
            for b in roles:
                if a.role < b.role and (a.interactive or b.interactive):
                    assert not excludes_each_other(a, b), (a.role, b.role)
        for device in node.devices:
            pool = result.pools[node.name][device.id]
            assert pool.peak_bytes <= device.capacity_bytes, (node.name, device.id, pool)
            assert {*pool.always_resident, *pool.swappable} <= {r.role for r in roles}
    for role, reason in result.plan.unplaced:
        if not reason.startswith("no device on "):
            continue
        s = by_id[role]
        need = s.memory.resident_bytes
        for node in fleet.nodes:
            if s.flavor not in node.flavors or not uses_device(s, node):
                continue
            host = hosts[node.name]
            if not host.fits(s) or host.excluded_by(s):
                continue
            for device in node.devices:
                pool = result.pools[node.name][device.id]
                interactive = sum(pool.bytes_by_role[r] for r in pool.always_resident)
                room = device.capacity_bytes - interactive
                if s.interactive:
                    room -= max((pool.bytes_by_role[r] for r in pool.swappable), default=0)
                assert need > room, (role, node.name, device.id, reason)


@settings(max_examples=80, deadline=None)
@given(CASES)
def test_no_role_is_left_off_a_device_that_could_hold_it_and_no_pool_is_over(
    case: tuple[Fleet, list[InferenceSpec]],
) -> None:
    fleet, specs = case
    _check(fleet, specs, planned(specs, fleet))


@settings(max_examples=40, deadline=None)
@given(CASES)
def test_a_replan_keeps_sticky_roles_where_they_are_moved_or_not(
    case: tuple[Fleet, list[InferenceSpec]],
) -> None:
    fleet, specs = case
    first = planned(specs, fleet)
    again = planned(specs, fleet, previous=first)
    _check(fleet, specs, again)
    for role, node_name in first.plan.placements.items():
        if not next(s for s in specs if s.role == role).sticky:
            continue
        assert again.plan.placements.get(role) == node_name, role
        before, after = first.device_of(role, node_name), again.device_of(role, node_name)
        assert (before and before.device) == (after and after.device), role
