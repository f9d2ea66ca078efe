"""The scheduler's promises, with the real residency policy and a recording fake backend.

The fake stands in for the supervisor only (process start/stop take a set time
and are recorded); everything else is the real scheduler. The same promises
are checked against real llama-server processes in ``test_up_budget.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Iterable
from typing import Any

import pytest

import spec_helpers
from rosterd.metrics import RosterdMetrics
from rosterd.scheduler import (
    Endpoint,
    LoadFailedError,
    NodeScheduler,
    QueueFullError,
    QueueTimeoutError,
    Revocation,
    RoleRefusedError,
    RoleUnavailableError,
    Scheduler,
    SchedulerLimits,
    ShuttingDownError,
    client_reason,
)
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, PortInUseError

MIB = 2**20


def spec(role: str, mib: int, **options: Any) -> InferenceSpec:
    """A llama.cpp spec of ``mib`` MiB whose model is named like the role."""
    return spec_helpers.spec(role, mib, unit=MIB, model=role, **options)


class FakeBackends:
    """Records starts/stops; checks that the processes alive never break the budget."""

    def __init__(
        self,
        specs: dict[str, InferenceSpec],
        capacity: int,
        *,
        load_s: float = 0.05,
        fail: Iterable[str] = (),
    ) -> None:
        self.specs = specs
        self.capacity = capacity
        self.load_s = load_s
        self.fail = set(fail)
        self.alive: set[str] = set()
        self.starts: list[str] = []
        self.stops: list[str] = []
        self.busy = 0
        self.max_busy = 0
        self.violations: list[str] = []

    def _check(self) -> None:
        used = sum(self.specs[r].memory.resident_bytes for r in self.alive)
        if used > self.capacity:
            self.violations.append(f"over budget: {sorted(self.alive)}")
        for r in self.alive:
            for other in self.specs[r].excluded_roles():
                if other in self.alive:
                    self.violations.append(f"excluded together: {r}, {other}")

    async def start(self, role: str) -> Endpoint:
        self.busy += 1
        self.max_busy = max(self.max_busy, self.busy)
        try:
            self.starts.append(role)
            self.alive.add(role)  # memory is held from the first byte loaded
            self._check()
            await asyncio.sleep(self.load_s)
            if role in self.fail:
                raise RuntimeError(f"{role} crashed while loading")
            return Endpoint(f"http://127.0.0.1:1/{role}", role, None)
        finally:
            self.busy -= 1

    async def stop(self, role: str) -> None:
        self.busy += 1
        self.max_busy = max(self.max_busy, self.busy)
        try:
            await asyncio.sleep(self.load_s / 5)
            self.stops.append(role)
            self.alive.discard(role)  # free only once the process exited
        finally:
            self.busy -= 1


FAST = SchedulerLimits(
    max_concurrency=4,
    max_queue=16,
    queue_timeout_s=10.0,
    drain_s=5.0,
    idle_ttl_s=float("inf"),
    min_residency_s=0.0,
    tick_s=0.02,
)


def make_node(
    specs: list[InferenceSpec],
    capacity_mib: int,
    limits: SchedulerLimits = FAST,
    **fake: object,
) -> tuple[NodeScheduler, FakeBackends]:
    by_role = {s.role: s for s in specs}
    backends = FakeBackends(by_role, capacity_mib * MIB, **fake)  # type: ignore[arg-type]
    node = NodeScheduler("n1", capacity_mib * MIB, by_role, backends, limits=limits)
    node.start()
    return node, backends


async def use(node: NodeScheduler, role: str, hold_s: float = 0.01) -> str:
    lease = await node.acquire(role)
    try:
        await asyncio.sleep(hold_s)
        return lease.endpoint.served_model
    finally:
        node.release(lease)


async def test_concurrent_waiters_share_one_load() -> None:
    node, backends = make_node([spec("a", 100)], 1000)
    results = await asyncio.gather(*(use(node, "a") for _ in range(8)))
    assert results == ["a"] * 8
    assert backends.starts == ["a"]
    await node.shutdown()


async def test_waiter_giving_up_does_not_cancel_the_load_for_others() -> None:
    node, backends = make_node([spec("a", 100)], 1000, load_s=0.3)
    quitter = asyncio.create_task(node.acquire("a"))
    stayer = asyncio.create_task(use(node, "a"))
    await asyncio.sleep(0.1)  # the load is under way
    quitter.cancel()
    assert await stayer == "a"
    assert backends.starts == ["a"]
    assert node.snapshot()["resident"] == ["a"]
    await node.shutdown()


async def test_budget_for_one_of_two_serializes_swaps_and_completes_everything() -> None:
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000)
    jobs = [use(node, role, hold_s=0.02) for role in ["x", "y"] * 6]
    results = await asyncio.gather(*jobs)
    assert sorted(results) == ["x"] * 6 + ["y"] * 6
    assert backends.violations == []
    assert backends.max_busy == 1  # one start or stop at a time on the node
    for event in node.events:
        assert event.resident_bytes <= 1000 * MIB
        assert set(event.resident) != {"x", "y"}
    await node.shutdown()


async def test_role_in_use_is_not_evicted_until_released() -> None:
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600)], 1000)
    lease = await node.acquire("x")
    y = asyncio.create_task(use(node, "y"))
    await asyncio.sleep(0.3)
    assert not y.done()
    assert backends.stops == []
    node.release(lease)
    assert await y == "y"
    assert backends.stops == ["x"]
    await node.shutdown()


async def test_busy_role_is_evicted_after_the_drain_time() -> None:
    limits = dataclasses.replace(FAST, drain_s=0.3)
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    stuck = await node.acquire("x")  # never released in time
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await use(node, "y") == "y"
    assert 0.25 <= loop.time() - t0 < 3.0
    assert backends.stops == ["x"]
    node.release(stuck)  # a release of the stopped generation is ignored
    await asyncio.sleep(0.05)
    assert node.snapshot()["roles"]["x"]["in_flight"] == 0  # type: ignore[index]
    await node.shutdown()


async def test_idle_non_sticky_batch_role_unloads_after_ttl_but_sticky_stays() -> None:
    limits = SchedulerLimits(idle_ttl_s=0.2, min_residency_s=0.0, tick_s=0.02)
    node, backends = make_node([spec("temp", 100, sticky=False), spec("keep", 100)], 1000, limits)
    await use(node, "temp")
    await use(node, "keep")
    await asyncio.sleep(0.6)
    assert backends.stops == ["temp"]
    assert node.snapshot()["resident"] == ["keep"]
    assert any(e.kind == "stopped" and e.cause.startswith("idle") for e in node.events)
    await node.shutdown()


async def test_just_loaded_role_is_protected_from_batch_ping_pong() -> None:
    limits = SchedulerLimits(min_residency_s=0.5, idle_ttl_s=float("inf"), tick_s=0.02)
    node, _ = make_node([spec("x", 600, sticky=False), spec("y", 600, sticky=False)], 1000, limits)
    await use(node, "x")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await use(node, "y")
    assert loop.time() - t0 >= 0.4  # waited for x's minimum residency
    await node.shutdown()


async def test_interactive_role_may_evict_a_just_loaded_batch_role() -> None:
    limits = SchedulerLimits(min_residency_s=30.0, idle_ttl_s=float("inf"), tick_s=0.02)
    node, _ = make_node([spec("x", 600), spec("voice", 600, interactive=True)], 1000, limits)
    await use(node, "x")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await use(node, "voice")
    assert loop.time() - t0 < 5.0
    await node.shutdown()


async def test_full_queue_is_refused_at_once_and_waits_time_out() -> None:
    limits = SchedulerLimits(max_concurrency=1, max_queue=2, queue_timeout_s=0.3, tick_s=0.02)
    node, _ = make_node([spec("a", 100)], 1000, limits)
    held = await node.acquire("a")
    waiting = [asyncio.create_task(node.acquire("a")) for _ in range(2)]
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFullError) as full:
        await node.acquire("a")
    assert full.value.retry_after_s is not None
    for task in waiting:
        with pytest.raises(QueueTimeoutError):
            await task
    node.release(held)
    await node.shutdown()


async def test_concurrency_limit_hands_slots_over_in_order() -> None:
    limits = SchedulerLimits(max_concurrency=1, tick_s=0.02)
    node, _ = make_node([spec("a", 100)], 1000, limits)
    first = await node.acquire("a")
    second = asyncio.create_task(node.acquire("a"))
    await asyncio.sleep(0.1)
    assert not second.done()
    node.release(first)
    lease = await second
    node.release(lease)
    await node.shutdown()


async def test_excluded_roles_swap_when_the_winner_is_idle() -> None:
    specs = [
        spec("scratch-a", 100, sticky=False, excludes=["scratch-b"]),
        spec("scratch-b", 100, sticky=False, excludes=["scratch-a"]),
    ]
    node, backends = make_node(specs, 1000)
    for role in ["scratch-a", "scratch-b", "scratch-a", "scratch-b"]:
        assert await use(node, role) == role
    assert backends.violations == []
    assert backends.starts == ["scratch-a", "scratch-b", "scratch-a", "scratch-b"]
    await node.shutdown()


async def test_batch_role_excluded_by_resident_interactive_role_is_refused() -> None:
    specs = [spec("voice", 100, interactive=True, excludes=["b"]), spec("b", 100)]
    node, _ = make_node(specs, 1000)
    await use(node, "voice")
    with pytest.raises(RoleRefusedError, match="voice"):
        await node.acquire("b")
    await node.shutdown()


async def test_role_bigger_than_the_node_is_refused_with_numbers() -> None:
    node, _ = make_node([spec("huge", 2000)], 1000)
    with pytest.raises(RoleRefusedError, match="GiB"):
        await node.acquire("huge")
    await node.shutdown()


async def test_failed_load_fails_every_waiter_and_frees_the_role() -> None:
    node, backends = make_node([spec("bad", 100)], 1000, fail=["bad"])
    results = await asyncio.gather(*(node.acquire("bad") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, LoadFailedError) and "crashed" in str(r) for r in results)
    assert backends.starts == ["bad"]
    assert node.snapshot()["resident"] == []
    await node.shutdown()


async def test_warm_up_load_never_evicts() -> None:
    node, _ = make_node([spec("x", 600), spec("y", 600)], 1000)
    sched = Scheduler({"n1": node})
    await sched.load("x", no_evict=True)
    with pytest.raises(RoleRefusedError, match="evict"):
        await sched.load("y", no_evict=True)
    assert node.snapshot()["resident"] == ["x"]
    await sched.shutdown()


async def test_shutdown_refuses_new_requests_and_stops_every_backend() -> None:
    node, backends = make_node([spec("a", 100), spec("b", 100)], 1000)
    await use(node, "a")
    await use(node, "b")
    await node.shutdown()
    assert sorted(backends.stops) == ["a", "b"]
    assert backends.alive == set()
    with pytest.raises(ShuttingDownError):
        await node.acquire("a", timeout_s=1.0)


async def test_busy_exclusion_winner_yields_after_the_drain_time() -> None:
    limits = SchedulerLimits(drain_s=0.3, min_residency_s=0.0, tick_s=0.02)
    specs = [
        spec("scratch-a", 100, sticky=False, excludes=["scratch-b"]),
        spec("scratch-b", 100, sticky=False),
    ]
    node, backends = make_node(specs, 1000, limits)
    held = await node.acquire("scratch-a")  # the winner stays busy
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await use(node, "scratch-b") == "scratch-b"
    assert 0.25 <= loop.time() - t0 < 3.0
    assert backends.violations == []
    node.release(held)
    await node.shutdown()


async def test_busy_role_drains_for_an_older_request_instead_of_starving_it() -> None:
    limits = SchedulerLimits(max_concurrency=1, drain_s=10.0, min_residency_s=0.0, tick_s=0.02)
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + 4.0
    served_y = asyncio.Event()

    async def keep_x_busy() -> int:
        done = 0
        while not served_y.is_set() and loop.time() < stop_at:
            await use(node, "x", hold_s=0.05)
            done += 1
        return done

    workers = [asyncio.create_task(keep_x_busy()) for _ in range(3)]
    await asyncio.sleep(0.3)  # x is loaded and never idle from here on
    t0 = loop.time()
    assert await use(node, "y") == "y"
    served_y.set()
    waited = loop.time() - t0
    assert sum(await asyncio.gather(*workers)) > 3  # x was served, and no request failed
    assert waited < 2.0, f"y waited {waited:.1f} s behind newer x requests"
    assert backends.violations == []
    await node.shutdown()


class SlowToStart:
    """A backend whose start takes a minute unless stop() interrupts it (as the supervisor)."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()
        self.started = asyncio.Event()

    async def start(self, role: str) -> Endpoint:
        self.started.set()
        try:
            async with asyncio.timeout(60):
                await self.stopped.wait()
        except TimeoutError:
            return Endpoint("http://127.0.0.1:1", role)
        raise RuntimeError(f"{role} was stopped before it was ready")

    async def stop(self, role: str) -> None:
        self.stopped.set()


