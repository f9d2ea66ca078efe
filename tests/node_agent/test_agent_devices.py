"""A node agent's devices (issue 29): the agent probes the node it runs on, the head plans
the node from that probe once its agent joined, and what the agent's backends hold on each
GPU (NVML) or say in their logs they allocated on each device, read by the agent on its
machine, reaches their node with their peaks.

This machine has no GPU: NVML is reached through the stand-in module
(``support.nvml_stand_in``, put where ``pynvml`` is imported), and ``llama-server
--list-devices`` through outputs recorded on machines that have GPUs
(``tests/data/list_devices/``), handed to the real parser. The agent runs in this process,
as Ray would run it on its node (with a real llama-server where it starts a backend); the
head's handle on it stands in for Ray's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import psutil
import pytest

import rosterd.devices.probe as probe
import rosterd.node_agent.actor as agent_actor
import rosterd.up.devices as run_devices
from rosterd.backends.node_host import ServingFacts
from rosterd.devices.pools import NodePools
from rosterd.errors import AdapterError, NodeUnreachableError
from rosterd.fleet import Fleet
from rosterd.fleet.model import ModelSource, Node
from rosterd.fleet.reader import parse_fleet
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import follow_peaks
from rosterd.node_agent import AgentBackends, AgentConfig, NodeAgent, ProbedPools
from rosterd.scheduler.node import NodeScheduler
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.up.devices import RunDevices
from support.nvml_stand_in import StandInGpu, StandInNvml

GiB = 1 << 30
MiB = 1 << 20
LISTED = Path(__file__).resolve().parents[1] / "data" / "list_devices" / "cuda_two_gpus.txt"

FLEET = """
nodes:
  - name: far
    address: 192.0.2.7
    memory_gb: 64
    platform: linux-x86_64
    devices:
      - {{id: CUDA0, memory_gb: {cuda0_gb}, reserved_gb: 1}}
      - {{id: CUDA2, memory_gb: 8}}
"""

UNSEEN = (
    "node far: device CUDA2 is declared in the fleet file but no probe sees it "
    "(llama-server --list-devices, NVML); it is used as declared; the node's llama-server "
    "lists no such device (it lists CUDA0, CUDA1), so the roles placed on it run on the CPU "
    "(--device none)"
)


def fleet(cuda0_gb: int = 10) -> Fleet:
    return parse_fleet(FLEET.format(cuda0_gb=cuda0_gb), file="fleet.yaml")


@pytest.fixture
def far_machine(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The far node's machine as its agent sees it: two NVIDIA GPUs (NVML's stand-in; a
    process nobody's role holds 1 GiB on the first) that its llama-server lists as recorded
    on such a machine. Returns the binaries ``--list-devices`` was run with."""
    gpus = [
        StandInGpu("NVIDIA GeForce RTX 3080 Ti", 11909 * MiB, GiB, "00:01.0", {7: GiB}),
        StandInGpu("NVIDIA RTX PRO 4000 Blackwell", 24026 * MiB, 0, "00:02.0"),
    ]
    monkeypatch.setitem(sys.modules, "pynvml", StandInNvml(gpus))
    listed: list[Path] = []

    def recorded(binary: Path, timeout_s: float = 0.0) -> tuple[str | None, str | None]:
        listed.append(binary)
        return LISTED.read_text(encoding="utf-8"), None

    monkeypatch.setattr(probe, "find_llama_server", lambda: Path("/opt/llama/llama-server"))
    monkeypatch.setattr(probe, "list_devices_text", recorded)
    # the head's own machine: no llama-server, none of the fleet's nodes
    monkeypatch.setattr(run_devices, "find_llama_server", _no_server)
    return listed


def _no_server() -> Path:
    raise AdapterError("no llama-server on the head in this test")


def agent_of(node: Node) -> NodeAgent:
    return NodeAgent(AgentConfig(node.name, node.address, {}, ServingFacts(fleet())))


class HeadsHandle:
    """Stands in for the head's ``AgentBackends`` without Ray: each call reaches the agent
    run in this process, its answer pickled and unpickled as it crosses Ray."""

    def __init__(self, agent: NodeAgent) -> None:
        self.agent = agent
        self.lost_reason: str | None = None
        self.asked: list[Node] = []

    async def pools(self, node: Node) -> ProbedPools:
        self.asked.append(node)
        answer: ProbedPools = pickle.loads(pickle.dumps(await self.agent.pools(node)))
        return answer


def devices_of(pools: NodePools) -> list[tuple[str, str, int]]:
    return [(p.id, p.source, p.capacity_bytes) for p in pools.devices()]


