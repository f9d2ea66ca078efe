"""The node loop: callers' calls become events, effects reach futures, backends and metrics.

The backends are fakes standing in for the supervisor (their starts and
stops are recorded and finish when the test lets them); the rules themselves
are pinned on the state machine in ``test_scheduler.py``. No test sleeps:
each waits on a future or an event the code under test sets, and timers run
on an injected clock the test moves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from rosterd.adapters import WeightsSource
from rosterd.backends.local import SupervisorBackends
from rosterd.backends.values import Endpoint
from rosterd.errors import (
    LoadFailedError,
    NodeUnreachableError,
    RoleUnavailableError,
    ShuttingDownError,
)
from rosterd.metrics import ROLE_PHASES, RosterdMetrics
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.values import Phase, SchedulerLimits
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, PortInUseError, ProbeResult, Supervisor
from support.node_loop import LIMITS as NODE_LIMITS
from support.node_loop import Clock, GatedBackends, make_node, spec, use


async def test_concurrent_requests_share_one_load() -> None:
    node, backends = make_node([spec("a", 100)])
    assert await asyncio.gather(*(use(node, "a") for _ in range(8))) == ["a"] * 8
    assert backends.starts == ["a"]
    assert node.events[-1].kind == "loaded"
    assert node.events[-1].node == "n1"
    await node.shutdown()
    assert backends.stops == ["a"]


async def test_a_waiter_leaving_mid_load_is_skipped_without_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, backends = make_node([spec("a", 100)], backends=GatedBackends(gated=["a"]))
    leaving = asyncio.create_task(node.acquire("a"))
    staying = asyncio.create_task(use(node, "a"))
    await backends.started("a").wait()
    with caplog.at_level(logging.ERROR, logger="rosterd.scheduler"):
        leaving.cancel()  # the client goes away while the load is under way
        backends.gates["a"].set()
        assert await staying == "a"
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert node.snapshot().roles["a"].running == 0
    await node.shutdown()


async def test_shutdown_aborts_a_load_under_way_and_refuses_new_requests() -> None:
    node, backends = make_node([spec("big", 100)], backends=GatedBackends(gated=["big"]))
    waiter = asyncio.create_task(node.acquire("big"))
    await backends.started("big").wait()
    await node.shutdown()  # returns although the start alone would never finish
    assert backends.stops == ["big"]
    assert node.snapshot().resident == ()
    with pytest.raises(ShuttingDownError):
        await waiter
    with pytest.raises(ShuttingDownError):
        await node.acquire("big")
    assert [e.kind for e in node.events] == ["loading", "load_failed"]


async def test_an_eviction_past_the_drain_time_revokes_the_lease_held() -> None:
    clock = Clock()
    node, backends = make_node([spec("x", 600, sticky=False), spec("y", 600)], clock=clock)
    held = await node.acquire("x")
    assert held.revoked is not None
    y = asyncio.create_task(use(node, "y"))
    clock.move_to_soon(0.3)  # once y is queued; the loop's next tick sees y waited --drain
    revocation = await held.revoked
    assert revocation.message == "role x was unloaded to make room for y after --drain 0.3 s"
    node.release(held)  # what the router does: end the request, release
    assert await y == "y"
    assert backends.stops == ["x"]
    await node.shutdown()


async def test_queue_timeouts_run_on_the_nodes_clock() -> None:
    clock = Clock()
    limits = SchedulerLimits(max_concurrency=1, queue_timeout_s=5.0, tick_s=0.01)
    node, _ = make_node([spec("a", 100)], clock=clock, limits=limits)
    held = await node.acquire("a")
    waiting = asyncio.create_task(node.acquire("a"))
    clock.move_to_soon(5.0)
    with pytest.raises(Exception, match="was not ready within 5 s") as info:
        await waiting
    assert getattr(info.value, "retry_after_s", None) is not None
    node.release(held)
    await node.shutdown()


async def test_a_crash_reported_by_the_supervisor_waits_for_the_restart() -> None:
    node, backends = make_node([spec("a", 100)])
    assert await use(node, "a") == "a"
    node.backend_event(BackendEvent("a", "exited", pid=111, exit_code=-9))
    waiting = asyncio.create_task(node.acquire("a"))
    node.backend_event(BackendEvent("a", "ready", pid=222))
    lease = await waiting
    assert lease.endpoint.pid == 222
    node.release(lease)
    assert backends.starts == ["a"]
    assert [e.kind for e in node.events][-2:] == ["crashed", "restarted"]
    assert "killed by signal 9" in node.events[-2].cause
    await node.shutdown()


class AgentEvents:
    """A node agent's event stream (what a remote node would send), fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[BackendEvent] = asyncio.Queue()

    async def changes(self) -> Sequence[BackendEvent]:
        return [await self.queue.get()]