async def test_shutdown_aborts_a_load_under_way_instead_of_waiting_for_it() -> None:
    backends = SlowToStart()
    node = NodeScheduler("n1", 1000 * MIB, {"big": spec("big", 100)}, backends, limits=FAST)
    node.start()
    waiter = asyncio.create_task(node.acquire("big"))
    await backends.started.wait()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await node.shutdown()
    assert loop.time() - t0 < 5.0
    assert node.snapshot()["resident"] == []
    with pytest.raises((ShuttingDownError, LoadFailedError)):
        await waiter


async def test_a_crashed_role_waits_for_its_restart_then_serves_with_the_new_pid() -> None:
    node, backends = make_node([spec("a", 100)], 1000)
    assert await use(node, "a") == "a"
    node.backend_event(BackendEvent("a", "exited", pid=111, exit_code=-9))
    node.backend_event(BackendEvent("a", "restarting", pid=111, delay_s=0.5))
    waiting = asyncio.create_task(node.acquire("a"))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # no 502 at once: it waits as for a load
    info = node.snapshot()["roles"]["a"]  # type: ignore[index]
    assert info["phase"] == "restarting"
    assert info["pid"] is None
    assert node.snapshot()["resident"] == ["a"]  # the restart holds its memory
    node.backend_event(BackendEvent("a", "restart_failed", detail="not yet"))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # the supervisor tries again
    node.backend_event(BackendEvent("a", "ready", pid=222))
    lease = await asyncio.wait_for(waiting, 2)
    assert lease.endpoint.pid == 222
    assert lease.endpoint.base_url == "http://127.0.0.1:1/a"
    node.release(lease)
    info = node.snapshot()["roles"]["a"]  # type: ignore[index]
    assert (info["phase"], info["pid"]) == ("ready", 222)
    assert backends.starts == ["a"]  # the supervisor restarted it, not a new load
    assert [e.kind for e in node.events][-2:] == ["crashed", "restarted"]
    await node.shutdown()