async def test_an_agent_probes_the_devices_of_its_own_machine(far_machine: list[Path]) -> None:
    node = fleet().node("far")
    probed = await agent_of(node).pools(node)
    assert far_machine == [Path("/opt/llama/llama-server")]  # its llama-server, listed there
    # CUDA0: declared 10 GiB less 1 reserved less the 1 GiB another process holds (NVML);
    # CUDA2: no probe sees it, used as declared and said; CUDA1: found, not declared.
    assert devices_of(probed.pools) == [
        ("CUDA0", "declared, probed", 8 * GiB),
        ("CUDA2", "declared", 8 * GiB),
        ("CUDA1", "probed", 24026 * MiB),
    ]
    assert probed.pools.warnings == (UNSEEN,)
    assert probed.notes == ()
    assert pickle.loads(pickle.dumps(probed)) == probed  # it crosses Ray as it is


async def test_an_agent_on_a_machine_without_gpu_or_llama_server_never_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing: no NVML

    def missing() -> Path:
        raise AdapterError("llama-server not found")

    monkeypatch.setattr(probe, "find_llama_server", missing)
    plain = parse_fleet(
        "nodes: [{name: far, address: 192.0.2.7, memory_gb: 64, platform: linux-x86_64}]"
    ).node("far")
    alone = await agent_of(plain).pools(plain)
    assert [p.id for p in alone.pools.pools] == ["host"]  # host RAM alone, as always
    assert (alone.pools.warnings, alone.notes) == ((), ())
    declared = fleet().node("far")
    found = await agent_of(declared).pools(declared)
    assert devices_of(found.pools) == [
        ("CUDA0", "declared", 9 * GiB),
        ("CUDA2", "declared", 8 * GiB),
    ]
    assert len(found.pools.warnings) == 2  # neither declared device seen: each said


async def test_the_head_plans_an_agents_node_from_its_probe_once_it_joined(
    far_machine: list[Path],
) -> None:
    devices = RunDevices()
    handle = HeadsHandle(agent_of(fleet().node("far")))
    agents = cast(Mapping[str, AgentBackends], {"far": handle})

    def far_devices() -> list[tuple[str, str, int]]:
        assert devices.pools is not None
        return devices_of(devices.pools["far"])

    # Before its agent joined: the node as declared, nothing probed, nothing said.
    assert devices.find_pools(fleet()) == ()
    assert far_devices() == [("CUDA0", "declared", 9 * GiB), ("CUDA2", "declared", 8 * GiB)]
    # Joined: the next plan asks the agent, says the unseen device once, counts the probe.
    assert await devices.probe_agents(fleet(), agents) == (UNSEEN,)
    devices.find_pools(fleet())
    assert far_devices() == [
        ("CUDA0", "declared, probed", 8 * GiB),
        ("CUDA2", "declared", 8 * GiB),
        ("CUDA1", "probed", 24026 * MiB),
    ]
    counted = devices.counted(fleet()).node("far").devices
    assert [(d.id, d.memory_bytes) for d in counted] == [
        ("CUDA0", 8 * GiB),
        ("CUDA2", 8 * GiB),
        ("CUDA1", 24026 * MiB),
    ]
    # The same declaration: not asked again, nothing said again.
    assert await devices.probe_agents(fleet(), agents) == ()
    assert len(handle.asked) == 1
    # A reload declares another size for CUDA0: asked again, what is free read now.
    await devices.probe_agents(fleet(cuda0_gb=11), agents)
    devices.find_pools(fleet(cuda0_gb=11))
    assert len(handle.asked) == 2
    assert far_devices()[0] == ("CUDA0", "declared, probed", 9 * GiB)
    # Its agent lost: the node is planned from its declaration again.
    handle.lost_reason = "its Ray node died"
    assert await devices.probe_agents(fleet(cuda0_gb=11), agents) == ()
    devices.find_pools(fleet(cuda0_gb=11))
    assert far_devices() == [("CUDA0", "declared", 10 * GiB), ("CUDA2", "declared", 8 * GiB)]


async def test_an_agent_that_cannot_probe_leaves_its_node_as_declared() -> None:
    class Unreachable:
        lost_reason = None

        async def pools(self, node: Node) -> ProbedPools:
            raise NodeUnreachableError(node.name, "the agent of node far cannot be reached")

    devices = RunDevices()
    agents = cast(Mapping[str, AgentBackends], {"far": Unreachable()})
    said = await devices.probe_agents(fleet(), agents)
    assert said == (
        "node far: its agent could not probe its devices (the agent of node far cannot be "
        "reached); its declared devices are used",
    )
    devices.find_pools(fleet())
    assert devices.pools is not None
    assert devices_of(devices.pools["far"]) == [
        ("CUDA0", "declared", 9 * GiB),
        ("CUDA2", "declared", 8 * GiB),
    ]


