"""Copies of a role on one node's devices (issue 29, item 5): ``replicas: 2`` on a node with
two GPUs places one copy per GPU, a further copy goes on a node holding one only when no
node of its own is left, and no device ever holds two copies of one role. Devices here are
declared ones (the planner only counts; no GPU is needed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.fleet import Node, Platform
from rosterd.placement import violations
from rosterd.tokens import GB
from support.gpu_nodes import FLAVORS, fleet_of, gpus_node, planned
from support.specs import spec


def test_replicas_2_on_a_node_with_two_24_gib_gpus_puts_one_14_gib_copy_on_each() -> None:
    fleet = fleet_of(gpus_node("box", 2), chat=2)
    result = planned([spec("chat", 14, interactive=True)], fleet)
    assert result.plan.nodes_of("chat") == ("box", "box")
    assert result.plan.copies_short == ()
    assert [(name, c.device) for name, c in result.copies_on("chat", "box")] == [
        ("chat", "CUDA0"),
        ("chat~2", "CUDA1"),
    ]
    assert result.pools["box"]["CUDA0"].always_resident == ("chat",)
    assert result.pools["box"]["CUDA1"].always_resident == ("chat~2",)
    assert result.pools["box"]["CUDA1"].peak_bytes == 14 * GB
    assert result.copy_places("chat") == ["box (CUDA0)", "box (CUDA1)"]
    # each copy counts its host part in the node's RAM
    assert result.plan.nodes["box"].always_resident == ("chat", "chat")
    assert violations([spec("chat", 14, interactive=True)], fleet, result.plan) == []


def test_with_one_gpu_the_node_holds_one_copy_and_copies_short_says_why() -> None:
    fleet = fleet_of(gpus_node("box", 1), chat=2)
    result = planned([spec("chat", 14, interactive=True)], fleet)
    assert result.plan.nodes_of("chat") == ("box",)
    ((role, reason),) = result.plan.copies_short
    assert role == "chat"
    assert reason.startswith("1 of 2 copies placed (each copy needs a node of its own, or a")
    assert "box: CUDA0 holds its copy; no other device on box" in reason


def test_a_node_of_its_own_comes_before_another_device_of_a_node_holding_a_copy() -> None:
    fleet = fleet_of(gpus_node("a", 2), gpus_node("b", 1), chat=2)
    result = planned([spec("chat", 14, interactive=True)], fleet)
    assert sorted(result.plan.nodes_of("chat")) == ["a", "b"]
    assert result.copy_places("chat") == list(result.plan.nodes_of("chat"))  # plain names


def test_a_second_copy_whose_other_device_is_full_is_dropped_and_named() -> None:
    fleet = fleet_of(gpus_node("box", 2), chat=2)
    specs = [spec("chat", 14, interactive=True), spec("big", 20, interactive=True)]
    result = planned(specs, fleet)
    assert sorted(result.plan.placements) == ["big", "chat"]
    assert result.plan.nodes_of("chat") == ("box",)
    ((role, reason),) = result.plan.copies_short
    assert role == "chat"
    assert "box: no other device has room for this copy" in reason
    assert result.plan.nodes["box"].always_resident == ("big", "chat")


def test_a_role_on_the_cpu_keeps_one_copy_per_node() -> None:
    node = Node(
        name="box",
        memory_bytes=128 * GB,
        reserved_bytes=8 * GB,
        platform=Platform.LINUX_X86_64,
        flavors=FLAVORS,
    )
    result = planned([spec("chat", 14, interactive=True)], fleet_of(node, chat=2))
    assert result.plan.nodes_of("chat") == ("box",)
    ((_, reason),) = result.plan.copies_short
    assert "(each copy needs a node of its own): the fleet has no other node" in reason


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    roles=st.lists(
        st.tuples(st.integers(2, 30), st.booleans(), st.integers(1, 4)), min_size=1, max_size=4
    ),
)
def test_no_device_holds_two_copies_of_a_role_and_no_pool_is_over(
    gpus: list[int], roles: list[tuple[int, bool, int]]
) -> None:
    nodes = [gpus_node(f"n{i}", n, gpu_gb=24, memory_gb=64) for i, n in enumerate(gpus)]
    specs = [spec(f"r{i}", gb, interactive=inter) for i, (gb, inter, _) in enumerate(roles)]
    fleet = fleet_of(*nodes, **{f"r{i}": n for i, (_, _, n) in enumerate(roles)})
    result = planned(specs, fleet)
    assert violations(specs, fleet, result.plan) == []
    for node, pools in result.pools.items():
        for pool in pools.values():
            assert pool.peak_bytes <= pool.capacity_bytes
            held = [*pool.always_resident, *pool.swappable]
            roles_there = [name.partition("~")[0] for name in held]
            assert len(roles_there) == len(set(roles_there)), (node, held)
    for s in specs:
        for node in set(result.plan.nodes_of(s.role)):
            on = [c.device for _, c in result.copies_on(s.role, node)]
            count = result.plan.nodes_of(s.role).count(node)
            by_node = {n.name: n for n in nodes}
            if by_node[node].devices:
                assert len(on) == count  # each copy on a node with devices has its device
                assert len(set(on)) == len(on)
            else:
                assert count == 1