async def test_a_restart_given_up_fails_the_waiters_and_frees_the_role() -> None:
    node, backends = make_node([spec("a", 100)], 1000)
    assert await use(node, "a") == "a"
    node.backend_event(BackendEvent("a", "exited", pid=111, exit_code=1))
    waiting = asyncio.create_task(node.acquire("a"))
    await asyncio.sleep(0.1)
    node.backend_event(
        BackendEvent(
            "a",
            "restart_failed",
            detail="gave up: backend a exited with code 1\nlast lines of /var/x.log",
            final=True,
        )
    )
    with pytest.raises(LoadFailedError, match="could not be restarted") as info:
        await asyncio.wait_for(waiting, 2)
    assert "/var/x.log" not in str(info.value)
    assert "rosterd ps" in str(info.value)
    assert node.snapshot()["resident"] == []
    assert node.snapshot()["roles"]["a"]["phase"] == "stopped"  # type: ignore[index]
    # A later request loads it again, as any role that is not resident.
    assert await use(node, "a") == "a"
    assert backends.starts == ["a", "a"]
    await node.shutdown()


async def test_an_unavailable_role_fails_at_once_without_a_load() -> None:
    by_role = {"a": spec("a", 100), "b": spec("b", 100)}
    backends = FakeBackends(by_role, 1000 * MIB)
    why = "role a: models: a: /srv/models/a.gguf does not exist"
    node = NodeScheduler("n1", 1000 * MIB, by_role, backends, limits=FAST, unavailable={"a": why})
    node.start()
    with pytest.raises(RoleUnavailableError, match=r"role 'a' is unavailable: .*a\.gguf") as info:
        await node.acquire("a")
    assert "/srv/models" not in str(info.value)
    with pytest.raises(RoleUnavailableError):
        await node.acquire("a", take_slot=False)  # rosterd load, warm-up
    assert await use(node, "b") == "b"
    assert backends.starts == ["b"]  # never tried to load a
    roles = node.snapshot()["roles"]
    assert roles["a"]["phase"] == "unavailable"  # type: ignore[index]
    assert roles["a"]["unavailable_reason"] == why  # type: ignore[index]
    assert roles["b"]["unavailable_reason"] is None  # type: ignore[index]
    await node.shutdown()