class FarNode:
    """A node scheduler as the peak recorder tells it (``measured_peak``), with device pools
    (its snapshot's ``pools``: host and one GPU)."""

    name = "far"

    def __init__(self) -> None:
        self.told: list[tuple[str, int, Mapping[str, int] | None]] = []
        self.listeners: list[object] = []

    def snapshot(self) -> SimpleNamespace:
        return SimpleNamespace(pools=("host", "CUDA0"))

    def measured_peak(
        self, role: str, peak: int, run_peak: int, device_bytes: Mapping[str, int] | None = None
    ) -> None:
        self.told.append((role, peak, device_bytes))


async def test_what_an_agent_reads_on_its_gpus_reaches_the_node_with_each_peak(
    tmp_path: Path,
) -> None:
    class AgentSource:
        """Stands in for the head's handle on an agent (``AgentBackends``) whose chat
        backend holds 6 GiB on its machine's first GPU, as NVML read it there."""

        pids_are_local = False

        async def peak_rss_bytes(self) -> dict[str, int]:
            return {"chat": 400 * MiB, "voice": 100 * MiB}

        async def device_bytes(self) -> dict[str, dict[str, int]]:
            return {"chat": {"CUDA0": 6 * GiB}}

    node = FarNode()
    (recorder,) = follow_peaks(
        {"far": cast(NodeScheduler, node)},
        {"far": AgentSource()},
        [],
        {"chat": "c1", "voice": "v1"},
        MeasuredPeaks(tmp_path),
    )
    try:
        await recorder.record()
    finally:
        await recorder.finish()
    assert node.told[:2] == [
        ("chat", 400 * MiB, {"CUDA0": 6 * GiB}),
        ("voice", 100 * MiB, None),
    ]


async def test_what_an_agent_on_a_mac_reads_counts_on_its_nodes_gpu_share(
    tmp_path: Path,
) -> None:
    # A Mac whose llama-server lists its GPU as `Metal` (older builds): the agent gives the
    # footprint on `MTL0` and the log's buffers on `Metal`; the node's share counts the
    # larger, under the name its pool has.
    class MacAgentSource:
        """Stands in for the head's handle on an agent on a Mac (no Mac here)."""

        pids_are_local = False

        async def peak_rss_bytes(self) -> dict[str, int]:
            return {"writer": 300 * MiB}

        async def device_bytes(self) -> dict[str, dict[str, int]]:
            return {"writer": {"MTL0": 700 * MiB, "Metal": 650 * MiB}}

    node = FarNode()
    node.snapshot = lambda: SimpleNamespace(pools=("host", "Metal"))  # type: ignore[method-assign]
    (recorder,) = follow_peaks(
        {"far": cast(NodeScheduler, node)},
        {"far": MacAgentSource()},
        [],
        {"writer": "w1"},
        MeasuredPeaks(tmp_path),
    )
    try:
        await recorder.record()
    finally:
        await recorder.finish()
    assert node.told[0] == ("writer", 300 * MiB, {"Metal": 700 * MiB})


