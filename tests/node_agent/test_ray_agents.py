"""The fleet on Ray: fleet nodes matched to Ray nodes, one agent per node serving real backends.

A ``ray.cluster_utils.Cluster`` runs several Ray nodes on this machine, each
at its own loopback address (127.0.0.2, 127.0.0.3, ...: all of 127/8 is
loopback on Linux), standing for the fleet's machines; so matching by address
is real. Each node's agent starts a real llama-server on the tiny GGUF,
listening on that node's address, and the test reaches it over HTTP there.
Every Ray process a test starts is stopped by its own handle
(``Cluster.shutdown``, ``Cluster.remove_node``), never ``ray stop``.
The Ray tests skip with the reason when Ray (the ``ray`` extra) is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from rosterd.backends.node_host import NodeHost, ServingFacts
from rosterd.errors import (
    ClusterError,
    NodeLostError,
    RayNotInstalledError,
    WeightsError,
)
from rosterd.fleet import Fleet, ModelSource, Node, Platform
from rosterd.fleet.model import DeviceSpec
from rosterd.fleet_scheduler.effects import DropAgents, StartAgents
from rosterd.fleet_scheduler.values import NodeRun, NodeServing
from rosterd.metrics import RosterdMetrics
from rosterd.node_agent import AgentBackends, AgentConfig, CarriedError, NodeAgent
from rosterd.ray_cluster import RayCluster, import_ray, join, ray_address
from rosterd.ray_match import RayNode, lost_agents, match_fleet, nodes_back
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.supervisor import BackendEvent, BackendStartError, StateDirLockedError
from rosterd.tokens import GB
from rosterd.up.fleet_effects import UpFleetEffects
from rosterd.up.options import UpOptions
from support.backends import gone
from support.fleet_bench import config as served_config
from support.polling import eventually
from support.ray_nodes import ABSENT_IP, HEAD_IP, SPARE_IP, WORKER_IP, needs_ray

SRC = Path(__file__).resolve().parents[2] / "src"


def node(name: str, address: str) -> Node:
    return Node(
        name=name,
        memory_bytes=8 * GB,
        reserved_bytes=GB,
        platform=Platform.LINUX_X86_64,
        flavors=frozenset({InferFlavor.LLAMACPP}),
        address=address,
    )


def tiny_spec(role: str) -> InferenceSpec:
    return InferenceSpec(
        role=role,
        flavor=InferFlavor.LLAMACPP,
        model=f"tiny-{role}",
        memory=MemorySpec(weights_bytes=GB // 10),
    )


def fleet_of(nodes: dict[str, str], gguf: Path, roles: list[str]) -> Fleet:
    """Nodes name -> address; every role in ``roles`` served from ``gguf`` with one thread."""
    source = ModelSource(path=gguf, ctx_size=256, parallel=1, extra_args=("-t", "1"))
    return Fleet(
        nodes=tuple(node(n, a) for n, a in nodes.items()),
        models={role: source for role in roles},
        model_roots=(gguf.parent,),
    )


async def complete(base_url: str, model: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        answer = await client.post(
            base_url + "/v1/completions",
            json={"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["text"]
    assert isinstance(text, str)
    return text


class Lab:
    """The joined cluster, a fleet matched to it, and the agents a test started there (as
    the fleet scheduler starts them); :meth:`close` ends every agent."""

    def __init__(self, address: str, fleet: Fleet) -> None:
        self.cluster: RayCluster = join(address)
        self.fleet = fleet
        self.connections = {c.node: c for c in self.cluster.connections(fleet)[0]}
        self.agents: dict[str, AgentBackends] = {}
        self.lost: dict[str, str] = {}

    async def start(
        self,
        node: str,
        specs: dict[str, InferenceSpec],
        *,
        on_event: Callable[[BackendEvent], None] | None = None,
        state_root: str | None = None,
        auto_ports: bool = False,
        grace_s: float = 10.0,
    ) -> AgentBackends:
        conn = self.connections[node]
        if conn.ray_node_id is None:
            raise ClusterError(f"node {node} is not connected to the Ray cluster: {conn.reason}")
        config = AgentConfig(
            node=node,
            host=self.fleet.node(node).address,
            specs=specs,
            facts=ServingFacts(self.fleet),
            state_root=state_root,
            auto_ports=auto_ports,
            grace_s=grace_s,
        )
        agent = await self.cluster.start_agent(
            config, conn.ray_node_id, on_event=on_event, on_lost=self.lost.__setitem__
        )
        self.agents[node] = agent
        return agent

    async def close(self) -> None:
        await asyncio.gather(*(a.close() for a in self.agents.values()))


async def wait_until_gone(pid: int, timeout_s: float) -> None:
    # another process's state: nothing to await but a poll
    await eventually(lambda: gone(pid), what=f"process {pid} to end", timeout_s=timeout_s)


def listen_addresses(pid: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


# --------------------------------------------------------------------------- without Ray


def test_fleet_nodes_match_ray_nodes_by_ip() -> None:
    fleet = Fleet(
        nodes=(
            node("a", "10.0.0.1"),
            node("b", "10.0.0.2"),
            node("c", "10.0.0.3"),
            node("d", "10.0.0.4"),
            node("e", "gpu-box"),
            node("f", "gpu-box-2"),
        )
    )
    ray_nodes = [
        RayNode("aa" * 14, "10.0.0.1", alive=True),
        RayNode("bb" * 14, "10.0.0.2", alive=False),
        RayNode("c1" * 14, "10.0.0.3", alive=True),
        RayNode("c2" * 14, "10.0.0.3", alive=True),
        RayNode("ee" * 14, "10.0.0.5", alive=True),
    ]
    got = {c.node: c for c in match_fleet(fleet, ray_nodes, {"e": ["10.0.0.5"], "f": []})}
    assert got["a"].connected
    assert got["a"].ray_node_id == "aa" * 14
    assert got["a"].reason == f"Ray node {'aa' * 6} at 10.0.0.1"
    assert not got["b"].connected
    assert got["b"].reason == "the Ray node at 10.0.0.2 is not alive"
    assert not got["c"].connected
    assert got["c"].reason.startswith("2 live Ray nodes have address 10.0.0.3")
    assert not got["d"].connected
    assert got["d"].reason == (
        "no live Ray node has address 10.0.0.4 (live Ray nodes: 10.0.0.1, 10.0.0.3, 10.0.0.5); "
        "join that machine with `ray start --address`"
    )
    assert got["e"].ray_node_id == "ee" * 14  # a name, resolved
    assert got["f"].reason == "address gpu-box-2 does not resolve to an IP address"


def test_a_lost_node_is_back_when_a_live_ray_node_has_its_address() -> None:
    fleet = Fleet(nodes=(node("a", "10.0.0.1"), node("b", "10.0.0.2")))
    addresses = {"a": ["10.0.0.1"], "b": ["10.0.0.2"]}
    dead = [RayNode("aa" * 14, "10.0.0.1", alive=True), RayNode("bb" * 14, "10.0.0.2", alive=False)]
    assert nodes_back(fleet, ["b"], dead, addresses) == {}  # still only the dead one there
    again = [*dead, RayNode("b2" * 14, "10.0.0.2", alive=True)]  # the machine rejoined
    back = nodes_back(fleet, ["b"], again, addresses)
    assert list(back) == ["b"]
    assert back["b"].ray_node_id == "b2" * 14


def test_a_lost_node_named_by_a_hostname_is_back_by_its_resolved_address() -> None:
    fleet = Fleet(nodes=(node("gpu", "gpu-box"),))
    back = nodes_back(
        fleet, ["gpu"], [RayNode("g2" * 14, "10.0.0.7", alive=True)], {"gpu": ["10.0.0.7"]}
    )
    assert list(back) == ["gpu"]


def test_an_agents_ray_node_that_died_or_left_the_listing_is_lost() -> None:
    agents = {"a": "aa" * 14, "b": "bb" * 14, "c": "cc" * 14}
    listed = [
        RayNode("aa" * 14, "10.0.0.1", alive=True),
        RayNode("bb" * 14, "10.0.0.2", alive=False, death_reason="no heartbeat"),
    ]
    lost = lost_agents(agents, listed, {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"})
    assert lost == {
        "b": "node b is lost: its Ray node at 10.0.0.2 is no longer alive: no heartbeat",
        "c": "node c is lost: its Ray node at 10.0.0.3 is no longer alive",
    }


def test_a_rosterd_error_crosses_the_agent_boundary_whole() -> None:
    err = BackendStartError(
        "backend r exited with code 1 before it was ready",
        name="r",
        pid=42,
        exit_code=1,
        output_tail=("bad model",),
        log_path=Path("logs/r.log"),
    )
    back = pickle.loads(pickle.dumps(CarriedError(err))).unwrap()
    assert type(back) is BackendStartError
    assert str(back) == str(err)
    assert (back.name, back.pid, back.exit_code, back.output_tail) == ("r", 42, 1, ("bad model",))
    lost = pickle.loads(pickle.dumps(NodeLostError("b", "node b is lost")))
    assert (lost.node, str(lost)) == ("b", "node b is lost")


def test_ray_address_without_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(RayNotInstalledError) as caught:
        import_ray()
    assert str(caught.value) == (
        "Ray is not installed: pip install '.[ray]' in rosterd's checkout (rosterd is not on PyPI)"
    )
    with pytest.raises(RayNotInstalledError):
        join("10.0.0.1:6379")


def test_the_ray_address_comes_from_the_option_else_the_environment() -> None:
    assert ray_address("10.0.0.1:6379", {"RAY_ADDRESS": "10.0.0.2:6379"}) == "10.0.0.1:6379"
    assert ray_address(None, {"RAY_ADDRESS": "10.0.0.2:6379"}) == "10.0.0.2:6379"
    assert ray_address(None, {"RAY_ADDRESS": " "}) is None
    assert ray_address(None, {}) is None


def test_rosterd_without_a_ray_fleet_never_imports_ray() -> None:
    code = (
        "import sys, rosterd.ray_cluster, rosterd.node_agent, rosterd.scheduler\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


async def test_every_node_agent_gets_the_kv_disk_budget_of_up(tmp_path: Path) -> None:
    """``rosterd up --kv-disk-gb`` reaches the node agents: the agent the fleet's effects
    build for a Ray node opens with that budget for its kept KV caches (the agent runs
    here, as Ray would run it on its node; the fake cluster only hands it over)."""
    opened: list[NodeAgent] = []

    class HandsOver:
        async def start_agent(self, config: AgentConfig, ray_node_id: str, **_: Any) -> Any:
            agent = NodeAgent(config)
            opened.append(agent)
            info = await agent.open()

            class Opened:
                async def close(self) -> None:
                    await agent.close()

            backends = Opened()
            backends.info = info  # type: ignore[attr-defined]
            return backends

    budget = 3 * GB + 17
    options = UpOptions(roster_path=tmp_path / "roster.yaml", kv_disk_bytes=budget)
    effects = UpFleetEffects(
        options,
        reporter=None,  # type: ignore[arg-type]  # starting agents says nothing
        metrics=RosterdMetrics(),
        host=NodeHost(tmp_path / "head"),
        cluster=HandsOver(),  # type: ignore[arg-type]
        state_dir=tmp_path / "head",
    )
    served = served_config([], [node("gpu", "127.0.0.1")])
    effect = StartAgents(
        {"gpu": NodeServing("gpu", 7 * GB, {}, run=NodeRun.AGENT)}, served, {"gpu": "ray-gpu"}
    )
    started, errors = await effects.start_agents(effect)
    try:
        assert not errors, errors
        assert started.started == ("gpu",)
        assert opened[0].config.kv_disk_bytes == budget
        info = effects._agents["gpu"].info
        assert info is not None
        assert info.kv_disk_bytes == budget  # what the agent's keeper on its node was given
    finally:
        await effects.drop_agents(DropAgents(("gpu",)))


@needs_ray
def test_joining_never_starts_a_cluster_and_says_why_it_cannot_join() -> None:
    # A fresh process: this one may already have joined the test cluster.
    code = (
        "import sys\n"
        "from rosterd.errors import ClusterConnectError\n"
        "from rosterd.ray_cluster import join\n"
        "for address in sys.argv[1:]:\n"
        "    try:\n"
        "        join(address)\n"
        "    except ClusterConnectError as err:\n"
        "        print(err)\n"
        "import ray\n"
        "assert not ray.is_initialized()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code, "127.0.0.9:1", "ray://127.0.0.9:10001", "nonsense"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cannot reach the Ray cluster at 127.0.0.9:1: Connection refused")
    assert "not a URL" in lines[1]
    assert lines[2] == "--ray-address nonsense: expected HOST:PORT, e.g. 192.168.1.10:6379"


# --------------------------------------------------------------------------- on a Ray cluster
# (the ``cluster`` fixture, a head at 127.0.0.2 and a node at 127.0.0.3, is in conftest.py)


@pytest.mark.slow
@needs_ray
async def test_roles_on_two_nodes_are_served_by_their_own_agents(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    fleet = fleet_of(
        {"head": HEAD_IP, "worker": WORKER_IP, "absent": ABSENT_IP}, tiny_gguf, ["chat", "code"]
    )
    sigterm = signal.getsignal(signal.SIGTERM)
    lab = Lab(cluster.address, fleet)
    assert signal.getsignal(signal.SIGTERM) is sigterm  # rosterd's own drain stays in charge
    conns = lab.connections
    assert conns["head"].ray_node_id == cluster.head_node.node_id
    assert conns["worker"].ray_node_id == next(iter(cluster.worker_nodes)).node_id
    assert not conns["absent"].connected
    assert conns["absent"].reason.startswith("no live Ray node has address 127.0.0.9")
    with pytest.raises(ClusterError, match="node absent is not connected"):
        await lab.start("absent", {})

    events: list[BackendEvent] = []
    placed = {"head": "chat", "worker": "code"}
    try:
        backends = {
            name: await lab.start(
                name,
                {role: tiny_spec(role)},
                on_event=events.append,
                state_root=str(tmp_path / "state"),
                auto_ports=True,
                grace_s=5.0,
            )
            for name, role in placed.items()
        }
        agent_pids = {name: b.info.pid for name, b in backends.items() if b.info is not None}
        assert len(set(agent_pids.values())) == 2  # one agent process per node
        for name in placed:
            state_dir = tmp_path / "state" / "nodes" / name
            info = backends[name].info
            assert info is not None
            assert info.state_dir == str(state_dir)

        # The node schedulers drive the agents as they drive the local supervisor.
        scheduler = NodeDirectory(
            {
                name: NodeScheduler(
                    name, 4 * GB, {role: tiny_spec(role)}, backends[name], limits=SchedulerLimits()
                )
                for name, role in placed.items()
            }
        )
        scheduler.start()
        try:
            leases = await asyncio.gather(*(scheduler.acquire(r) for r in placed.values()))
            pids: dict[str, int] = {}
            for lease in leases:
                address = fleet.node(lease.node).address
                assert lease.endpoint.base_url.startswith(f"http://{address}:")
                assert lease.endpoint.pid is None  # not a process of this machine
                assert await complete(lease.endpoint.base_url, lease.endpoint.served_model) != ""
                scheduler.release(lease)
                (pid,) = (await backends[lease.node].backend_pids()).values()
                pids[lease.node] = pid
                server = psutil.Process(pid)
                assert Path(server.exe()).name == "llama-server"
                assert server.ppid() == agent_pids[lease.node]  # started by its node's agent
                assert listen_addresses(pid) == {address}
                (rss,) = (await backends[lease.node].measured_bytes()).values()
                assert rss > 0
                log = tmp_path / "state" / "nodes" / lease.node / "logs" / f"{lease.role}.log"
                assert "--- rosterd: starting" in log.read_text(errors="replace")
            ready = {(e.name, e.pid) for e in events if e.kind == "ready"}
            assert ready == {(placed[n], pids[n]) for n in placed}
        finally:
            await scheduler.shutdown()
        for pid in pids.values():
            assert gone(pid)
        for name, role in placed.items():  # each stop saved its slot on its own node
            kept = backends[name].kept_kv(role)
            assert kept is not None, name
            assert kept.tokens > 0, kept
            assert kept.saves == 1, kept
        # events come from the nodes a moment later than the stops returned
        stopped = set(placed.values())
        await eventually(
            lambda: {e.name for e in events if e.kind == "stopped"} == stopped,
            what=f"stopped events from {sorted(stopped)}",
            timeout_s=10.0,
        )
    finally:
        await lab.close()
    for pid in agent_pids.values():
        await wait_until_gone(pid, 30.0)


@pytest.mark.slow
@needs_ray
async def test_a_node_error_is_raised_on_the_head_as_itself(
    cluster: Any, tiny_gguf: Path, tmp_path: Path
) -> None:
    fleet = fleet_of({"worker": WORKER_IP}, tiny_gguf, [])  # no weights known for any role
    lab = Lab(cluster.address, fleet)
    try:
        backends = await lab.start(
            "worker", {"chat": tiny_spec("chat")}, state_root=str(tmp_path / "state")
        )
        with pytest.raises(WeightsError, match="role chat: no weights found"):
            await backends.start("chat")
        # A second rosterd on the same node and state folder is refused, not let in.
        second = Lab(cluster.address, fleet)
        with pytest.raises(StateDirLockedError) as caught:
            await second.start("worker", {}, state_root=str(tmp_path / "state"))
        assert caught.value.lock_path == tmp_path / "state" / "nodes" / "worker" / "rosterd.lock"
        assert caught.value.owner_pid == (backends.info.pid if backends.info else None)
        assert second.agents == {}
    finally:
        await lab.close()


@pytest.mark.slow
@needs_ray
async def test_an_agent_probes_its_own_node_and_its_pools_cross_ray(
    cluster: Any, tiny_gguf: Path, tmp_path: Path
) -> None:
    # The worker's agent probes the worker's machine (this one: no GPU, so no probe sees
    # the declared CUDA0): the declared device comes back as declared, with the warning
    # naming the node, and nothing is held on any GPU.
    fleet = fleet_of({"worker": WORKER_IP}, tiny_gguf, [])
    gpu = DeviceSpec(id="CUDA0", memory_bytes=4 * GB, reserved_bytes=GB)
    worker = dataclasses.replace(fleet.node("worker"), devices=(gpu,))
    lab = Lab(cluster.address, dataclasses.replace(fleet, nodes=(worker,)))
    try:
        backends = await lab.start("worker", {}, state_root=str(tmp_path / "state"))
        probed = await backends.pools(worker)
        assert [(p.id, p.source, p.capacity_bytes) for p in probed.pools.devices()] == [
            ("CUDA0", "declared", 3 * GB)
        ]
        assert probed.pools.warnings == (
            "node worker: device CUDA0 is declared in the fleet file but no probe sees it "
            "(llama-server --list-devices, NVML); it is used as declared; the node's "
            "llama-server lists no such device, so the roles placed on it run on the CPU "
            "(--device none)",
        )
        assert probed.pools.unlisted == ("CUDA0",)  # so its roles launch on the CPU there
        assert await backends.device_bytes() == {}
    finally:
        await lab.close()


@pytest.mark.slow
@needs_ray
async def test_a_lost_node_is_reported_and_its_backend_dies_with_its_agent(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    spare = cluster.add_node(num_cpus=1, node_ip_address=SPARE_IP)
    cluster.wait_for_nodes()
    removed = False
    fleet = fleet_of({"spare": SPARE_IP}, tiny_gguf, ["chat"])
    lab = Lab(cluster.address, fleet)
    assert lab.connections["spare"].ray_node_id == spare.node_id
    events: list[BackendEvent] = []
    looks: list[list[RayNode]] = []
    watcher = asyncio.create_task(
        lab.cluster.watch(lambda nodes: looks.append(list(nodes)), poll_s=0.5)
    )

    def losses() -> dict[str, str]:
        agents = {"spare": spare.node_id}
        return lost_agents(agents, looks[-1], {"spare": SPARE_IP}) if looks else {}

    try:
        backends = await lab.start(
            "spare",
            {"chat": tiny_spec("chat")},
            on_event=events.append,
            state_root=str(tmp_path / "state"),
            auto_ports=True,
        )
        endpoint = await backends.start("chat")
        assert endpoint.base_url.startswith(f"http://{SPARE_IP}:")
        (pid,) = (await backends.backend_pids()).values()

        cluster.remove_node(spare)
        removed = True
        await eventually(lambda: bool(losses()), what="node spare lost", timeout_s=60.0)
        [(lost, why)] = losses().items()
        assert lost == "spare"
        assert why.startswith("node spare is lost")
        backends.lost(why)  # what the fleet scheduler's MarkLost does
        await wait_until_gone(pid, 30.0)  # it died with its agent
        assert [(e.name, e.kind, e.pid, e.final) for e in events[-2:]] == [
            ("chat", "exited", pid, False),
            ("chat", "restart_failed", pid, True),
        ]
        with pytest.raises(NodeLostError, match="node spare is lost"):
            await backends.start("chat")
        await backends.stop("chat")  # nothing is left to stop: returns at once
        again = Lab(cluster.address, fleet).connections["spare"]
        assert not again.connected
        assert again.reason == f"the Ray node at {SPARE_IP} is not alive"
    finally:
        watcher.cancel()
        await lab.close()
        if not removed:
            cluster.remove_node(spare)


@pytest.mark.slow
@needs_ray
async def test_an_agent_that_dies_takes_its_backends_and_its_node_is_lost(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    fleet = fleet_of({"worker": WORKER_IP}, tiny_gguf, ["chat"])
    lab = Lab(cluster.address, fleet)
    events: list[BackendEvent] = []
    try:
        backends = await lab.start(
            "worker",
            {"chat": tiny_spec("chat")},
            on_event=events.append,
            state_root=str(tmp_path / "state"),
            auto_ports=True,
        )
        await backends.start("chat")
        (pid,) = (await backends.backend_pids()).values()
        assert backends.info is not None
        os.kill(backends.info.pid, signal.SIGKILL)  # the agent's process, by its pid

        await eventually(lambda: "worker" in lab.lost, what="node worker lost", timeout_s=30.0)
        assert "its agent died" in lab.lost["worker"]
        await wait_until_gone(pid, 30.0)  # the parent-death signal took it
        assert ("chat", "restart_failed", True) in [(e.name, e.kind, e.final) for e in events]
        with pytest.raises(NodeLostError):
            await backends.start("chat")
    finally:
        await lab.close()


@pytest.mark.slow
@needs_ray
async def test_a_ray_node_marked_dead_is_a_lost_node(cluster: Any, tmp_path: Path) -> None:
    # A Ray node can be declared dead while its agent's calls have not failed yet (a
    # network split); here the cluster's listing says so, and the node is lost at once.
    fleet = fleet_of({"worker": WORKER_IP}, Path("unused.gguf"), [])
    lab = Lab(cluster.address, fleet)
    try:
        backends = await lab.start("worker", {}, state_root=str(tmp_path / "state"))
        worker_id = lab.connections["worker"].ray_node_id
        assert worker_id is not None
        listed = [RayNode(worker_id, WORKER_IP, alive=False, death_reason="no heartbeat")]
        [(_, why)] = lost_agents({"worker": worker_id}, listed, {"worker": WORKER_IP}).items()
        assert why == (
            f"node worker is lost: its Ray node at {WORKER_IP} is no longer alive: no heartbeat"
        )
        backends.lost(why)  # what the fleet scheduler's MarkLost does
        assert lab.lost == {"worker": why}
        assert backends.lost_reason == why
        with pytest.raises(NodeLostError):
            await backends.start("chat")
        assert backends.info is not None
        await wait_until_gone(backends.info.pid, 30.0)  # a lost node's agent is ended
    finally:
        await lab.close()