class TailError(Exception):
    pass


async def test_a_failed_load_tells_the_client_the_reason_without_paths_or_log_tail() -> None:
    class Failing(FakeBackends):
        async def start(self, role: str) -> Endpoint:
            raise TailError(
                "backend a exited with code 1 before it was ready\n"
                "last lines of /home/op/.local/state/rosterd/logs/a.log:\n"
                "  | /opt/llama/bin/llama-server -m /srv/models/a.gguf --port 9"
            )

    by_role = {"a": spec("a", 100)}
    node = NodeScheduler("n1", 1000 * MIB, by_role, Failing(by_role, 1000 * MIB), limits=FAST)
    node.start()
    with pytest.raises(LoadFailedError) as info:
        await node.acquire("a")
    message = str(info.value)
    assert message == (
        "backend for role 'a' failed to load: backend a exited with code 1 before it was "
        "ready; see `rosterd ps` / the backend log"
    )
    assert node.events[-1].kind == "load_failed"
    assert "/srv/models/a.gguf" in node.events[-1].cause  # the full error stays in the log
    await node.shutdown()


async def test_a_port_in_use_tells_the_client_neither_the_pid_nor_the_command_line() -> None:
    class PortTaken(FakeBackends):
        async def start(self, role: str) -> Endpoint:
            holder = "pid 13484 (llama-server: llama-server -m tiny-voice.gguf --host 127.0.0.1)"
            raise PortInUseError("127.0.0.1", 8310, holder)

    by_role = {"a": spec("a", 100)}
    node = NodeScheduler("n1", 1000 * MIB, by_role, PortTaken(by_role, 1000 * MIB), limits=FAST)
    node.start()
    with pytest.raises(LoadFailedError) as info:
        await node.acquire("a")
    assert str(info.value) == (
        "backend for role 'a' failed to load: port 8310 is in use by another process; "
        "stop it or give the role another port; see `rosterd ps` / the backend log"
    )
    assert "pid 13484" in node.events[-1].cause  # the detail stays in the log
    await node.shutdown()


