"""The fleet on a Ray cluster (beside DESIGN.md layer 5, with ``node_agent``): join, match, pin.

``rosterd up --ray-address HOST:PORT`` joins a Ray cluster the lab started
(``ray start --head`` on one machine, ``ray start --address`` on the others)
with :func:`connect_fleet`, which never starts a cluster of its own. Each fleet
node is matched to the live Ray node whose IP (Ray's ``NodeManagerAddress``)
is the node's ``address`` (``rosterd.ray_match.match_fleet``, pure); a fleet node without
exactly one live Ray node there is reported not connected, with why.
:meth:`RayFleet.start_agent` runs a node's :class:`~rosterd.node_agent.NodeAgent`
as a Ray actor pinned to that Ray node (hard node affinity: it runs there or
not at all; ``num_cpus=0``: it holds no CPU a task could use; no restarts: a
restarted agent would not own the backends its predecessor took with it), and
returns the node's backends boundary. :meth:`RayFleet.watch` polls the Ray
nodes' ``Alive`` flags and reports a lost node (so does an agent found dead).

Agents are owned by the process that connected (Ray's default lifetime), so
they, and through the parent-death signal their backends, end with it. Every
node needs the same rosterd and Ray versions installed (Ray's rule for a
cluster). Library choice: Ray, the ``ray`` extra, imported only when a
function here is called; without it :func:`import_ray` raises
``RayNotInstalledError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, Final

from rosterd.errors import (
    ClusterConnectError,
    ClusterError,
    NodeAgentError,
    RayNotInstalledError,
    RosterdError,
)
from rosterd.fleet import Fleet
from rosterd.node_agent import AgentBackends, AgentConfig, AgentInfo, NodeAgent, map_ray_errors
from rosterd.ray_match import NodeConnection, NodeLost, RayNode, match_fleet, node_addresses
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent

#: What a user is told when a Ray fleet is asked for without the extra.
RAY_MISSING: Final[str] = "Ray is not installed: pip install 'rosterd[ray]'"
#: How long the cluster's address is given to accept a TCP connection before joining (seconds).
CONNECT_CHECK_S: Final[float] = 5.0
#: How often :meth:`RayFleet.watch` looks at the Ray nodes (seconds).
WATCH_POLL_S: Final[float] = 1.0


def import_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        RayNotInstalledError: Ray is not installed (the message says how to get it).
    """
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise RayNotInstalledError(RAY_MISSING) from None


def list_ray_nodes() -> tuple[RayNode, ...]:
    """The nodes of the joined Ray cluster, alive and dead (``ray.nodes()``; blocks briefly).

    Raises:
        ClusterError: not connected, or Ray failed to answer.
    """
    ray = import_ray()
    try:
        listed: list[dict[str, Any]] = ray.nodes()
    except Exception as exc:  # Ray raises plain RuntimeError/grpc errors here
        raise ClusterError(f"cannot list the Ray cluster's nodes: {exc}") from exc
    return tuple(
        RayNode(
            node_id=str(n.get("NodeID", "")),
            address=str(n.get("NodeManagerAddress", "")),
            alive=bool(n.get("Alive", False)),
            hostname=str(n.get("NodeManagerHostname", "")),
            death_reason=str(n.get("DeathReasonMessage", "") or ""),
        )
        for n in listed
    )


def _check_reachable(address: str) -> None:
    """Refuse a bad or unreachable ``host:port`` at once (``ray.init`` would retry for minutes)."""
    if "://" in address:
        raise ClusterConnectError(
            f"--ray-address {address}: give the Ray cluster's address as HOST:PORT "
            "(the one `ray start --head` prints), not a URL"
        )
    if address == "auto":
        return  # the cluster this machine joined with `ray start`; Ray finds it
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ClusterConnectError(
            f"--ray-address {address}: expected HOST:PORT, e.g. 192.168.1.10:6379"
        )
    if host in ("localhost", "127.0.0.1", "::1"):
        return  # Ray itself replaces these by this machine's node IP before connecting
    try:
        with socket.create_connection((host, int(port_text)), timeout=CONNECT_CHECK_S):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ClusterConnectError(
            f"cannot reach the Ray cluster at {address}: {why}; "
            "is `ray start --head` running there, and is the port open?"
        ) from None