async def test_backend_events_from_a_node_agent_reach_the_node() -> None:
    agent = AgentEvents()
    node, _ = make_node([spec("a", 100)], backend_events=agent)
    assert await use(node, "a") == "a"
    agent.queue.put_nowait(BackendEvent("a", "exited", pid=111, exit_code=1))
    agent.queue.put_nowait(BackendEvent("a", "restart_failed", detail="gave up", final=True))
    done = asyncio.get_running_loop().create_future()
    node.listeners.append(lambda e: done.set_result(e) if e.kind == "restart_failed" else None)
    assert (await done).role == "a"
    assert node.snapshot().resident == ()
    await node.shutdown()


async def test_supervisor_backends_pass_on_only_their_roles_events(tmp_path: Path) -> None:
    def no_weights(spec: InferenceSpec) -> WeightsSource:
        raise AssertionError("nothing is started here")

    backends = SupervisorBackends(
        Supervisor(tmp_path), {"a": spec("a", 100)}, host="127.0.0.1", resolve_weights=no_weights
    )
    assert not backends.notice(BackendEvent("other", "exited"))
    assert backends.notice(BackendEvent("a", "exited", pid=1))
    assert backends.notice(BackendEvent("a", "restarting", pid=1))
    assert [e.kind for e in await backends.changes()] == ["exited", "restarting"]


async def test_an_unavailable_role_fails_at_once_without_a_load() -> None:
    why = "role a: models: a: /srv/models/a.gguf does not exist"
    node, backends = make_node([spec("a", 100), spec("b", 100)], unavailable={"a": why})
    with pytest.raises(RoleUnavailableError, match=r"role 'a' is unavailable: .*a\.gguf") as info:
        await node.acquire("a")
    assert "/srv/models" not in str(info.value)
    with pytest.raises(RoleUnavailableError):
        await node.acquire("a", take_slot=False)  # rosterd load, warm-up
    assert await use(node, "b") == "b"
    assert backends.starts == ["b"]  # never tried to load a
    roles = node.snapshot().roles
    assert roles["a"].phase == "unavailable"
    assert roles["a"].unavailable_reason == why
    assert roles["b"].unavailable_reason is None
    await node.shutdown()


class TailError(Exception):
    pass


async def test_a_failed_load_tells_the_client_the_reason_without_paths_or_log_tail() -> None:
    class Failing(GatedBackends):
        async def start(self, role: str) -> Endpoint:
            raise TailError(
                "backend a exited with code 1 before it was ready\n"
                "last lines of /home/op/.local/state/rosterd/logs/a.log:\n"
                "  | /opt/llama/bin/llama-server -m /srv/models/a.gguf --port 9"
            )

    node, _ = make_node([spec("a", 100)], backends=Failing())
    with pytest.raises(LoadFailedError) as info:
        await node.acquire("a")
    assert str(info.value) == (
        "backend for role 'a' failed to load: backend a exited with code 1 before it was "
        "ready; see `rosterd ps` / the backend log"
    )
    assert node.events[-1].kind == "load_failed"
    assert "/srv/models/a.gguf" in node.events[-1].cause  # the full error stays in the log
    await node.shutdown()


async def test_a_port_in_use_tells_the_client_neither_the_pid_nor_the_command_line() -> None:
    class PortTaken(GatedBackends):
        async def start(self, role: str) -> Endpoint:
            holder = "pid 13484 (llama-server: llama-server -m tiny-voice.gguf --host 127.0.0.1)"
            raise PortInUseError("127.0.0.1", 8310, holder)

    node, _ = make_node([spec("a", 100)], backends=PortTaken())
    with pytest.raises(LoadFailedError) as info:
        await node.acquire("a")
    assert str(info.value) == (
        "backend for role 'a' failed to load: port 8310 is in use by another process; "
        "stop it or give the role another port; see `rosterd ps` / the backend log"
    )
    assert "pid 13484" in node.events[-1].cause  # the detail stays in the log
    await node.shutdown()


async def test_metrics_count_loads_evictions_and_show_the_queue() -> None:
    metrics = RosterdMetrics()
    node, _ = make_node([spec("a", 600, sticky=False), spec("b", 600)], metrics=metrics)
    sched = NodeDirectory({"n1": node})
    await sched.load("a")  # a warm-up load takes no slot
    copy_of_a = {"node": "n1", "role": "a"}
    assert metrics.registry.get_sample_value("rosterd_queued", copy_of_a) == 0
    assert metrics.registry.get_sample_value("rosterd_in_flight", copy_of_a) == 0
    assert await use(node, "b") == "b"  # a makes room
    await sched.unload("b")
    assert await use(node, "a") == "a"
    await sched.shutdown()
    text = metrics.render().decode()
    labels = {
        (m["role"], m["cause"])
        for m in (
            dict(re.findall(r'(\w+)="([^"]*)"', line))
            for line in text.splitlines()
            if line.startswith("rosterd_evictions_total{")
        )
    }
    assert labels == {("a", "make_room"), ("b", "unload"), ("a", "shutdown")}
    loads = metrics.registry.get_sample_value
    assert loads("rosterd_loads_total", {"node": "n1", "role": "a", "cause": "load"}) == 1
    assert loads("rosterd_loads_total", {"node": "n1", "role": "b", "cause": "request"}) == 1
    assert loads("rosterd_resident_bytes", {"node": "n1"}) == 0