def test_client_reason_cuts_paths_but_not_urls() -> None:
    assert client_reason("x: /srv/models/a.gguf does not exist\ntail") == "x: a.gguf does not exist"
    assert client_reason("no answer from http://127.0.0.1:9/v1/x") == (
        "no answer from http://127.0.0.1:9/v1/x"
    )
    assert client_reason("in / and /tmp/") == "in / and /"
    assert len(client_reason("y" * 1000)) == 300


async def test_evicting_a_busy_role_revokes_its_leases_so_the_stop_is_prompt() -> None:
    limits = dataclasses.replace(FAST, drain_s=0.3)
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    held = await node.acquire("x")
    assert held.revoked is not None

    async def hold_until_revoked() -> Revocation:
        assert held.revoked is not None
        try:
            return await held.revoked  # what the router does: end the request, release
        finally:
            node.release(held)

    holder = asyncio.create_task(hold_until_revoked())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await use(node, "y") == "y"
    assert loop.time() - t0 < 1.2  # drain time, then a prompt stop
    revocation = await holder
    assert revocation.code == "evicted"
    assert revocation.message == "role x was unloaded to make room for y after --drain 0.3 s"
    stopping = [e for e in node.events if e.kind == "stopping" and e.role == "x"]
    assert "1 request(s) in flight cut after --drain 0.3 s" in stopping[0].cause
    assert backends.stops == ["x"]
    await node.shutdown()


