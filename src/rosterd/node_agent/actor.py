"""The node agent's body (beside DESIGN.md layer 5, the supervisor): one node's backends,
run on that node.

A fleet node that is not this machine is run by a :class:`NodeAgent`: a Ray
actor pinned to the node's Ray node (see ``rosterd.ray_cluster``) that runs the
node exactly as ``rosterd up`` runs this machine's nodes: a
:class:`~rosterd.backends.node_host.NodeHost` (the state folder's lock, a
supervisor, leftovers reaped) and its ``SupervisorBackends``. Backends listen on
the node's address, so the router reaches them over HTTP directly: control
goes through Ray, request and stream bytes never do. A rosterd error raised on
the node (``WeightsError``, ``PortInUseError``, ``BackendStartError`` ...)
crosses Ray as a :class:`CarriedError`, which the head
(:mod:`rosterd.node_agent.head`) raises as itself, same class and attributes.

The agent also reads its node's devices for the head (issue 29): :meth:`NodeAgent.pools`
probes them there (``llama-server --list-devices`` and NVML, as ``rosterd up`` probes its
own machine: :func:`rosterd.devices.probe.probe_node`) and :meth:`NodeAgent.device_bytes`
reads what each of its backends holds on each device: on an NVIDIA GPU by NVML, per
process, and on any device as each llama.cpp backend's own log reports it allocated there
(``SupervisorBackends.reported_device_bytes``), and on a Mac each backend's physical
footprint in the GPU share (``phys_footprint``), the larger where two give one. Both run off the
actor's event loop and answer plain picklable values.

``NodeAgent`` does not import Ray: ``rosterd.ray_cluster`` makes it an actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, ParamSpec, TypeVar

from rosterd.backends.interface import Endpoint
from rosterd.backends.kv_keep import DEFAULT_KV_DISK_BYTES
from rosterd.backends.local import SupervisorBackends
from rosterd.backends.node_host import NodeHost, ServingFacts, weights_resolver
from rosterd.devices.footprint import footprints_by_roles, read_phys_footprints
from rosterd.devices.load_buffers import largest_per_device
from rosterd.devices.nvml import held_by_roles, read_nvml
from rosterd.devices.pools import METAL_DEVICE, NodePools
from rosterd.devices.probe import probe_node
from rosterd.errors import CarriedError, NodeAgentError, RosterdError
from rosterd.fleet.model import Node
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, ProbeResult, default_state_dir

#: How long one pull of the agent's backend events waits for one to happen (seconds).
EVENT_POLL_S: Final[float] = 5.0

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True)
class AgentConfig:
    """What a node agent needs to run one fleet node's roles (sent to the node as is).

    ``node``: the fleet node's name; ``host``: the address its backends listen on
    (the node's ``address``); ``specs``: role -> spec of the roles planned on it;
    ``facts``: how its weights are found and its shared-server models named
    (``ServingFacts``; resolved on the node); ``state_root``: the folder under
    which the agent keeps ``nodes/<node>/`` (``None``: the node's
    ``default_state_dir``); ``auto_ports``, ``ready_timeout_s`` (seconds): as
    ``SupervisorBackends``; ``grace_s``: SIGTERM to SIGKILL, seconds; ``kv_disk_bytes``:
    the disk the node's kept KV caches may take (``rosterd up --kv-disk-gb``, the same
    budget for every node).
    """

    node: str
    host: str
    specs: Mapping[str, InferenceSpec]
    facts: ServingFacts
    state_root: str | None = None
    auto_ports: bool = False
    ready_timeout_s: float | None = None
    grace_s: float = 10.0
    kv_disk_bytes: int = DEFAULT_KV_DISK_BYTES


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """An opened agent: its ``node``, its process ``pid`` and ``state_dir`` on the node, the
    ``reaped`` pids of backends an earlier run had left there, and ``kv_disk_bytes``: the
    budget its kept KV caches were given."""

    node: str
    pid: int
    state_dir: str
    reaped: tuple[int, ...]
    kv_disk_bytes: int = DEFAULT_KV_DISK_BYTES


@dataclass(frozen=True, slots=True)
class ProbedPools:
    """A node's pools as its agent probed them on the node (:meth:`NodeAgent.pools`):
    ``pools``: the node's declared devices merged with what ``llama-server --list-devices``
    and NVML found there (``rosterd.devices.pools.node_pools``; its ``warnings``: one per
    declared device no probe saw); ``notes``: why a probe could not run there, where the
    node declares devices."""

    pools: NodePools
    notes: tuple[str, ...] = ()


def _carry_errors(
    method: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Raise a rosterd error of ``method`` as a :class:`CarriedError`, so it crosses Ray whole."""

    @functools.wraps(method)
    async def carrying(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await method(*args, **kwargs)
        except CarriedError:
            raise
        except RosterdError as err:
            raise CarriedError(err) from None

    return carrying


class NodeAgent:
    """One fleet node's backends, run on that node (the body of the Ray actor).

    Call :meth:`open` first (lock the state folder ``<state_root>/nodes/<node>``,
    reap the backends an earlier run left there). :meth:`start`/:meth:`stop`
    are ``SupervisorBackends``' on this node; every ``BackendEvent`` the
    supervisor emits is kept until :meth:`next_events` hands it out. All
    methods run on one event loop (the actor's), which lives as long as the
    agent's process: the backends' parent-death signal is tied to it, so they
    die with the agent. Errors: rosterd errors come out as :class:`CarriedError`.
    """

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        root = Path(config.state_root) if config.state_root else default_state_dir()
        self.state_dir = root / "nodes" / config.node
        self._events: list[BackendEvent] = []
        self._arrived = asyncio.Event()
        self._host: NodeHost | None = None
        self._backends: SupervisorBackends | None = None

    @_carry_errors
    async def open(self) -> AgentInfo:
        """Lock the state folder, reap leftovers, get ready to start backends (idempotent).

        Raises (carried): ``StateDirLockedError`` when another rosterd runs this
        node from the same folder.
        """
        config = self.config
        if self._host is None:
            host = NodeHost(
                self.state_dir,
                grace_s=config.grace_s,
                on_event=self._record,
                auto_ports=config.auto_ports,
                ready_timeout_s=config.ready_timeout_s,
                kv_disk_bytes=config.kv_disk_bytes,
            )
            await host.open()
            self._host = host
            self._backends = host.backends(config.node, config.host, config.specs, config.facts)
        return AgentInfo(
            config.node,
            os.getpid(),
            str(self.state_dir),
            self._host.reaped,
            self._host.kv.disk_budget_bytes,
        )

    @_carry_errors
    async def add_roles(self, specs: Mapping[str, InferenceSpec]) -> None:
        """Run the roles ``specs`` (role -> spec) on this node too, from now on (a re-plan
        moved them here); a role already known takes the new spec for its next start."""
        self._opened().add_specs(specs)

    @_carry_errors
    async def reconfigure(
        self,
        specs: Mapping[str, InferenceSpec],
        facts: ServingFacts,
        pins: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """Serve a reloaded configuration from now on: the roles ``specs`` (role -> spec)
        too, weights found and shared-server models named by ``facts`` (a reload on the
        head), and ``pins``: role -> the llama-server flags that pin it to its device (the
        head's device plan: ``--device CUDA0 -ngl 999 --fit off``; ``None``: unchanged). A
        role running now keeps its process; its next start takes the new spec and pins."""
        backends = self._opened()
        self.config = replace(self.config, specs={**self.config.specs, **specs}, facts=facts)
        backends.reconfigure(specs, weights_resolver(facts), facts.model_names)
        if pins is not None:
            backends.pins = dict(pins)

    @_carry_errors
    async def start(self, role: str) -> Endpoint:
        """Start ``role``'s backend on this node and return once it is ready.

        Raises (carried): as ``SupervisorBackends.start`` (``WeightsError``,
        ``PortInUseError``, ``BackendStartError`` ...).
        """
        return await self._opened().start(role)

    @_carry_errors
    async def stop(self, role: str) -> None:
        """Stop ``role``'s backend; returns after its process exited (a start under way fails)."""
        await self._opened().stop(role)

    @_carry_errors
    async def probe(self, role: str, timeout_s: float) -> ProbeResult:
        """The adapter's generation probe against ``role``'s backend on this node."""
        return await self._opened().probe(role, timeout_s=timeout_s)

    @_carry_errors
    async def restart(self, role: str) -> None:
        """Kill ``role``'s backend on this node; its supervisor starts it again."""
        await self._opened().restart(role)

    @_carry_errors
    async def close(self) -> None:
        """Stop every backend (returns once all exited) and release the state folder."""
        if self._host is not None:
            await self._host.close()

    async def measured_bytes(self) -> dict[str, int]:
        """Backend name -> resident memory (RSS, bytes) of it and its children, measured now."""
        if self._host is None:
            return {}
        supervisor = self._host.supervisor
        measured = {name: supervisor.measured_bytes(name) for name in supervisor.names()}
        return {name: rss for name, rss in measured.items() if rss is not None}

    async def peak_rss_bytes(self) -> dict[str, int]:
        """Role -> the largest peak RSS (bytes) of its backend on this node so far
        (``rosterd.backends.interface.PeakSource``)."""
        if self._backends is None:
            return {}
        return await self._backends.peak_rss_bytes()

    async def pools(self, node: Node) -> ProbedPools:
        """``node``'s pools (``node``: this agent's fleet node, as the head's fleet file
        declares it) probed on this machine, off the event loop (a few seconds at most:
        ``llama-server --list-devices``, NVML), as ``rosterd up`` probes its own machine's
        nodes (:func:`~rosterd.devices.probe.probe_node`); what this agent's backends hold
        on a GPU is not counted as others'. Never raises for a missing binary, driver or GPU.
        """
        own_pids = frozenset((await self.backend_pids()).values())
        found, notes = await asyncio.to_thread(probe_node, node, own_pids)
        return ProbedPools(found, notes)

    async def device_bytes(self) -> dict[str, dict[str, int]]:
        """Role -> device id (``CUDA0``, ``ROCm0``, ``MTL0``, ...) -> bytes its backend holds
        on that device of this node now: NVML's per-process figure on an NVIDIA GPU, what its
        log says it allocated there as it loaded on any device, and on a Mac its physical
        footprint (``phys_footprint``, counted on ``MTL0``, the GPU share:
        :func:`~rosterd.devices.footprint.read_phys_footprints`), the larger where two give
        one (read off the event loop); ``{}`` with no backend running, or none on a device.
        The head names the share as its node's pool does (``Metal`` on older builds)."""
        pids = await self.backend_pids()
        if not pids:
            return {}
        held = held_by_roles(await asyncio.to_thread(read_nvml), pids)
        reported = await self._backends.reported_device_bytes() if self._backends else {}
        footprints = await asyncio.to_thread(read_phys_footprints, tuple(pids.values()))
        on_share = footprints_by_roles(footprints, pids, METAL_DEVICE)
        return largest_per_device(held, reported, on_share)

    async def kept_kv(self) -> dict[str, dict[str, object]]:
        """Role -> what this node keeps of its KV cache (``SupervisorBackends.kept_kv``:
        tokens, bytes, the last restore's result, counts), for every role of the node."""
        backends = self._backends
        if backends is None:
            return {}
        kept = {role: backends.kept_kv(role) for role in backends.specs}
        return {role: view.as_json() for role, view in kept.items() if view is not None}

    async def backend_pids(self) -> dict[str, int]:
        """Backend name -> its current process id on this node."""
        if self._host is None:
            return {}
        supervisor = self._host.supervisor
        backends = (supervisor.backend(name) for name in supervisor.names())
        return {b.name: b.pid for b in backends if b is not None}

    async def next_events(self, timeout_s: float = EVENT_POLL_S) -> list[BackendEvent]:
        """The backend events since the last call, oldest first; waits up to ``timeout_s``
        seconds for one when there is none (an empty list then)."""
        if not self._events:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
        events, self._events = self._events, []
        self._arrived.clear()
        return events

    def _record(self, event: BackendEvent) -> None:
        self._events.append(event)
        self._arrived.set()

    def _opened(self) -> SupervisorBackends:
        if self._backends is None:
            node = self.config.node
            raise NodeAgentError(node, f"the agent of node {node} is not open")
        return self._backends
