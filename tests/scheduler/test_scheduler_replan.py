"""A re-plan on the pure node state machine: roles added, retired and respecified, and a
new capacity, each the node's desired state sent whole as one ``Reconfigure`` event,
driven with an explicit ``now`` (no sleeps).

Recorded on ``Bench`` from ``test_scheduler.py``, which also checks that the processes
alive never break the budget in force when a start is asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from rosterd.errors import (
    RoleMovedError,
    RoleRefusedError,
    RoleUnavailableError,
    UnknownRoleError,
)
from rosterd.fleet_scheduler.values import NodeServing
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.events import (
    ForgetRole,
    LoadDone,
    LogNote,
    MeasuredPeak,
    NodeLost,
    Reconfigure,
    Reconfigured,
    RevokeLeases,
)
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeChange, Phase, Revocation
from rosterd.spec import InferenceSpec
from support.node_bench import LIMITS, MIB, Bench, assert_failed, spec
from support.node_loop import GatedBackends, make_node, use
from support.node_loop import spec as node_spec


def reconfigure(
    bench: Bench,
    *,
    without: str | None = None,
    new: InferenceSpec | None = None,
    restart: bool = False,
    moved_to: str | None = None,
) -> None:
    """Send the node's desired state whole, as one ``Reconfigure``: what the machine places
    now, without ``without`` (retired; ``moved_to`` the node it moved to) and with ``new``
    (added or respecified; ``restart``: named as one to restart), within ``bench.capacity``."""
    specs = bench.machine.placed()
    if without is not None:
        del specs[without]
    if new is not None:
        specs[new.role] = new
    bench.send(
        Reconfigure(
            bench.now,
            specs,
            bench.capacity,
            restart=frozenset({new.role} if new is not None and restart else ()),
            moved={without: moved_to} if without is not None and moved_to is not None else {},
        )
    )


def retire(bench: Bench, role: str) -> None:
    reconfigure(bench, without=role)


def add(bench: Bench, role: str, mib: int, **options: Any) -> None:
    new = spec(role, mib, **options)
    bench.specs[role] = new
    reconfigure(bench, new=new)


def respec(bench: Bench, role: str, mib: int, *, restart: bool = True, **options: Any) -> None:
    new = spec(role, mib, **options)
    reconfigure(bench, new=new, restart=restart)
    bench.specs[role] = new


def capacity(bench: Bench, mib: int) -> None:
    bench.capacity = mib * MIB
    reconfigure(bench)


def forgotten(bench: Bench) -> list[str]:
    return [e.role for e in bench.of(ForgetRole)]


# --------------------------------------------------------------------------- a role added


def test_an_added_role_is_served_once_added_and_not_before() -> None:
    bench = Bench([spec("a", 100)], 1000)
    early = bench.acquire("b")
    assert_failed(bench, early, UnknownRoleError, "not placed on this node")
    add(bench, "b", 200)
    assert bench.phase("b") == "stopped"
    assert bench.starts() == []  # stopped until a request wants it
    bench.use("b")
    assert bench.starts() == ["b"]
    assert bench.machine.role_snapshot("b", bench.now).resident_bytes == 200 * MIB


def test_adding_a_retiring_role_takes_it_back_without_a_stop() -> None:
    bench = Bench([spec("a", 100)], 1000)
    held = bench.acquire("a")
    bench.settle()
    retire(bench, "a")
    refused = bench.acquire("a")
    assert_failed(bench, refused, UnknownRoleError)
    add(bench, "a", 100)
    bench.release(held)
    assert bench.stops() == []
    assert forgotten(bench) == []
    bench.use("a")
    assert bench.starts() == ["a"]


# --------------------------------------------------------------------------- a role retired


def test_an_idle_retired_role_stops_and_is_forgotten() -> None:
    bench = Bench([spec("a", 100), spec("b", 100)], 1000)
    bench.use("a")
    retire(bench, "a")
    assert bench.stops() == ["a"]
    assert forgotten(bench) == []  # memory is free only at StopDone
    bench.stop_done("a")
    assert forgotten(bench) == ["a"]
    assert bench.records("stopped")[-1].label == "replan"
    assert "removed it" in bench.records("stopped")[-1].cause
    assert bench.machine.resident() == ()
    assert "a" not in bench.machine.specs
    later = bench.acquire("a")
    assert_failed(bench, later, UnknownRoleError)


def test_a_stopped_retired_role_is_forgotten_at_once_and_its_waiters_fail() -> None:
    bench = Bench([spec("x", 600), spec("y", 600)], 1000)
    held = bench.acquire("x")
    bench.settle()
    waiting = bench.acquire("y")  # waits for x's room
    retire(bench, "y")
    assert forgotten(bench) == ["y"]
    assert_failed(bench, waiting, UnknownRoleError, "a re-plan removed it")
    bench.release(held)
    assert bench.stops() == []  # nothing was to load for y any more


def test_a_busy_retired_role_serves_what_it_has_then_stops() -> None:
    limits = dataclasses.replace(LIMITS, max_concurrency=1)
    bench = Bench([spec("a", 100)], 1000, limits)
    first = bench.acquire("a")
    bench.settle()
    queued = bench.acquire("a")  # behind the one slot, accepted before the re-plan
    retire(bench, "a")
    newer = bench.acquire("a")
    assert_failed(bench, newer, UnknownRoleError)
    bench.at(4.0)  # inside --drain (5 s): nothing is cut
    assert bench.of(RevokeLeases) == []
    assert bench.stops() == []
    bench.release(first)
    assert bench.lease(queued) is not None  # the queued request is served
    assert bench.stops() == []
    bench.release(queued)
    assert bench.stops() == ["a"]
    bench.stop_done("a")
    assert forgotten(bench) == ["a"]


def test_a_retired_role_still_busy_after_the_drain_time_is_cut() -> None:
    bench = Bench([spec("a", 100)], 1000)
    held = bench.acquire("a")
    bench.settle()
    generation = bench.lease(held).generation  # type: ignore[union-attr]
    retire(bench, "a")
    bench.at(4.9)
    assert bench.of(RevokeLeases) == []
    bench.at(5.0)
    message = (
        "role a was stopped by a re-plan (a reload of the roster, overlay or fleet) "
        "after --drain 5 s"
    )
    assert bench.of(RevokeLeases) == [RevokeLeases("a", generation, Revocation("evicted", message))]
    bench.release(held)
    assert bench.stops() == ["a"]
    bench.stop_done("a")
    assert forgotten(bench) == ["a"]
    assert bench.records("stopped")[-1].label == "replan"


def test_retiring_the_role_a_transition_loads_cancels_that_load() -> None:
    bench = Bench([spec("x", 600, sticky=False), spec("y", 600)], 1000)
    bench.use("x")
    waiting = bench.acquire("y")  # x is evicted for y
    assert bench.stops() == ["x"]
    retire(bench, "y")
    bench.stop_done("x")
    assert bench.starts() == ["x"]  # y is not loaded
    assert forgotten(bench) == ["y"]
    assert_failed(bench, waiting, UnknownRoleError)


# --------------------------------------------------------------------------- a new spec


def test_a_new_spec_without_a_restart_applies_at_once() -> None:
    bench = Bench([spec("a", 100)], 1000)
    bench.use("a")
    respec(bench, "a", 300, restart=False, sticky=False)
    view = bench.machine.role_snapshot("a", bench.now)
    assert view.resident_bytes == 300 * MIB
    assert view.sticky is False
    assert view.phase == "ready"
    assert bench.stops() == []


def test_a_busy_role_with_a_new_launch_restarts_once_idle_and_new_requests_wait() -> None:
    bench = Bench([spec("a", 100)], 1000)
    held = bench.acquire("a")
    bench.settle()
    respec(bench, "a", 200)
    newer = bench.acquire("a")
    assert not bench.answered(newer)  # it waits for the restart
    assert bench.stops() == []
    assert bench.machine.role_snapshot("a", bench.now).resident_bytes == 100 * MIB  # still old
    assert bench.machine.role_snapshot("a", bench.now).restart_pending is True  # `ps` says so
    bench.release(held)
    assert bench.stops() == ["a"]
    bench.stop_done("a")
    assert bench.starts() == ["a", "a"]
    assert bench.machine.role_snapshot("a", bench.now).resident_bytes == 200 * MIB
    assert bench.machine.role_snapshot("a", bench.now).restart_pending is False
    bench.load_done("a")
    assert bench.lease(newer) is not None
    assert bench.records("stopped")[-1].label == "replan"


def test_an_idle_resident_role_with_a_new_launch_is_loaded_again() -> None:
    bench = Bench([spec("a", 100)], 1000)
    bench.use("a")
    respec(bench, "a", 100)
    assert bench.stops() == ["a"]
    bench.settle()
    assert bench.starts() == ["a", "a"]
    assert bench.phase("a") == "ready"
    assert bench.records("loaded")[-1].label == "warm-up"  # a restart evicts nothing


def test_a_restart_that_no_longer_fits_without_evicting_waits_for_a_request() -> None:
    bench = Bench([spec("a", 400), spec("b", 500, sticky=False)], 1000)
    bench.use("a")
    bench.use("b")
    respec(bench, "a", 600)
    bench.settle()
    assert bench.starts() == ["a", "b"]  # a's restart would evict b: not done
    assert bench.phase("a") == "stopped"
    bench.use("a")
    assert bench.starts()[-1] == "a"
    assert bench.violations == []


def test_a_stopped_role_takes_a_new_spec_at_once() -> None:
    bench = Bench([spec("a", 100)], 1000)
    respec(bench, "a", 300)
    assert bench.stops() == []
    assert bench.machine.role_snapshot("a", bench.now).resident_bytes == 300 * MIB


def test_a_role_still_busy_after_the_drain_time_is_cut_for_its_restart() -> None:
    bench = Bench([spec("a", 100)], 1000)
    bench.acquire("a")
    bench.settle()
    respec(bench, "a", 100)
    bench.at(5.0)
    assert [r.role for r in bench.of(RevokeLeases)] == ["a"]


# --------------------------------------------------------------------------- a new capacity


def test_a_smaller_capacity_evicts_idle_roles_in_the_policy_order() -> None:
    bench = Bench([spec("keep", 300), spec("loose", 300, sticky=False), spec("old", 300)], 1000)
    for at, role in enumerate(("old", "loose", "keep")):
        bench.now = float(at)
        bench.use(role)
    capacity(bench, 350)
    assert bench.stops() == ["loose"]  # non-sticky first
    bench.stop_done("loose")
    assert bench.stops() == ["loose", "old"]  # then the least recently used
    bench.stop_done("old")
    assert bench.machine.resident() == ("keep",)
    assert {r.label for r in bench.records("stopped")} == {"replan"}
    assert "capacity is now" in bench.records("stopping")[0].cause
    assert any(isinstance(e, LogNote) and "capacity" in e.message for e in bench.effects)


def test_a_smaller_capacity_prefers_idle_roles_over_busy_ones() -> None:
    bench = Bench([spec("busy", 300, sticky=False), spec("idle", 300)], 1000)
    bench.use("idle")
    bench.acquire("busy")
    bench.settle()
    capacity(bench, 400)
    assert bench.stops() == ["idle"]


def test_a_busy_role_over_a_smaller_capacity_drains_then_is_cut() -> None:
    bench = Bench([spec("a", 600)], 1000)
    held = bench.acquire("a")
    bench.settle()
    capacity(bench, 500)
    newer = bench.acquire("a")
    bench.at(4.9)
    assert not bench.answered(newer)  # newer requests wait: a drains
    assert bench.of(RevokeLeases) == []
    bench.at(5.0)
    assert [r.role for r in bench.of(RevokeLeases)] == ["a"]
    bench.release(held)
    assert bench.stops() == ["a"]
    bench.stop_done("a")
    assert_failed(bench, newer, RoleRefusedError, "can never be resident here")
    assert bench.machine.resident() == ()


def test_a_busy_role_over_a_smaller_capacity_stops_once_released() -> None:
    bench = Bench([spec("a", 300), spec("b", 300)], 1000)
    held = bench.acquire("a")
    bench.settle()
    bench.use("b")
    capacity(bench, 300)
    assert bench.stops() == ["b"]
    bench.stop_done("b")
    assert bench.stops() == ["b"]  # a fits alone now
    bench.release(held)
    assert bench.stops() == ["b"]


def test_a_bigger_capacity_lets_a_waiting_role_load_at_once() -> None:
    bench = Bench([spec("x", 600), spec("y", 600)], 1000)
    bench.acquire("x")
    bench.settle()
    waiting = bench.acquire("y")
    assert bench.starts() == ["x"]
    capacity(bench, 1500)
    assert bench.starts() == ["x", "y"]
    bench.send(LoadDone(bench.now, "y", endpoint=bench.lease(1).endpoint))  # type: ignore[union-attr]
    assert bench.lease(waiting) is not None
    assert bench.violations == []


# ------------------------------------------------------------------- the node loop, the fleet


async def test_node_apply_swaps_roles_and_backends_in_one_step() -> None:
    node, first = make_node([node_spec("old", 100), node_spec("kept", 100)])
    held = await node.acquire("old")
    second = GatedBackends()
    change = node.apply(
        {"kept": node_spec("kept", 100), "new": node_spec("new", 100)},
        capacity_bytes=2000 * MIB,
        backends=second,
    )
    assert change == NodeChange(
        added=("new",), retired=("old",), capacity_bytes=(1000 * MIB, 2000 * MIB)
    )
    with pytest.raises(UnknownRoleError):
        await node.acquire("old")  # at once: no request sees the old set
    assert node.snapshot().roles["old"].retiring is True
    assert await use(node, "new") == "new"
    assert second.starts == ["new"]  # new starts go to the new backends
    node.release(held)  # the request it had finishes; then it stops
    for _ in range(1000):  # yields to the loop (no time passes) until the stop is done
        if "old" not in node.snapshot().roles:
            break
        await asyncio.sleep(0)
    assert first.stops == ["old"]  # stopped by the backends that started it
    await node.shutdown()


async def test_node_apply_restarts_a_role_whose_launch_changed() -> None:
    node, backends = make_node([node_spec("a", 100)])
    await use(node, "a")
    change = node.apply(
        {"a": node_spec("a", 100)}, capacity_bytes=1000 * MIB, backends=backends, restart=["a"]
    )
    assert change.restarted == ("a",)
    assert await use(node, "a") == "a"
    assert backends.starts == ["a", "a"]
    assert backends.stops == ["a"]
    same = node.apply({"a": node_spec("a", 100)}, capacity_bytes=1000 * MIB, backends=backends)
    assert not same.changed
    await node.shutdown()


async def test_apply_plan_adds_and_drains_nodes_and_reports_moves() -> None:
    left, left_backends = make_node([node_spec("a", 100), node_spec("b", 100)])
    scheduler = NodeDirectory({"n1": left})
    scheduler.start()
    held = await scheduler.acquire("a")
    right_backends = GatedBackends()
    change = scheduler.apply_plan(
        {"n2": NodeServing("n2", 1000 * MIB, {"a": node_spec("a", 100)})}, {"n2": right_backends}
    )
    assert change.added_nodes == ("n2",)
    assert change.drained_nodes == ("n1",)
    assert change.moved == {"a": ("n1", "n2")}
    assert scheduler.roles == ("a",)
    with pytest.raises(UnknownRoleError):
        await scheduler.acquire("b")
    assert scheduler.snapshot()["n1"].draining is True
    lease = await scheduler.acquire("a")
    assert lease.node == "n2"
    scheduler.release(lease)
    scheduler.release(held)  # the drained node takes back the lease it gave
    await scheduler.shutdown()
    assert left_backends.stops == ["a"]
    assert right_backends.stops == ["a"]
    assert "n1" not in scheduler.snapshot()
    assert change.as_json()["moved"] == {"a": ["n1", "n2"]}


def test_the_replan_rules_import_no_clock_no_asyncio_and_no_logging() -> None:
    import ast
    from pathlib import Path

    import rosterd.scheduler.replan as replan_module

    assert replan_module.__file__ is not None
    tree = ast.parse(Path(replan_module.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported.isdisjoint({"asyncio", "time", "logging"}), imported


# --------------------------------------------------------------------------- a lost node


def test_a_lost_role_that_moved_is_forgotten_at_once_and_its_waiters_follow_it() -> None:
    bench = Bench([spec("a", 100), spec("b", 100)], 1000)
    bench.use("a")
    bench.send(NodeLost(bench.now, "node n1 is lost"))
    waiting = bench.acquire("a", timeout_s=30.0)
    bench.at(1.0)
    assert not bench.answered(waiting)  # it waits for the re-plan
    reconfigure(bench, without="a", moved_to="n2")
    assert forgotten(bench) == ["a"]  # nothing to stop: the node holds nothing
    assert bench.stops() == []
    assert_failed(bench, waiting, RoleMovedError, "moved to node 'n2'")
    assert bench.phase("b") == Phase.LOST.value  # a role the re-plan left here stays lost
    later = bench.acquire("a")
    assert_failed(bench, later, UnknownRoleError)  # forgotten: the fleet resolves it anew


def test_a_retired_role_that_moved_serves_its_queue_and_sends_the_rest_on() -> None:
    bench = Bench([spec("x", 600), spec("y", 600)], 1000)
    held = bench.acquire("x")
    bench.settle()
    waiting = bench.acquire("y")  # waits for x's room
    reconfigure(bench, without="y", moved_to="n2")
    assert_failed(bench, waiting, RoleMovedError, "moved to node 'n2'")
    retire(bench, "x")  # moved nowhere: a later request is refused as unknown
    refused = bench.acquire("x")
    assert_failed(bench, refused, UnknownRoleError, "not placed on this node")
    bench.release(held)
    assert bench.stops() == ["x"]


async def test_a_request_waiting_on_a_lost_node_is_served_where_its_role_moved() -> None:
    lost_backends = GatedBackends()
    lost = NodeScheduler("n1", 1000 * MIB, {"a": node_spec("a", 100)}, lost_backends)
    elsewhere = GatedBackends()
    kept = NodeScheduler("n2", 1000 * MIB, {"b": node_spec("b", 100)}, elsewhere)
    scheduler = NodeDirectory({"n1": lost, "n2": kept})
    scheduler.start()
    lost.node_lost("node n1 is lost")
    waiting = asyncio.create_task(scheduler.acquire("a", timeout_s=30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    change = scheduler.apply_plan(
        {
            "n1": NodeServing("n1", 1000 * MIB, {}),
            "n2": NodeServing(
                "n2", 1000 * MIB, {"a": node_spec("a", 100), "b": node_spec("b", 100)}
            ),
        },
        {"n1": lost_backends, "n2": elsewhere},
    )
    assert change.moved == {"a": ("n1", "n2")}
    lease = await asyncio.wait_for(waiting, 5.0)
    assert lease.node == "n2"
    assert elsewhere.starts == ["a"]
    scheduler.release(lease)
    await scheduler.shutdown()


# --------------------------------------------------------------------------- new exclusions


def test_a_new_exclusion_stops_the_one_without_precedence_the_smaller_id_stays() -> None:
    bench = Bench([spec("a", 100), spec("b", 100)], 1000)
    bench.use("b")
    bench.now = 1.0
    bench.use("a")
    respec(bench, "b", 100, restart=False, excludes=("a",))  # an overlay reload
    assert bench.stops() == ["b"]  # the residency policy's order: a before b
    assert "a re-plan made it exclude a, which stays resident" in bench.records("stopping")[0].cause
    bench.stop_done("b")
    assert bench.machine.resident() == ("a",)


def test_a_new_exclusion_keeps_the_interactive_role_then_the_sticky_one() -> None:
    voice = Bench([spec("chat", 100), spec("voice", 100, interactive=True)], 1000)
    voice.use("voice")
    voice.now = 1.0
    voice.use("chat")
    respec(voice, "chat", 100, restart=False, excludes=("voice",))
    assert voice.stops() == ["chat"]  # the interactive role stays

    sticky = Bench([spec("a", 100, sticky=False), spec("b", 100)], 1000)
    sticky.use("a")
    sticky.use("b")
    respec(sticky, "b", 100, restart=False, excludes=("a",))
    assert sticky.stops() == ["a"]  # the sticky one stays, though its id is larger


def test_a_new_exclusion_with_a_busy_loser_drains_then_cuts_it() -> None:
    bench = Bench([spec("a", 100), spec("b", 100)], 1000)
    bench.acquire("a")
    bench.settle()
    bench.now = 1.0
    held = bench.acquire("b")
    bench.settle()
    respec(bench, "a", 100, restart=False, excludes=("b",))
    newer = bench.acquire("b")
    bench.at(5.9)
    assert bench.stops() == []
    assert not bench.answered(newer)  # b drains: newer requests wait
    bench.at(6.0)  # drain_s after the conflict began
    assert [r.role for r in bench.of(RevokeLeases)] == ["b"]
    bench.release(held)
    assert bench.stops() == ["b"]


# --------------------------------------------------------------------------- one event, level-based


def test_a_reconfigure_answers_what_it_changed_and_the_same_one_again_changes_nothing() -> None:
    bench = Bench([spec("kept", 100), spec("old", 100), spec("grows", 100)], 1000)
    bench.use("kept")
    desired = {
        "kept": spec("kept", 100),
        "grows": spec("grows", 200),  # memory only: applies at once
        "new": spec("new", 100),
    }
    first = Reconfigure(bench.now, desired, 2000 * MIB, restart=frozenset({"kept"}))
    bench.send(first)
    assert bench.of(Reconfigured)[-1].change == NodeChange(
        added=("new",),
        retired=("old",),
        restarted=("kept",),
        updated=("grows",),
        capacity_bytes=(1000 * MIB, 2000 * MIB),
    )
    assert forgotten(bench) == ["old"]  # stopped: forgotten at once
    bench.settle()
    assert bench.starts() == ["kept", "kept"]  # the restart, loaded again as a warm-up
    effects = bench.send(dataclasses.replace(first, now=1.0, restart=frozenset()))
    assert [e for e in effects if isinstance(e, Reconfigured)] == [Reconfigured(NodeChange())]
    assert bench.stops() == ["kept"]
    assert bench.machine.placed() == desired


def test_an_unavailable_role_is_refused_by_the_machine_and_never_loaded() -> None:
    bench = Bench([spec("a", 100), spec("b", 100)], 1000)
    why = "role a: models: a: /srv/models/a.gguf does not exist"
    placed = bench.machine.placed()
    bench.send(Reconfigure(bench.now, placed, bench.capacity, unavailable={"a": why}))
    refused = bench.acquire("a")
    told = assert_failed(bench, refused, RoleUnavailableError, "role 'a' is unavailable: ")
    assert "/srv/models" not in told  # the short reason: no paths
    assert bench.starts() == []
    view = bench.machine.role_snapshot("a", bench.now)
    assert (view.phase, view.unavailable_reason) == ("unavailable", why)
    assert not bench.machine.serves("a")
    bench.send(Reconfigure(bench.now, bench.machine.placed(), bench.capacity))  # weights back
    bench.use("a")
    assert bench.starts() == ["a"]


def test_a_measured_peak_past_the_count_is_counted_from_then_on_and_evicts_to_fit() -> None:
    figures = {"a": {"counted_bytes": 400 * MIB, "counted_from": "roster"}, "b": {}}
    bench = Bench([spec("a", 400), spec("b", 500, sticky=False)], 1000)
    bench.send(Reconfigure(bench.now, bench.machine.placed(), bench.capacity, memory=figures))
    bench.use("a")
    bench.use("b")
    bench.send(MeasuredPeak(bench.now, "a", 430 * MIB, 430 * MIB))  # within 10 %: shown only
    view = bench.machine.role_snapshot("a", bench.now)
    assert view.resident_bytes == 400 * MIB
    assert view.memory == {**figures["a"], "run_peak_bytes": 430 * MIB}
    assert bench.stops() == []
    bench.send(MeasuredPeak(bench.now, "a", 600 * MIB, 600 * MIB))  # its prompt cache grew
    view = bench.machine.role_snapshot("a", bench.now)
    assert view.resident_bytes == 600 * MIB
    assert view.memory == {"counted_bytes": 600 * MIB, "counted_from": "live"} | {
        "run_peak_bytes": 600 * MIB
    }
    assert bench.stops() == ["b"]  # 1100 MiB no longer fit: evicted as for a re-plan
    warnings = [n.message for n in bench.of(LogNote) if n.level == "warning"]
    assert warnings == [
        "role a holds 600 MiB, 50% more than the 400 MiB counted for it; "
        "counting what it holds from now on"
    ]
    bench.send(MeasuredPeak(bench.now, "a", 700 * MIB, 700 * MIB))
    assert len([n for n in bench.of(LogNote) if n.level == "warning"]) == 1  # said once
