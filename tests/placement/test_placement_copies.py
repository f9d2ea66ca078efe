"""Replicas in the plan: a fleet ``models:`` entry's ``replicas: N`` places up to N copies of a
role on distinct nodes, each counted in its node's memory and held to exclusions and
stickiness there; the copies that fit nowhere have a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rosterd.errors import FleetError
from rosterd.fleet import Fleet, ModelSource, Node, Platform
from rosterd.fleet.reader import parse_fleet
from rosterd.placement import greedy_plan, plan, violations
from rosterd.tokens import GB
from support.specs import spec


def node(name: str, capacity_gb: float, platform: Platform = Platform.LINUX_X86_64) -> Node:
    return Node(
        name=name,
        memory_bytes=int((capacity_gb + 1) * GB),
        reserved_bytes=GB,
        platform=platform,
        flavors=platform.supported_flavors(),
    )


def with_replicas(nodes: tuple[Node, ...], **replicas: int) -> Fleet:
    return Fleet(
        nodes=nodes,
        models={role: ModelSource(Path("/m.gguf"), replicas=n) for role, n in replicas.items()},
    )


def test_the_fleet_file_says_replicas_and_checks_them() -> None:
    fleet = parse_fleet(
        "nodes: [{name: a, memory_gb: 8, platform: linux-x86_64}]\n"
        "models: {chat: {path: /m.gguf, replicas: 3}, other: /o.gguf}\n"
    )
    assert fleet.replicas_of("chat") == 3
    assert fleet.replicas_of("other") == 1
    assert fleet.replicas_of("x", "chat") == 3  # by the roster model name too
    with pytest.raises(FleetError, match=r"models\.chat\.replicas"):
        parse_fleet(
            "nodes: [{name: a, memory_gb: 8, platform: linux-x86_64}]\n"
            "models: {chat: {path: /m.gguf, replicas: 0}}\n"
        )


def test_two_copies_go_on_two_nodes_and_count_there() -> None:
    fleet = with_replicas((node("a", 4), node("b", 4), node("c", 4)), chat=2)
    specs = [spec("chat", 3, interactive=True), spec("other", 3, interactive=True)]
    for result in (plan(specs, fleet), greedy_plan(specs, fleet)):
        held = result.nodes_of("chat")
        assert len(held) == 2
        assert len(set(held)) == 2
        assert result.placements["other"] not in held  # 3 + 3 GiB do not fit one 4 GiB node
        assert not result.unplaced
        assert not result.copies_short
        assert violations(specs, fleet, result) == []
        for name in held:
            assert "chat" in result.nodes[name].always_resident


def test_fewer_copies_than_asked_are_placed_with_the_reason() -> None:
    fleet = with_replicas((node("a", 4), node("b", 2)), chat=3)
    result = plan([spec("chat", 3, interactive=True)], fleet)
    assert result.nodes_of("chat") == ("a",)
    why = dict(result.copies_short)["chat"]
    assert why.startswith("1 of 3 copies placed")
    assert "b: interactive 0.00 GiB + this 3.00 GiB" in why


def test_a_copy_keeps_clear_of_a_role_it_excludes() -> None:
    fleet = with_replicas((node("a", 8), node("b", 8)), chat=2)
    specs = [spec("chat", 1, interactive=True, excludes=["tts"]), spec("tts", 1, interactive=True)]
    result = plan(specs, fleet)
    assert result.placements["tts"] not in result.nodes_of("chat")
    assert "excluded by tts" in dict(result.copies_short)["chat"]


def test_a_sticky_role_keeps_its_copies_nodes() -> None:
    nodes = (node("a", 8), node("b", 8), node("c", 8), node("d", 8))
    fleet = with_replicas(nodes, chat=2)
    first = plan([spec("chat", 1)], fleet)
    again = plan([spec("chat", 1), spec("big", 6)], fleet, first)
    assert again.nodes_of("chat") == first.nodes_of("chat")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.floats(min_value=0.5, max_value=6), min_size=1, max_size=5),
    st.lists(st.integers(min_value=1, max_value=4), min_size=5, max_size=5),
    st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_copies_never_break_a_node(
    sizes: list[float], replicas: list[int], kinds: list[bool]
) -> None:
    fleet = with_replicas(
        (node("a", 6), node("b", 8), node("c", 4)),
        **{f"r{i}": replicas[i] for i in range(len(sizes))},
    )
    specs = [spec(f"r{i}", size, interactive=kinds[i]) for i, size in enumerate(sizes)]
    result = greedy_plan(specs, fleet)
    assert violations(specs, fleet, result) == []
    for i in range(len(sizes)):
        held = result.nodes_of(f"r{i}")
        assert len(held) <= replicas[i]
        if held and len(held) < replicas[i]:
            assert f"r{i}" in dict(result.copies_short)