def ray_address(option: str | None, environ: Mapping[str, str]) -> str | None:
    """The Ray cluster to join: ``--ray-address`` (``option``), else ``RAY_ADDRESS`` from
    ``environ``; ``None`` (blank counts as unset) means no Ray: serve this machine alone."""
    for given in (option, environ.get("RAY_ADDRESS")):
        if given is not None and given.strip():
            return given.strip()
    return None


def connect_fleet(
    address: str,
    fleet: Fleet,
    *,
    resolve: Callable[[str], Sequence[str]] = node_addresses,
) -> RayFleet:
    """Join the Ray cluster at ``address`` and match ``fleet``'s nodes to its nodes.

    ``address``: ``HOST:PORT`` of the cluster's head (``--ray-address`` or
    ``RAY_ADDRESS``), or ``auto`` (the cluster this machine joined). A cluster
    is never started here. Joining twice in one process reuses the first
    connection. ``resolve``: a fleet address -> its IPs (default
    :func:`node_addresses`). Blocks while joining (seconds): call it from the
    main thread before serving; the process's SIGTERM handler is left as it
    was. The connections are in :attr:`RayFleet.connections`.

    Raises:
        RayNotInstalledError: the ``ray`` extra is not installed.
        ClusterConnectError: the address is malformed, unreachable, or Ray refused it.
    """
    ray = import_ray()
    if not ray.is_initialized():
        _check_reachable(address)
        # ray.init sets its own SIGTERM handler (exit at once); rosterd drains first.
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            ray.init(
                address=address,
                ignore_reinit_error=True,
                logging_level=logging.WARNING,
                log_to_driver=False,  # the agents' own output stays in Ray's logs
            )
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise ClusterConnectError(f"cannot join the Ray cluster at {address}: {exc}") from exc
        finally:
            if main:
                signal.signal(signal.SIGTERM, sigterm)
    nodes = list_ray_nodes()
    addresses = {node.name: tuple(resolve(node.address)) for node in fleet.nodes}
    return RayFleet(fleet, match_fleet(fleet, nodes, addresses), addresses)


@functools.cache
def _agent_actor_class() -> Any:
    """``NodeAgent`` as a Ray actor class (made once, when first needed)."""
    ray = import_ray()

    class RayNodeAgent(NodeAgent):
        async def ray_node_id(self) -> str:
            """The Ray node this agent runs on (hex)."""
            return str(ray.get_runtime_context().get_node_id())

    return ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(RayNodeAgent)


