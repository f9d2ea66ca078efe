"""The devices of one ``rosterd up`` run (DESIGN.md layer 8; issue 29: a GPU's memory is a
budget of its own, planned, pinned and held at run time).

:class:`RunDevices` finds the pools of this machine's nodes once, at the run's first plan
(``llama-server --list-devices`` and NVML, :func:`rosterd.devices.probe.probe_pools`)
where the fleet declares a device on this machine or NVML finds a GPU,
merges them with the fleet's declared ``devices:`` (a declared device that no probe sees is
used as declared, with one warning) and keeps them for the run. Each plan then places the
roles that use a device on one (:func:`rosterd.placement.devices.place_on_devices`); what
it decided reaches the node machines as their device pools (``DevicePool``: a load needs
room in every pool its role uses) and the launches as their pins (``--device``, ``-ngl``,
``--fit off`` where the build lists it). A node that a node agent runs on Ray is probed
on its own machine by its agent (:meth:`RunDevices.probe_agents`: ``NodeAgent.pools``, the
same probes), once it joined and again when a reload declares other devices for it, and
its pools are merged with its declared devices the same way; until its agent joined, and
once it is lost, it is planned from its declared devices alone. A fleet with no devices
on a machine with none has the host pool alone: every plan, load and launch is as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

from rosterd.adapters.llamacpp import find_llama_server, pinned_args
from rosterd.devices.nvml import read_nvml
from rosterd.devices.pools import NodePools, node_pools, with_counted_devices
from rosterd.devices.probe import LIST_DEVICES_TIMEOUT_S, probe_pools, server_lists_fit
from rosterd.errors import AdapterError, RosterdError
from rosterd.flavors import DeviceUse
from rosterd.fleet import Fleet
from rosterd.fleet.addresses import is_this_machine
from rosterd.fleet.model import Node
from rosterd.fleet_scheduler.values import MemoryFigures, NodeServing
from rosterd.memory.by_pool import device_needs
from rosterd.memory.gathering import RosterMemory
from rosterd.node_agent import AgentBackends, ProbedPools
from rosterd.placement import Plan
from rosterd.placement.device_need import DeviceNeed
from rosterd.placement.devices import DevicePlan, place_on_devices
from rosterd.scheduler.values import DevicePool
from rosterd.spec import InferenceSpec

#: How long an agent's probe of its node may take, seconds: its ``--list-devices`` (bounded
#: by ``LIST_DEVICES_TIMEOUT_S`` there), NVML and the call over Ray; past it, the node's
#: declared devices are used and the plan goes on.
AGENT_PROBE_TIMEOUT_S: float = LIST_DEVICES_TIMEOUT_S + 15.0


class RunDevices:
    """The pools of a run's nodes, found once, and the device plan of the latest solve.

    ``pools``: node -> its :class:`NodePools` (``None`` until :meth:`find_pools` ran);
    ``plan``: the latest :class:`DevicePlan` (``None``: no node has a device);
    ``fit_flag``: whether this machine's llama-server lists ``--fit``.
    """

    def __init__(self) -> None:
        self.pools: dict[str, NodePools] | None = None
        self.plan: DevicePlan | None = None
        self.fit_flag = False
        self._declared: tuple[object, ...] | None = None
        self._here: dict[str, NodePools] = {}  # this machine's nodes, as last probed
        # node -> (the agent that probed it, the node as then declared, its pools)
        self._by_agent: dict[str, tuple[AgentBackends, Node, NodePools]] = {}

    def find_pools(self, fleet: Fleet, own_pids: frozenset[int] = frozenset()) -> tuple[str, ...]:
        """Find each node's pools (blocking: run it off the event loop): a node agent's as
        its agent probed it (:meth:`probe_agents`), this machine's other nodes by probe, the
        others from the fleet file alone. This machine is probed once per run, and again
        when a reload's fleet names other nodes or declares other devices (the probe then
        reads what is free now; ``own_pids``: this run's backends here, whose GPU memory is
        theirs to count, not others'). Returns what a person should read: one warning per
        declared device no probe saw, and why a probe could not run where devices are
        declared."""
        said: tuple[str, ...] = ()
        declared = tuple((n.name, n.address, n.devices) for n in fleet.nodes)
        if self.pools is None or declared != self._declared:
            self._declared = declared
            said = self._probe_here(fleet, own_pids)
        pools: dict[str, NodePools] = {}
        for node in fleet.nodes:
            # A node an agent runs is its agent's to probe, even on this machine (a Ray node
            # here): the agent knows its own backends, whose GPU memory is not others'.
            by_agent = self._by_agent.get(node.name)
            probed = by_agent[2] if by_agent is not None and by_agent[1] == node else None
            probed = probed if probed is not None else self._here.get(node.name)
            pools[node.name] = probed if probed is not None else node_pools(node, probed=False)
        self.pools = pools
        return said

    def _probe_here(self, fleet: Fleet, own_pids: frozenset[int]) -> tuple[str, ...]:
        """Probe this machine's nodes of ``fleet`` (see :meth:`find_pools`)."""
        self._here = {}
        here = [n for n in fleet.nodes if is_this_machine(n.address)]
        if not any(n.devices for n in here) and not read_nvml().devices:
            # Nothing declared here and no NVIDIA GPU: host RAM alone, as always, without
            # running llama-server before the run has even bound its port.
            return ()
        binary = None
        with contextlib.suppress(AdapterError):  # no llama.cpp here: NVML, the fleet file
            binary = find_llama_server()
        said: list[str] = []
        for node in here:
            found, notes = probe_pools(node, binary, own_pids)
            self._here[node.name] = found
            said.extend(found.warnings)
            if node.devices:
                said.extend(notes)
        has_devices = any(p.devices() for p in self._here.values())
        if binary is not None and (has_devices or any(n.devices for n in fleet.nodes)):
            self.fit_flag = server_lists_fit(binary)
        return tuple(dict.fromkeys(said))

    async def probe_agents(
        self, fleet: Fleet, agents: Mapping[str, AgentBackends]
    ) -> tuple[str, ...]:
        """Ask each of ``agents`` (node -> its joined agent) for its node's pools, probed on
        its machine (``AgentBackends.pools``, all at once, each within
        ``AGENT_PROBE_TIMEOUT_S``), where that agent has not probed the node as ``fleet``
        declares it yet; the next :meth:`find_pools` counts them. A node whose agent is lost
        or gone is planned from its declared devices again. Returns what a person should
        read: the probes' warnings (one per declared device no probe saw there, naming the
        node), why a probe could not run where devices are declared, and an agent that
        could not be asked (its declared devices are used; it is asked again at the next
        plan). Raises nothing for an agent that cannot answer."""
        live = {n: a for n, a in agents.items() if a.lost_reason is None}
        for name in [n for n, (agent, _, _) in self._by_agent.items() if live.get(n) is not agent]:
            del self._by_agent[name]
        asked: list[tuple[str, AgentBackends, Node]] = []
        for node in fleet.nodes:
            agent = live.get(node.name)
            known = self._by_agent.get(node.name)
            if agent is not None and (known is None or known[1] != node):
                asked.append((node.name, agent, node))
        results = await asyncio.gather(
            *(self._ask(agent, node) for _, agent, node in asked), return_exceptions=True
        )
        said: list[str] = []
        for (name, agent, node), result in zip(asked, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, (RosterdError, TimeoutError)):
                    raise result
                self._by_agent.pop(name, None)
                why = str(result) or f"no answer within {AGENT_PROBE_TIMEOUT_S:g} s"
                said.append(
                    f"node {name}: its agent could not probe its devices ({why}); "
                    "its declared devices are used"
                )
                continue
            self._by_agent[name] = (agent, node, result.pools)
            said.extend(result.pools.warnings)
            said.extend(result.notes)
        return tuple(dict.fromkeys(said))

    @staticmethod
    async def _ask(agent: AgentBackends, node: Node) -> ProbedPools:
        async with asyncio.timeout(AGENT_PROBE_TIMEOUT_S):
            return await agent.pools(node)

    def counted(self, fleet: Fleet) -> Fleet:
        """``fleet`` with each node's devices as counted (:func:`with_counted_devices`)."""
        pools = self.pools or {}
        return dataclasses.replace(
            fleet,
            nodes=tuple(
                with_counted_devices(n, pools[n.name]) if n.name in pools else n
                for n in fleet.nodes
            ),
        )

    def needs(
        self, memory: MemoryFigures, fleet: Fleet, specs: Sequence[InferenceSpec]
    ) -> dict[str, DeviceNeed] | None:
        """Role -> what it needs on a device, when ``fleet`` has devices (``None``: none)."""
        if not any(n.devices for n in fleet.nodes) or not isinstance(memory, RosterMemory):
            return None
        return device_needs(memory, fleet, {s.role: s.model for s in specs})

    def place(
        self,
        specs: Sequence[InferenceSpec],
        fleet: Fleet,
        node_plan: Plan,
        needs: Mapping[str, DeviceNeed] | None,
    ) -> Plan:
        """Place the roles that use a device on one (``fleet`` as :meth:`counted`); the plan
        less the roles no device could take, and the device plan kept for :meth:`serving`."""
        if needs is None:
            self.plan = None
            return node_plan
        self.plan = place_on_devices(specs, fleet, node_plan, needs, self.plan)
        return self.plan.plan

    def serving(self, serving: NodeServing) -> NodeServing:
        """``serving`` with its node's device pools, as the latest plan placed its roles."""
        pools = self.plan.pools.get(serving.name) if self.plan is not None else None
        if not pools:
            return serving
        found = {p.id: p for p in (self.pools or {}).get(serving.name, NodePools(())).pools}
        devices = {}
        for device, pool in pools.items():
            seen = found.get(device)
            devices[device] = DevicePool(
                pool.capacity_bytes,
                {r: b for r, b in pool.bytes_by_role.items() if r in serving.specs},
                declared_bytes=seen.declared_bytes if seen is not None else None,
                probed_total_bytes=seen.probed_total_bytes if seen is not None else None,
                source=seen.source if seen is not None else "declared",
            )
        return dataclasses.replace(serving, devices=devices)

    def replicas(self) -> dict[str, object]:
        """``/status``'s ``replicas`` (role -> where each copy runs) where a node holds
        several copies of a role, each on a device of its own (``box (CUDA0)``, ``box
        (CUDA1)``: :meth:`DevicePlan.copy_places`); empty otherwise, so the fleet's view
        (plain node names) stands."""
        plan = self.plan
        if plan is None:
            return {}
        places = {role: plan.copy_places(role) for role in plan.plan.copies}
        if all(len(set(plan.plan.nodes_of(r))) == len(plan.plan.nodes_of(r)) for r in places):
            return {}
        return {"replicas": places}

    def pins(self, serving: NodeServing) -> dict[str, tuple[str, ...]]:
        """Role -> its pinned llama-server flags on ``serving``'s node (none without devices):
        its device and offload (``--device CUDA0 -ngl 999``; ``--device none -ngl 0``: the
        CPU alone on a node with devices, and for a role placed on a declared device that
        the node's llama-server does not list, which its ``--device`` would refuse) and
        ``--fit off`` where the build lists it."""
        if self.plan is None or serving.name not in self.plan.pools:
            return {}
        pins: dict[str, tuple[str, ...]] = {}
        found = (self.pools or {}).get(serving.name, NodePools(()))
        for role, spec in serving.specs.items():
            if spec.flavor.facts.devices is not DeviceUse.ANY_DEVICE:
                continue  # a Mac's GPU share (mlx_lm) or none: nothing to pin
            choice = self.plan.device_of(role, serving.name)
            if choice is None:
                continue
            if choice.device is not None and not found.lists(choice.device):
                # Declared, but this node's llama-server lists no such device and would
                # refuse --device: the role runs on the CPU, counted where it was placed.
                pins[role] = pinned_args(None, None, fit_flag=self.fit_flag)
            else:
                pins[role] = pinned_args(choice.device, choice.gpu_layers, fit_flag=self.fit_flag)
        return pins
