"""Placement and residency by pool: a role is placed on a node and a device, held to every
pool it uses (host RAM and the device), exclusions and stickiness as before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.fleet import Fleet, Node, Platform
from rosterd.placement import plan
from rosterd.placement.device_need import GPU_TO_HOST_BANDWIDTH, DeviceNeed, partial_slowdown
from rosterd.placement.devices import DevicePlan
from rosterd.residency import (
    AlreadyResident,
    Load,
    NodeState,
    Refuse,
    Wait,
    decide_by_pool,
    excludes_each_other,
)
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.tokens import GB
from support.gpu_nodes import FLAVORS, fleets_and_roles, gpus_node, planned
from support.specs import spec


def test_four_interactive_14_gib_roles_and_one_24_gib_gpu_one_is_placed_the_rest_say_why() -> None:
    specs = [spec(f"r{i}", 14, interactive=True) for i in range(4)]
    result = planned(specs, Fleet(nodes=(gpus_node("box"),)))
    placed = sorted(result.plan.placements)
    assert len(placed) == 1
    pool = result.pools["box"]["CUDA0"]
    assert pool.always_resident == tuple(placed)
    assert pool.peak_bytes == 14 * GB
    reasons = dict(result.plan.unplaced)
    assert sorted(reasons) == sorted({"r0", "r1", "r2", "r3"} - set(placed))
    for reason in reasons.values():
        assert "no device on box has room" in reason
        assert "needs 14.00 GiB on one device" in reason
        assert "CUDA0: 10.00 GiB free of 24.00 GiB" in reason
        assert f"held by {placed[0]}" in reason
        assert "offload: partial" in reason
    (choice,) = result.choices.values()
    assert (choice.device, choice.gpu_layers) == ("CUDA0", None)


def test_four_batch_14_gib_roles_share_the_gpu_one_resident_at_a_time() -> None:
    specs = [spec(f"r{i}", 14) for i in range(4)]
    result = planned(specs, Fleet(nodes=(gpus_node("box"),)))
    assert sorted(result.plan.placements) == ["r0", "r1", "r2", "r3"]
    pool = result.pools["box"]["CUDA0"]
    assert pool.swappable == ("r0", "r1", "r2", "r3")
    assert pool.peak_bytes == 14 * GB  # the largest one: they swap
    # At run time, by pool: host RAM (120 GiB) holds all four; the GPU one at a time.
    by_id = {s.role: s for s in specs}
    host = NodeState(120 * GB, by_id, frozenset({"r0"}), {}, ("r0",))
    device = NodeState(24 * GB, by_id, frozenset({"r0"}), {}, ("r0",))
    decision = decide_by_pool(host, {"CUDA0": device}, "r1")
    assert isinstance(decision, Load)
    assert decision.evict == ("r0",)
    assert "device CUDA0" in decision.reason


def test_a_partial_offload_places_the_layers_that_fit_and_says_how_many() -> None:
    specs = [spec("big", 30, interactive=True)]
    # 40 layers + output: 0.7 GiB a layer, the output layer 2 GiB.
    by_layers = tuple(0 if n == 0 else int((2 + 0.7 * (n - 1)) * GB) for n in range(42))
    needs = {"big": DeviceNeed(by_layers[-1], by_layers, offload="partial")}
    result = planned(specs, Fleet(nodes=(gpus_node("box"),)), needs)
    choice = result.device_of("big", "box")
    assert choice is not None
    assert choice.partial
    assert choice.device == "CUDA0"
    assert choice.layers == 40
    assert choice.gpu_layers is not None
    assert by_layers[choice.gpu_layers] <= 24 * GB < by_layers[choice.gpu_layers + 1]
    # Full offload would not fit: without `partial` it is unplaced.
    full = {"big": DeviceNeed(by_layers[-1], by_layers)}
    assert "big" in dict(planned(specs, Fleet(nodes=(gpus_node("box"),)), full).plan.unplaced)


def test_a_role_no_device_could_ever_hold_is_kept_off_that_node() -> None:
    cpu_node = Node(
        name="cpu",
        memory_bytes=64 * GB,
        reserved_bytes=4 * GB,
        platform=Platform.LINUX_X86_64,
        flavors=frozenset({InferFlavor.LLAMACPP}),
    )
    # 30 GiB fits no 24 GiB GPU: it goes to the CPU-only node, where llama.cpp runs as before.
    result = planned([spec("big", 30)], Fleet(nodes=(gpus_node("box"), cpu_node)))
    assert result.plan.placements == {"big": "cpu"}
    assert result.device_of("big", "cpu") is None
    only_gpu = planned([spec("big", 30)], Fleet(nodes=(gpus_node("box"),)))
    (reason,) = dict(only_gpu.plan.unplaced).values()
    assert "needs 30.00 GiB on a device; its largest is CUDA0 with 24.00 GiB" in reason


def test_ollama_roles_and_fleets_without_devices_plan_as_before() -> None:
    specs = [spec("o", 14, flavor=InferFlavor.OLLAMA), spec("a", 14, interactive=True)]
    result = planned(specs, Fleet(nodes=(gpus_node("box"),)))
    assert result.device_of("o", "box") is None
    assert result.pools["box"]["CUDA0"].always_resident == ("a",)
    plain = Fleet(nodes=(Node("n", 64 * GB, 4 * GB, Platform.LINUX_X86_64, FLAVORS),))
    before = plan(specs, plain, time_limit_s=0.2)
    after = planned(specs, plain)
    assert after.plan == before
    assert after.choices == {}
    assert after.pools == {}


# -- properties ------------------------------------------------------------------------

CASES = fleets_and_roles(max_nodes=3, max_gpu_gb=48, max_memory_gb=128, max_roles=7, max_role_gb=40)


def _check_pools(fleet: Fleet, specs: list[InferenceSpec], result: DevicePlan) -> None:
    by_id = {s.role: s for s in specs}
    for node in fleet.nodes:
        for device in node.devices:
            pool = result.pools[node.name][device.id]
            assert pool.peak_bytes <= device.capacity_bytes, (node.name, device.id, pool)
            on_pool = {*pool.always_resident, *pool.swappable}
            here = result.plan.nodes[node.name]
            assert on_pool <= {*here.always_resident, *here.swappable}
        here = result.plan.nodes[node.name]
        roles = [by_id[r] for r in (*here.always_resident, *here.swappable)]
        for a in roles:
            for b in roles:
                if a.role < b.role and (a.interactive or b.interactive):
                    assert not excludes_each_other(a, b), (a.role, b.role)
    for (role, node_name), choice in result.choices.items():
        assert node_name in result.plan.nodes_of(role)
        if choice.device is not None:
            pool = result.pools[node_name][choice.device]
            assert role in {*pool.always_resident, *pool.swappable}


@settings(max_examples=60, deadline=None)
@given(CASES)
def test_no_pool_is_ever_over_capacity_and_exclusions_hold(
    case: tuple[Fleet, list[InferenceSpec]],
) -> None:
    fleet, specs = case
    _check_pools(fleet, specs, planned(specs, fleet))


@settings(max_examples=40, deadline=None)
@given(CASES)
def test_a_replan_keeps_sticky_roles_on_their_node_and_device(
    case: tuple[Fleet, list[InferenceSpec]],
) -> None:
    fleet, specs = case
    first = planned(specs, fleet)
    again = planned(specs, fleet, previous=first)
    _check_pools(fleet, specs, again)
    by_id = {s.role: s for s in specs}
    for role, node_name in first.plan.placements.items():
        if not by_id[role].sticky:
            continue
        assert again.plan.placements.get(role) == node_name, role
        before = first.device_of(role, node_name)
        after = again.device_of(role, node_name)
        assert (before and before.device) == (after and after.device), role


@st.composite
def pool_runs(
    draw: st.DrawFn,
) -> tuple[dict[str, InferenceSpec], dict[str, str], int, dict[str, int], list[str]]:
    count = draw(st.integers(2, 6))
    names = [f"r{k}" for k in range(count)]
    specs = {
        n: spec(
            n,
            draw(st.integers(1, 12)),
            interactive=draw(st.booleans()),
            excludes=draw(st.lists(st.sampled_from([m for m in names if m != n]), max_size=1)),
        )
        for n in names
    }
    devices = {n: draw(st.sampled_from(["CUDA0", "CUDA1", "host"])) for n in names}
    host_capacity = draw(st.integers(12, 40)) * GB
    device_capacity = {"CUDA0": draw(st.integers(12, 24)) * GB, "CUDA1": 16 * GB}
    requests = draw(st.lists(st.sampled_from(names), min_size=1, max_size=25))
    return specs, devices, host_capacity, device_capacity, requests


@settings(max_examples=80, deadline=None)
@given(pool_runs())
def test_in_any_order_of_requests_no_pool_is_over_capacity(
    run: tuple[dict[str, InferenceSpec], dict[str, str], int, dict[str, int], list[str]],
) -> None:
    specs, device_of, host_capacity, device_capacity, requests = run
    # On its device a role holds 60 % of its host figure (the weights are mapped in RAM too).
    device_specs = {
        d: {
            n: InferenceSpec(
                role=n,
                flavor=s.flavor,
                memory=MemorySpec(weights_bytes=s.memory.resident_bytes * 6 // 10),
                latency_class=s.latency_class,
                excludes=s.excludes,
            )
            for n, s in specs.items()
            if device_of[n] == d
        }
        for d in device_capacity
    }
    resident: list[str] = []
    for role in requests:
        host = NodeState(host_capacity, specs, frozenset(resident), {}, tuple(resident))
        pools = {
            d: NodeState(
                device_capacity[d],
                device_specs[d],
                frozenset(r for r in resident if r in device_specs[d]),
                {},
                tuple(r for r in resident if r in device_specs[d]),
            )
            for d in device_capacity
        }
        decision = decide_by_pool(host, pools, role)
        assert isinstance(decision, Load | Wait | Refuse | AlreadyResident)
        if isinstance(decision, Load):
            resident = [r for r in resident if r not in decision.evict] + [role]
        assert sum(specs[r].memory.resident_bytes for r in resident) <= host_capacity
        for d, capacity in device_capacity.items():
            held = sum(
                device_specs[d][r].memory.resident_bytes for r in resident if r in device_specs[d]
            )
            assert held <= capacity, (d, resident)
        for a in resident:
            for b in resident:
                if a < b:
                    assert not excludes_each_other(specs[a], specs[b]), (a, b)


def test_the_expected_slowdown_of_a_partial_offload_grows_with_the_layers_on_the_host() -> None:
    assert partial_slowdown(999, 18) == 1.0  # -ngl 999: every layer
    assert partial_slowdown(19, 18) == 1.0  # the output layer and all 18
    assert partial_slowdown(10, 18) == pytest.approx(0.5 + 0.5 * GPU_TO_HOST_BANDWIDTH)
    assert partial_slowdown(0, 18) == GPU_TO_HOST_BANDWIDTH
    slowdowns = [partial_slowdown(n, 18) for n in range(20)]
    assert slowdowns == sorted(slowdowns, reverse=True)