class RayFleet:
    """The fleet's nodes on a joined Ray cluster: connections, agents, loss.

    ``connections``: per fleet node (fleet order; then any node a reload left out
    whose agent still runs), whether it is connected and why (see
    :func:`match_fleet`); ``addresses``: node -> the IPs its address resolved to.
    ``lost``: node -> :class:`NodeLost` for every node lost so far. Use from one
    event loop.
    """

    def __init__(
        self,
        fleet: Fleet,
        connections: Sequence[NodeConnection],
        addresses: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.fleet = fleet
        #: Fleet node -> the IPs its address resolved to (for :meth:`back`).
        self.addresses: dict[str, Sequence[str]] = dict(addresses or {})
        self.connections = tuple(connections)
        self.lost: dict[str, NodeLost] = {}
        self._agents: dict[str, AgentBackends] = {}
        self._on_lost: Callable[[NodeLost], None] | None = None
        self._back: set[str] = set()  # lost nodes whose Ray node was seen live again

    def connection(self, node: str) -> NodeConnection:
        """The connection of fleet node ``node``; raises ``KeyError`` for an unknown name."""
        for conn in self.connections:
            if conn.node == node:
                return conn
        raise KeyError(node)

    def refit(
        self, fleet: Fleet, *, resolve: Callable[[str], Sequence[str]] = node_addresses
    ) -> None:
        """Take ``fleet`` (a reloaded fleet file) as the fleet from now on, matched to the
        cluster's nodes again (blocks briefly: it lists them, as :func:`connect_fleet`).

        A node with a running agent keeps its connection (its agent goes on); every
        other node is matched again, so a node the reload added, one not connected
        before, or one lost whose Ray node is live again, runs once its Ray node is
        there (a lost node is taken back with :meth:`forget_lost`).

        Raises:
            ClusterError: a node with a running agent has a new address (its agent
                runs at the old one: that needs a restart of ``rosterd up``).
        """
        running = set(self._agents) - set(self.lost)
        kept = {c.node: c for c in self.connections if c.node in running}
        for node in fleet.nodes:
            old = kept.get(node.name)
            if old is not None and old.address != node.address:
                raise ClusterError(
                    f"node {node.name} is on Ray at {old.address}; its new address "
                    f"{node.address} takes effect when rosterd up restarts"
                )
        addresses = {n.name: tuple(resolve(n.address)) for n in fleet.nodes if n.name not in kept}
        fresh = {c.node: c for c in match_fleet(fleet, list_ray_nodes(), addresses)}
        names = {n.name for n in fleet.nodes}
        # A node left out of the fleet whose agent still runs (it drains) keeps its own.
        agents_left = tuple(c for c in self.connections if c.node in set(self._agents) - names)
        self.fleet = fleet
        self.addresses = {**self.addresses, **addresses}
        self.connections = (
            *(kept.get(n.name) or fresh[n.name] for n in fleet.nodes),
            *agents_left,
        )

    async def drop_agent(self, node: str) -> None:
        """End ``node``'s agent (its backends stop) and forget it: a refused reload started it."""
        agent = self._agents.pop(node, None)
        if agent is not None:
            await agent.close()

    def forget_lost(self, node: str) -> None:
        """Take lost ``node`` back (its Ray node is live again, :meth:`refit` matched it):
        its dead agent is dropped, so :meth:`start_agent` may start a new one there."""
        self.lost.pop(node, None)
        self._agents.pop(node, None)
        self._back.discard(node)

    def restore_lost(self, node: str, lost: NodeLost | None, agent: AgentBackends | None) -> None:
        """Undo :meth:`forget_lost` (a reload that took ``node`` back was refused)."""
        if lost is not None:
            self.lost[node] = lost
            self._back.add(node)  # said already: the next reload (or rosterd reload) retries
        if agent is not None:
            self._agents[node] = agent

    def back(self, ray_nodes: Sequence[RayNode]) -> list[str]:
        """The lost nodes a live Ray node in ``ray_nodes`` now has the address of (not said
        before): each is said once, until :meth:`forget_lost` takes it back (pure
        matching, as :func:`match_fleet` without resolving names)."""
        lost = [n for n in self.fleet.nodes if n.name in self.lost and n.name not in self._back]
        if not lost:
            return []
        fleet = dataclasses.replace(self.fleet, nodes=tuple(lost))
        addresses = {n.name: self.addresses[n.name] for n in lost if n.name in self.addresses}
        found = [c.node for c in match_fleet(fleet, ray_nodes, addresses) if c.connected]
        self._back.update(found)
        return found

    @property
    def agents(self) -> Mapping[str, AgentBackends]:
        """Node name -> the backends of its running agent."""
        return dict(self._agents)

    async def start_agent(
        self,
        node: str,
        specs: Mapping[str, InferenceSpec],
        *,
        repos: Mapping[str, str | None] | None = None,
        model_names: Mapping[str, str] | None = None,
        on_event: Callable[[BackendEvent], None] | None = None,
        state_root: str | None = None,
        auto_ports: bool = False,
        ready_timeout_s: float | None = None,
        grace_s: float = 10.0,
    ) -> AgentBackends:
        """Run ``node``'s agent on its Ray node and return the node's backends boundary.

        ``specs``: role -> spec of the roles planned on it; ``repos``: role ->
        roster repo (weights are resolved on the node with the fleet's
        ``models``); ``model_names``: role -> the roster's ``name`` (``AgentConfig``);
        ``on_event``: hears its backend events (wire it where
        ``Supervisor(on_event=...)`` goes); ``state_root``: the folder on the
        node under which ``nodes/<node>/`` keeps logs and pid records
        (``None``: that machine's ``$XDG_STATE_HOME/rosterd``); ``auto_ports``,
        ``ready_timeout_s``, ``grace_s`` (seconds): as for local backends.
        Backends listen on the node's ``address``. Returns once the agent has
        locked its state folder and reaped what an earlier run left there.

        Raises:
            ClusterError: the node is not connected (the reason), or already has an agent.
            NodeLostError / NodeAgentError: the agent could not be started there.
            StateDirLockedError: another rosterd runs this node from that folder.
        """
        conn = self.connection(node)
        if conn.ray_node_id is None:
            raise ClusterError(f"node {node} is not connected to the Ray cluster: {conn.reason}")
        if node in self._agents:
            raise ClusterError(f"node {node} already has an agent")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        config = AgentConfig(
            node=node,
            host=self.fleet.node(node).address,
            specs=dict(specs),
            fleet=self.fleet,
            repos=dict(repos or {}),
            model_names=dict(model_names or {}),
            state_root=state_root,
            auto_ports=auto_ports,
            ready_timeout_s=ready_timeout_s,
            grace_s=grace_s,
        )
        with map_ray_errors(node):
            actor = (
                _agent_actor_class()
                .options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(conn.ray_node_id, soft=False)
                )
                .remote(config)
            )
        backends = AgentBackends(node, actor, on_event=on_event, on_lost=self._node_lost)
        try:
            where: str = await backends.call(actor.ray_node_id.remote())
            if where != conn.ray_node_id:  # hard affinity makes this impossible; say so if not
                raise NodeAgentError(node, f"the agent of node {node} runs on Ray node {where}")
            info: AgentInfo = await backends.call(actor.open.remote())
        except BaseException:
            await backends.close()
            raise
        backends.info = info
        backends.start_events()
        self._agents[node] = backends
        return backends

    async def watch(
        self,
        on_lost: Callable[[NodeLost], None] | None = None,
        *,
        on_back: Callable[[str], None] | None = None,
        poll_s: float = WATCH_POLL_S,
    ) -> None:
        """Report lost nodes until cancelled: every ``poll_s`` seconds, a node whose Ray node
        is no longer alive (or no longer listed) is lost; so is one whose agent died.

        ``on_lost`` hears each loss once (losses found before the call, too); the
        node's backends then act as ``AgentBackends.lost`` says. ``on_back`` hears
        once the name of each lost node whose address a live Ray node has again
        (:meth:`back`). A failed look at the cluster is tried again at the next poll.
        """
        self._on_lost = on_lost
        if on_lost is not None:
            for event in list(self.lost.values()):
                on_lost(event)
        while True:
            with contextlib.suppress(RosterdError):
                ray_nodes = await asyncio.to_thread(list_ray_nodes)
                self.check(ray_nodes)
                if on_back is not None:
                    for node in self.back(ray_nodes):
                        on_back(node)
            await asyncio.sleep(poll_s)

    def check(self, ray_nodes: Sequence[RayNode]) -> None:
        """Take as lost every node with an agent whose Ray node is not alive (or not listed)
        in ``ray_nodes`` (what :meth:`watch` does at each poll; a lost node stays lost)."""
        by_id = {rn.node_id: rn for rn in ray_nodes}
        known = {c.node: c for c in self.connections}
        for node, backends in list(self._agents.items()):
            conn = known.get(node)
            if conn is None:
                continue  # an agent a refused reload started and is closing
            rn = by_id.get(conn.ray_node_id or "")
            if rn is None or not rn.alive:
                why = f": {rn.death_reason}" if rn is not None and rn.death_reason else ""
                backends.lost(
                    f"node {node} is lost: its Ray node at {conn.address} is no longer alive{why}"
                )

    async def close(self) -> None:
        """Stop every agent's backends and end the agents (concurrently); returns once done.

        The connection to Ray stays (:func:`disconnect` ends it).
        """
        agents, self._agents = list(self._agents.values()), {}
        await asyncio.gather(*(a.close() for a in agents))

    def _node_lost(self, node: str, reason: str) -> None:
        if node in self.lost:
            return
        event = NodeLost(node, self.connection(node).ray_node_id or "", reason)
        self.lost[node] = event
        if self._on_lost is not None:
            self._on_lost(event)


def disconnect() -> None:
    """Leave the Ray cluster (``ray.shutdown()``): the agents this process owns end with it.

    Does nothing when Ray is not installed or not joined.
    """
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