def tiny_chat(tiny_gguf: Path) -> tuple[InferenceSpec, ServingFacts]:
    """Role ``chat`` on the tiny GGUF (ctx 256, one thread), and the facts that serve it."""
    source = ModelSource(path=tiny_gguf, ctx_size=256, parallel=1, extra_args=("-t", "1"))
    served = dataclasses.replace(fleet(), models={"chat": source}, model_roots=(tiny_gguf.parent,))
    spec = InferenceSpec(
        role="chat",
        flavor=InferFlavor.LLAMACPP,
        model="tiny-chat",
        memory=MemorySpec(weights_bytes=GiB // 10),
    )
    return spec, ServingFacts(served)


@contextlib.asynccontextmanager
async def chat_running(tmp_path: Path, tiny_gguf: Path) -> AsyncIterator[tuple[NodeAgent, int]]:
    """An agent (:func:`tiny_agent`) running :func:`tiny_chat`'s real llama-server, and that
    backend's pid; the agent is closed, stopping it, on the way out."""
    spec, facts = tiny_chat(tiny_gguf)
    agent = tiny_agent(tmp_path, facts, {"chat": spec})
    await agent.open()
    try:
        await agent.start("chat")
        yield agent, (await agent.backend_pids())["chat"]
    finally:
        await agent.close()


def tiny_agent(
    tmp_path: Path, facts: ServingFacts, specs: Mapping[str, InferenceSpec]
) -> NodeAgent:
    """An agent for node ``far`` run in this process on this machine (auto ports)."""
    config = AgentConfig(
        "far",
        "127.0.0.1",
        dict(specs),
        facts,
        state_root=str(tmp_path / "state"),
        auto_ports=True,
        grace_s=5.0,
    )
    return NodeAgent(config)


async def test_an_agent_reads_what_its_running_backend_holds_on_each_gpu(
    tmp_path: Path,
    tiny_gguf: Path,
    llama_server_binary: Path,
    monkeypatch: pytest.MonkeyPatch,
    far_machine: list[Path],
) -> None:
    # A real llama-server started by the agent; NVML's stand-in then says its process
    # holds 6 GiB on the first GPU, beside another process's 1 GiB.
    async with chat_running(tmp_path, tiny_gguf) as (agent, pid):
        gpus = [
            StandInGpu("NVIDIA GeForce RTX 3080 Ti", 11909 * MiB, 7 * GiB, "00:01.0"),
            StandInGpu("NVIDIA RTX PRO 4000 Blackwell", 24026 * MiB, 0, "00:02.0"),
        ]
        gpus[0].processes = {pid: 6 * GiB, 7: GiB}
        monkeypatch.setitem(sys.modules, "pynvml", StandInNvml(gpus))
        assert await agent.device_bytes() == {"chat": {"CUDA0": 6 * GiB}}
        # Probed now, what its own backend holds is not others': CUDA0 counts 10 GiB
        # declared, less 1 reserved, less the other process's 1 GiB.
        probed = await agent.pools(fleet().node("far"))
        assert devices_of(probed.pools)[0] == ("CUDA0", "declared, probed", 8 * GiB)


async def test_an_agent_reads_what_its_backends_log_says_they_allocated_on_each_device(
    tmp_path: Path,
    tiny_gguf: Path,
    llama_server_binary: Path,
    monkeypatch: pytest.MonkeyPatch,
    far_machine: list[Path],
) -> None:
    # This machine's llama-server allocates on no device: the lines a GPU build logs as it
    # loads (recorded on CUDA and ROCm, tests/data/load_buffers/) are added to the real
    # backend's log. Where NVML reads the device too, the larger figure counts.
    async with chat_running(tmp_path, tiny_gguf) as (agent, pid):
        (log,) = (tmp_path / "state").rglob("chat.log")
        with log.open("a", encoding="utf-8") as out:
            out.write("load_tensors:        CUDA0 model buffer size =  7000.00 MiB\n")
            out.write("llama_kv_cache_init:      ROCm0 KV buffer size =  4352.00 MiB\n")
        gpus = [StandInGpu("NVIDIA GeForce RTX 3080 Ti", 11909 * MiB, 7 * GiB, "00:01.0")]
        gpus[0].processes = {pid: 6 * GiB}
        monkeypatch.setitem(sys.modules, "pynvml", StandInNvml(gpus))
        assert await agent.device_bytes() == {"chat": {"CUDA0": 7000 * MiB, "ROCm0": 4352 * MiB}}
        gpus[0].processes = {pid: 8 * GiB}  # NVML's figure grows past the log's: it counts
        assert await agent.device_bytes() == {"chat": {"CUDA0": 8 * GiB, "ROCm0": 4352 * MiB}}


async def test_an_agent_on_a_mac_reads_its_backends_physical_footprint(
    tmp_path: Path,
    tiny_gguf: Path,
    llama_server_binary: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real llama-server started by the agent; macOS's proc_pid_rusage stands in (no Mac
    # here) and says its process's physical footprint is 3 GiB: counted on the GPU share.
    async with chat_running(tmp_path, tiny_gguf) as (agent, pid):
        asked: list[tuple[int, ...]] = []

        def footprints(pids: tuple[int, ...]) -> dict[int, int]:
            asked.append(pids)
            return {pid: 3 * GiB, 1: GiB}

        monkeypatch.setattr(agent_actor, "read_phys_footprints", footprints)
        monkeypatch.setitem(sys.modules, "pynvml", StandInNvml([]))
        assert await agent.device_bytes() == {"chat": {"MTL0": 3 * GiB}}
        assert asked == [(pid,)]


async def test_an_agents_launch_carries_the_pins_the_heads_device_plan_gave(
    tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path
) -> None:
    # The head's device plan reaches the agent with its configuration; the backend it
    # starts next runs with those flags (here the CPU-only pin this build can take).
    spec, facts = tiny_chat(tiny_gguf)
    agent = tiny_agent(tmp_path, facts, {})
    await agent.open()
    try:
        pin = ("--device", "none", "-ngl", "0")
        await agent.reconfigure({"chat": spec}, facts, {"chat": pin})
        await agent.start("chat")
        pid = (await agent.backend_pids())["chat"]
        argv = psutil.Process(pid).cmdline()
        at = argv.index("--device")
        assert argv[at : at + len(pin)] == list(pin), argv
    finally:
        await agent.close()
