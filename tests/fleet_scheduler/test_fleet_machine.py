"""The fleet machine's decisions, driven synchronously (no process, no Ray, no sleep).

Each test posts what happens to a fleet (its start, reloads, a node lost, a node back)
to a :class:`~rosterd.fleet_scheduler.machine.FleetMachine` through the
:class:`support.fleet_bench.FleetBench`, which plays the effects' part, and checks what the
machine asked for and what it keeps. The last test runs random sequences of reloads,
losses and returns and checks the budget, the exclusions and stickiness after every
step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.fleet.model import ModelSource
from rosterd.fleet_scheduler.effects import (
    ApplyPlan,
    DropAgents,
    Level,
    MarkLost,
    Record,
    Routes,
    Say,
    ShowPlan,
    Solve,
    StartAgents,
    Teach,
    Warm,
)
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import NodeRun
from rosterd.fleet_scheduler.views import fleet_status, node_views
from rosterd.placement import score, violations
from rosterd.spec import InferenceSpec
from support.fleet_bench import FleetBench, cluster, config, local, node, on_ray
from support.specs import spec

RAY = "10.0.0.1:6379"


def said(bench: FleetBench, level: Level | None = None) -> list[str]:
    return [
        e.text for e in bench.effects if isinstance(e, Say) and (level is None or e.level is level)
    ]


def test_the_start_shows_the_plan_teaches_applies_routes_warms_and_answers() -> None:
    cfg = config([spec("chat", 1, interactive=True), spec("code", 2)], [node("box", 8)])
    bench = FleetBench(FleetMachine())
    answer = bench.reload(cfg, local(cfg), start=True)
    assert answer.error is None
    kinds = [type(e) for e in bench.effects if not isinstance(e, Say)]
    assert kinds[:5] == [Solve, ShowPlan, Teach, ApplyPlan, Routes]
    [warm] = bench.of(Warm)
    assert warm.roles == ("chat", "code")  # interactive first, then sticky batch
    assert bench.placed == {"chat": "box", "code": "box"}
    assert answer.change is not None
    assert answer.change["warnings"] == []


def test_without_ray_a_node_of_another_machine_is_planned_not_served() -> None:
    cfg = config([spec("a", 6), spec("b", 6)], [node("here", 7), node("there", 7)])
    bench = FleetBench(FleetMachine())
    bench.reload(cfg, local(cfg, remote=["there"]), start=True)
    assert bench.machine.plan is not None
    assert set(bench.machine.plan.placements.values()) == {"here", "there"}
    assert set(bench.machine.serving) == {"here"}  # only this machine's nodes get a scheduler
    [routes] = bench.of(Routes)
    [(_role, why)] = [(r, w) for r, w in routes.unserved.items() if r in ("a", "b")]
    assert why == "planned on node there, which this process does not run"
    assert any("is not this machine" in t for t in said(bench, Level.NOTICE))


def test_a_start_with_no_node_of_this_machine_is_refused() -> None:
    cfg = config([spec("a", 1)], [node("there", 7)])
    bench = FleetBench(FleetMachine())
    answer = bench.reload(cfg, local(cfg, remote=["there"]), start=True)
    assert answer.error == "no node of the fleet is this machine; nothing to serve"
    assert bench.machine.config is None
    assert not bench.of(ApplyPlan)


def test_a_reload_that_serves_nothing_is_refused_unless_forced() -> None:
    # A one-word typo in the roster's top-level key imports nothing, with a warning.
    cfg = config([spec("chat", 1)], [node("box", 8)])
    bench = FleetBench(FleetMachine())
    bench.reload(cfg, local(cfg), start=True)
    typo = config([], [node("box", 8)], warnings=["no `roster:` key (did you mean `roster`?)"])
    refused = bench.reload(typo, local(typo))
    assert refused.error is not None
    assert "serves no role" in refused.error
    assert "did you mean `roster`?" in refused.error  # the import's warning, said
    assert "--force" in refused.error
    assert bench.placed == {"chat": "box"}  # nothing changed
    forced = bench.reload(typo, local(typo), force=True)
    assert forced.error is None
    assert bench.placed == {}


def test_a_reload_whose_plan_places_nothing_says_why_each_role_is_out() -> None:
    # The roster is whole but the node shrank below every role: the refusal names them.
    cfg = config([spec("chat", 1), spec("code", 2)], [node("box", 8)])
    bench = FleetBench(FleetMachine())
    bench.reload(cfg, local(cfg), start=True)
    small = config([spec("chat", 1), spec("code", 2)], [node("box", 0.5)])
    refused = bench.reload(small, local(small))
    assert refused.error is not None
    assert "serves no role" in refused.error
    assert "chat is unplaced: " in refused.error
    assert "code is unplaced: " in refused.error
    assert bench.placed == {"chat": "box", "code": "box"}  # nothing changed


def test_a_reload_warms_what_it_adds_and_what_it_makes_servable_again() -> None:
    voice = spec("voice", 0.5, interactive=True)
    missing = config(
        [voice, spec("chat", 1)], [node("box", 8)], unavailable={"voice": "no weights"}
    )
    bench = FleetBench(FleetMachine())
    bench.reload(missing, local(missing), start=True)
    assert bench.of(Warm)[-1].roles == ("chat",)
    fixed = config([voice, spec("chat", 1), spec("new", 1)], [node("box", 8)])
    assert bench.reload(fixed, local(fixed)).error is None
    assert bench.of(Warm)[-1].roles == ("voice", "new")


def test_a_reload_that_loses_a_served_roles_weights_is_refused() -> None:
    cfg = config([spec("chat", 1)], [node("box", 8)])
    bench = FleetBench(FleetMachine())
    bench.reload(cfg, local(cfg), start=True)
    broken = config([spec("chat", 1)], [node("box", 8)], unavailable={"chat": "file gone"})
    answer = bench.reload(broken, local(broken))
    assert answer.error == "role chat: file gone; the running configuration stays"
    assert bench.machine.serving["box"].unavailable == {}


def test_a_launch_change_restarts_the_role() -> None:
    cfg = config([spec("chat", 1)], [node("box", 8)], launch={"chat": "a.gguf"})
    bench = FleetBench(FleetMachine())
    bench.reload(cfg, local(cfg), start=True)
    again = config([spec("chat", 1)], [node("box", 8)], launch={"chat": "b.gguf"})
    bench.reload(again, local(again))
    assert bench.of(ApplyPlan)[-1].restart == ("chat",)


def test_on_ray_each_node_gets_an_agent_and_a_node_not_connected_gives_its_roles_away() -> None:
    nodes = [node("a", 4), node("b", 4), node("c", 4)]
    cfg = config([spec("x", 3), spec("y", 3), spec("z", 3)], nodes)
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg, absent=["c"]), start=True)
    [start] = bench.of(StartAgents)
    assert set(start.nodes) == {"a", "b"}
    assert bench.machine.full is not None
    assert bench.machine.plan is not None
    gone = [r for r, n in bench.machine.full.placements.items() if n == "c"]
    assert gone  # the whole fleet's plan used c
    for role in gone:
        assert "node c is not connected" in bench.machine.moved[role]
    views = node_views(bench.machine)
    assert views["c"].connected is False
    assert set(views["c"].planned or ()) == set(gone)
    assert fleet_status(bench.machine)["ray_address"] == RAY


def test_a_lost_nodes_roles_move_where_they_fit_and_sticky_roles_elsewhere_stay() -> None:
    nodes = [node("a", 4), node("b", 8)]
    cfg = config([spec("x", 3), spec("y", 3, interactive=True), spec("z", 1)], nodes)
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    assert bench.machine.plan is not None
    before = dict(bench.machine.plan.placements)
    on_a = sorted(r for r, n in before.items() if n == "a")
    bench.run(cluster(cfg, alive=["b"]))  # a's Ray node died
    assert bench.machine.nodes["a"].run is NodeRun.LOST
    assert [e.node for e in bench.of(MarkLost)] == ["a"]
    after = bench.machine.plan.placements
    for role, was in before.items():
        if was == "b":
            assert after[role] == "b"  # sticky roles on the node left stay put
    records = {(e.role, e.kind) for e in bench.of(Record)}
    for role in on_a:
        kind = "moved" if after[role] == "b" else "unplaced"
        assert (role, kind) in records
    assert not violations(
        [s.spec for s in cfg.roster.specs],
        dataclasses.replace(cfg.fleet, nodes=(nodes[1],)),
        dataclasses.replace(
            bench.machine.plan, placements={r: n for r, n in after.items() if n == "b"}
        ),
    )
    assert bench.run(cluster(cfg, alive=["b"])) == []  # said once: a lost node stays lost


def test_a_lost_node_back_gets_a_fresh_agent_and_scheduler() -> None:
    nodes = [node("a", 4), node("b", 4)]
    cfg = config([spec("x", 3), spec("y", 3)], nodes)
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    bench.lose("a")
    starts = len(bench.of(StartAgents))
    effects = bench.run(cluster(cfg, alive=["a", "b"]))
    assert "node a is back on the Ray cluster" in said(bench, Level.OK)
    [start] = [e for e in effects if isinstance(e, StartAgents)]
    assert set(start.nodes) == {"a"}
    [apply] = [e for e in effects if isinstance(e, ApplyPlan)]
    assert apply.replace == ("a",)
    assert bench.machine.nodes["a"].run is NodeRun.AGENT
    assert bench.run(cluster(cfg, alive=["a", "b"])) == []  # back once
    assert len(bench.of(StartAgents)) == starts + 1


def test_an_agent_that_cannot_start_refuses_the_reload_and_ends_the_others() -> None:
    nodes = [node("a", 4)]
    cfg = config([spec("x", 3)], nodes)
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    more = config([spec("x", 3), spec("y", 3), spec("w", 3)], [*nodes, node("b", 4), node("c", 4)])
    bench.failing_agents = {"c"}
    answer = bench.reload(more, on_ray(more))
    assert answer.error == "node c could not start its agent: the agent died"
    [drop] = bench.of(DropAgents)
    assert drop.nodes == ("b",)
    assert set(bench.machine.serving) == {"a"}  # nothing changed
    assert bench.machine.agents == {"a"}


def test_a_node_on_ray_given_a_new_address_is_refused() -> None:
    cfg = config([spec("x", 1)], [node("a", 4, "10.0.0.5")])
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    moved = config([spec("x", 1)], [node("a", 4, "10.0.0.6")])
    answer = bench.reload(moved, on_ray(moved))
    assert answer.error is not None
    assert "new address 10.0.0.6" in answer.error


# ---- random sequences ----------------------------------------------------------------

NAMES = ("n1", "n2", "n3")


@st.composite
def rosters(draw: st.DrawFn) -> list[InferenceSpec]:
    roles = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=7, unique=True))
    out = []
    for role in roles:
        others = [r for r in roles if r != role]
        out.append(
            spec(
                role,
                draw(st.sampled_from([0.5, 1, 2, 3, 5])),
                interactive=draw(st.booleans()),
                sticky=draw(st.booleans()),
                excludes=draw(st.lists(st.sampled_from(others), max_size=1)) if others else (),
            )
        )
    return out


steps = st.lists(
    st.one_of(
        st.tuples(st.just("reload"), rosters()),
        st.tuples(st.just("same"), st.just(None)),
        st.tuples(st.just("lose"), st.sampled_from(NAMES)),
        st.tuples(st.just("back"), st.sampled_from(NAMES)),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(first=rosters(), sequence=steps)
def test_random_reloads_losses_and_returns_keep_budget_exclusions_and_stickiness(
    first: list[InferenceSpec], sequence: list[tuple[str, object]]
) -> None:
    nodes = [node("n1", 6), node("n2", 4), node("n3", 3)]
    cfg = config(first, nodes)
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    alive = set(NAMES)
    for kind, arg in sequence:
        machine = bench.machine
        assert machine.plan is not None
        assert machine.config is not None
        before = dict(machine.plan.placements)
        if kind == "reload":
            cfg = config(arg, nodes)  # type: ignore[arg-type]
            bench.reload(cfg, on_ray(cfg, absent=set(NAMES) - alive))
        elif kind == "same":
            bench.reload(cfg, on_ray(cfg, absent=set(NAMES) - alive))
        elif kind == "lose" and arg in alive and len(alive) > 1:
            alive.discard(str(arg))
            bench.run(cluster(cfg, alive))
        elif kind == "back":
            alive.add(str(arg))
            bench.run(cluster(cfg, alive))
        _check(bench, before, kind, arg)


def _check(bench: FleetBench, before: dict[str, str], kind: str, arg: object) -> None:
    machine = bench.machine
    assert machine.plan is not None
    assert machine.config is not None
    running = {n for n, s in machine.nodes.items() if s.run.running}
    fleet = machine.config.fleet
    placed = {r: n for r, n in machine.plan.placements.items() if n in running}
    specs = [s.spec for s in machine.config.roster.specs]
    # The budget and the exclusions, on the nodes that run.
    running_fleet = dataclasses.replace(
        fleet, nodes=tuple(n for n in fleet.nodes if n.name in running)
    )
    assert not violations(
        specs, running_fleet, dataclasses.replace(machine.plan, placements=placed)
    )
    # Nothing is served on a node that does not run, and the schedulers serve the plan.
    for name, serving in machine.serving.items():
        if name in running:
            assert set(serving.specs) == {r for r, n in placed.items() if n == name}
        else:
            assert machine.nodes[name].run is NodeRun.LOST
    assert bench.placed == {r: n for n, s in machine.serving.items() for r in s.specs}
    # Stickiness: a loss moves a sticky role off a node that still runs only when that
    # places more roles than keeping every role where it was (the planner's order:
    # interactive roles placed, then roles placed, then sticky roles kept).
    if kind == "lose":
        by_role = {s.role: s for s in specs}
        moved = [
            r
            for r, was in before.items()
            if was in running and by_role[r].sticky and machine.plan.placements.get(r) != was
        ]
        if moved:
            kept = {r: n for r, n in before.items() if n in running}
            stay = dataclasses.replace(machine.plan, placements=kept)
            new = score(specs, running_fleet, dataclasses.replace(machine.plan, placements=placed))
            old = score(specs, running_fleet, stay)
            assert new.key()[:2] > old.key()[:2], (moved, before, placed)


def test_docs_fleet_md_names_every_event_and_effect() -> None:
    import typing
    from pathlib import Path

    from rosterd.fleet_scheduler import effects, events

    text = (Path(__file__).resolve().parents[2] / "docs" / "fleet.md").read_text()
    names = [t.__name__ for t in typing.get_args(events.FleetEvent)]
    names += [t.__name__ for t in typing.get_args(effects.FleetEffect)]
    missing = [n for n in names if f"`{n}`" not in text]
    assert missing == [], f"docs/fleet.md does not name {missing}"


def test_a_role_with_replicas_is_served_by_a_copy_on_each_of_two_nodes_and_survives_a_loss() -> (
    None
):
    nodes = [node("a", 2), node("b", 2), node("c", 2)]
    cfg = config([spec("chat", 1, interactive=True)], nodes)
    models = {"chat": ModelSource(Path("/w/chat.gguf"), replicas=2)}
    cfg = dataclasses.replace(cfg, fleet=dataclasses.replace(cfg.fleet, models=models))
    bench = FleetBench(FleetMachine(ray_address=RAY))
    bench.reload(cfg, on_ray(cfg), start=True)
    plan = bench.machine.plan
    assert plan is not None
    held = plan.nodes_of("chat")
    assert len(set(held)) == 2
    [applied] = bench.of(ApplyPlan)
    assert sorted(n for n, s in applied.nodes.items() if "chat" in s.specs) == sorted(held)
    assert fleet_status(bench.machine)["replicas"] == {"chat": list(held)}

    first, other = held
    bench.run(cluster(cfg, alive=[n.name for n in nodes if n.name != first]))
    plan = bench.machine.plan
    assert plan is not None
    assert plan.placements["chat"] == other  # the copy left serves on: nothing moves
    (third,) = {"a", "b", "c"} - {first, other}
    assert plan.nodes_of("chat") == (other, third)  # a new copy where there is room
    serving = bench.machine.serving
    assert "chat" in serving[other].specs
    assert "chat" in serving[third].specs
    assert first not in serving or "chat" not in serving[first].specs