@pytest.mark.parametrize(("busy", "waiting"), [("a", "b"), ("b", "a")])
async def test_a_busy_excluded_role_is_not_logged_as_idle_when_it_yields(
    busy: str, waiting: str
) -> None:
    limits = SchedulerLimits(drain_s=0.3, min_residency_s=0.0, tick_s=0.02)
    node, _ = make_node(
        [spec("a", 100, sticky=False, excludes=["b"]), spec("b", 100)], 1000, limits
    )
    held = await node.acquire(busy)
    assert held.revoked is not None
    held.revoked.add_done_callback(lambda _: node.release(held))
    assert await use(node, waiting) == waiting
    assert held.revoked.result().message == (
        f"role {busy} was unloaded for {waiting} (they exclude each other) after --drain 0.3 s"
    )
    stopping = next(e for e in node.events if e.kind == "stopping" and e.role == busy)
    assert not stopping.cause.startswith("idle"), stopping.cause
    assert "--drain 0.3 s" in stopping.cause
    await node.shutdown()


async def test_unload_takes_no_new_requests_and_loads_again_for_them_after() -> None:
    limits = dataclasses.replace(FAST, max_concurrency=4, drain_s=5.0)
    node, backends = make_node([spec("x", 100)], 1000, limits)
    held = await node.acquire("x")
    unload = asyncio.create_task(node.unload("x"))
    await asyncio.sleep(0.1)
    newer = asyncio.create_task(node.acquire("x"))  # a slot is free, but an unload was asked
    await asyncio.sleep(0.2)
    assert not newer.done()
    assert not unload.done()
    node.release(held)
    await asyncio.wait_for(unload, 2.0)
    lease = await asyncio.wait_for(newer, 2.0)
    assert lease.generation != held.generation  # served by the backend loaded again
    node.release(lease)
    assert backends.starts == ["x", "x"]
    assert backends.stops == ["x"]
    await node.shutdown()