class SilentNodeBackends(GatedBackends):
    """A remote node's backends whose agent stops answering (a power cut, as the head sees
    it through Ray): probes raise ``NodeUnreachableError`` until ``answers`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answers = False
        self.probed = asyncio.Event()
        self.restarts: list[str] = []

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        self.probed.set()
        if not self.answers:
            raise NodeUnreachableError("n1", "the agent of node n1 did not answer within 8 s")
        return ProbeResult(True, 200)

    async def restart(self, role: str) -> None:
        self.restarts.append(role)


async def test_a_node_that_does_not_answer_holds_requests_and_restarts_nothing() -> None:
    backends = SilentNodeBackends()
    node, _ = make_node([spec("a", 100)], backends=backends)
    first = await node.acquire("a")
    node.release(first)
    # The request could not reach its backend: it waits for a newer one; the probe finds
    # the node silent.
    waiting = asyncio.create_task(node.acquire("a", newer_than=first.generation))
    await backends.probed.wait()
    for _ in range(50):
        if any(e.kind == "node_silent" for e in node.events):
            break
        await asyncio.sleep(0.01)
    assert [e.kind for e in node.events][-1] == "node_silent", node.events
    later = asyncio.create_task(node.acquire("a"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert not later.done()
    assert backends.restarts == []  # not taken for a crash
    node.node_lost("node n1 is lost: Ray declared its node dead")
    await asyncio.sleep(0.05)
    assert not waiting.done()  # it waits, within its queue timeout, for the move
    assert node.snapshot().roles["a"].phase == "lost"
    waiting.cancel()
    later.cancel()
    await node.shutdown()


async def test_every_scheduler_phase_has_its_rosterd_role_phase_label() -> None:
    # An alert on a wedged backend needs phase="unhealthy" (README lists the state).
    assert {p.value for p in Phase} <= set(ROLE_PHASES)
    node, _ = make_node([spec("chat", 100)])
    entry = NodeDirectory({"n1": node}).snapshot()["n1"]
    role = dataclasses.replace(entry.node.roles["chat"], phase="unhealthy")
    shown = dataclasses.replace(entry.node, roles={"chat": role})
    metrics = RosterdMetrics()
    metrics.observe_nodes({"box": dataclasses.replace(entry, node=shown)}, {}, {})
    text = metrics.render().decode()
    assert 'rosterd_role_phase{node="box",phase="unhealthy",role="chat"} 1.0' in text
    assert 'rosterd_role_phase{node="box",phase="ready",role="chat"} 0.0' in text
    assert 'rosterd_node_connected{node="box"} 1.0' in text
    await node.shutdown()


class SavingBackends(GatedBackends):
    """``GatedBackends`` that also save an idle role's KV (``IdleKvSaver``): each save is
    recorded and finishes when the test opens ``save_gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.saving = asyncio.Event()
        self.save_gate = asyncio.Event()
        self.saves: list[str] = []
        self.changing: list[str] = []

    async def save_kv(self, role: str) -> None:
        self.saves.append(role)
        self.saving.set()
        await self.save_gate.wait()

    def kv_changing(self, role: str) -> None:
        self.changing.append(role)


async def test_an_idle_role_is_saved_and_a_request_during_the_save_waits_for_it() -> None:
    clock = Clock()
    backends = SavingBackends()
    node, _ = make_node([spec("a", 100)], backends=backends, clock=clock)
    assert await use(node, "a") == "a"
    assert backends.changing == ["a"]  # the grant told the backends its slots change
    clock.move_to_soon(NODE_LIMITS.kv_idle_save_s)  # idle for the quiet time: it is saved
    await backends.saving.wait()
    waiting = asyncio.create_task(use(node, "a"))
    for _ in range(10):  # steps of the event loop, no time: the node's loop takes it
        await asyncio.sleep(0)
    assert not waiting.done()
    role = node.snapshot().roles["a"]
    assert role.queued == 1
    assert role.waiting_reason is not None
    assert "being saved" in role.waiting_reason
    backends.save_gate.set()
    assert await waiting == "a"
    assert backends.saves == ["a"]
    assert backends.changing == ["a", "a"]
    await node.shutdown()