async def test_eviction_causes_are_a_short_fixed_set_of_metric_labels() -> None:
    limits = SchedulerLimits(
        drain_s=0.3, min_residency_s=0.0, idle_ttl_s=0.3, tick_s=0.02, max_concurrency=4
    )
    specs = {
        s.role: s
        for s in [
            spec("scratch-a", 100, sticky=False, excludes=["scratch-b"]),
            spec("scratch-b", 100, sticky=False),
            spec("big", 700),
            spec("other", 700),
        ]
    }
    metrics = RosterdMetrics()
    backends = FakeBackends(specs, 1000 * MIB)
    node = NodeScheduler("n1", 1000 * MIB, specs, backends, limits=limits, metrics=metrics)
    node.start()
    await use(node, "scratch-a")
    await use(node, "scratch-b")  # scratch-a yields: exclusion
    await asyncio.sleep(0.6)  # scratch-b unloads: idle_ttl
    await use(node, "big")
    await use(node, "other")  # big makes room: make_room
    held = await node.acquire("other")
    assert held.revoked is not None
    held.revoked.add_done_callback(lambda _: node.release(held))
    await use(node, "big")  # other is busy past --drain: drain
    await node.unload("big")  # unload
    await use(node, "scratch-a")
    await node.shutdown()  # shutdown
    text = metrics.render().decode()
    labels = {
        (m["role"], m["cause"])
        for m in (
            dict(re.findall(r'(\w+)="([^"]*)"', line))
            for line in text.splitlines()
            if line.startswith("rosterd_evictions_total{")
        )
    }
    assert labels == {
        ("scratch-a", "exclusion"),
        ("scratch-b", "idle_ttl"),
        ("big", "make_room"),
        ("other", "drain"),
        ("big", "unload"),
        ("scratch-a", "shutdown"),
    }


async def test_a_wait_reason_is_logged_once_while_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # x was loaded recently and serves a steady trickle: y's wait reason flips between
    # "x has requests in flight" and "x loaded too recently" with every request.
    limits = SchedulerLimits(min_residency_s=1.0, drain_s=30.0, tick_s=0.02, max_concurrency=1)
    node, _ = make_node([spec("x", 600, sticky=False), spec("y", 600)], 1000, limits)
    await use(node, "x")
    caplog.set_level(logging.INFO, logger="rosterd.scheduler")
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + 0.8

    async def trickle() -> None:
        while loop.time() < stop_at:
            await use(node, "x", hold_s=0.02)
            await asyncio.sleep(0.01)

    worker = asyncio.create_task(trickle())
    await asyncio.sleep(0.05)
    assert await use(node, "y") == "y"
    await worker
    waits = [r.getMessage() for r in caplog.records if " y waits: " in r.getMessage()]
    assert 1 <= len(waits) <= 2, waits
    await node.shutdown()


async def test_shutdown_while_a_load_finishes_ends_its_waiters_without_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Ctrl-C while a role loads: shutdown ends the waiters, then the load completes.
    # Handing the finished load to those waiters used to raise InvalidStateError.
    node, backends = make_node([spec("a", 100)], 1000, load_s=0.3)
    waiter = asyncio.create_task(node.acquire("a"))
    await asyncio.sleep(0.1)
    assert backends.starts == ["a"]
    with caplog.at_level(logging.ERROR, logger="rosterd.scheduler"):
        await node.shutdown()
    with pytest.raises((ShuttingDownError, LoadFailedError)):
        await waiter
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert node.snapshot()["resident"] == []


async def test_queued_gauge_is_zero_once_a_warm_up_load_is_done() -> None:
    metrics = RosterdMetrics()
    by_role = {"a": spec("a", 100)}
    backends = FakeBackends(by_role, 1000 * MIB)
    node = NodeScheduler("n1", 1000 * MIB, by_role, backends, limits=FAST, metrics=metrics)
    node.start()
    await node.acquire("a", take_slot=False)
    assert metrics.registry.get_sample_value("rosterd_queued", {"role": "a"}) == 0
    assert metrics.registry.get_sample_value("rosterd_in_flight", {"role": "a"}) == 0
    await node.shutdown()


async def test_waiter_leaving_mid_load_is_skipped_without_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, _ = make_node([spec("a", 100)], 1000, load_s=0.3)
    leaving = asyncio.create_task(node.acquire("a"))
    staying = asyncio.create_task(use(node, "a"))
    await asyncio.sleep(0.1)
    with caplog.at_level(logging.ERROR, logger="rosterd.scheduler"):
        leaving.cancel()  # the client goes away while the load is under way
        assert await asyncio.wait_for(staying, 5) == "a"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    await node.shutdown()
