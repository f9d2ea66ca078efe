"""A Ray cluster for the fleet (beside DESIGN.md layer 5, with ``node_agent``): join, match, pin.

``rosterd up --ray-address HOST:PORT`` joins a Ray cluster the lab started
(``ray start --head`` on one machine, ``ray start --address`` on the others)
with :func:`join_async`, which never starts a cluster of its own, and gives up
after a deadline (Ray's own join retries an address that is no head for minutes).
:meth:`RayCluster.connections` matches each fleet node to the live Ray node
whose IP (Ray's ``NodeManagerAddress``) is the node's ``address``
(``rosterd.ray_match.match_fleet``, pure); a fleet node without exactly one live
Ray node there is not connected, with why. :meth:`RayCluster.start_agent` runs a
node's :class:`~rosterd.node_agent.NodeAgent` as a Ray actor pinned to that Ray
node (hard node affinity: it runs there or not at all; ``num_cpus=0``: it holds
no CPU a task could use; no restarts: a restarted agent would not own the
backends its predecessor took with it), and returns the node's backends
boundary. :meth:`RayCluster.watch` hands each look at the cluster's nodes (their
``Alive`` flags: Ray's own node-death signal) to its caller. Which nodes run,
which are lost and which agents run is the fleet scheduler's to know
(``rosterd.fleet_scheduler``), not this module's.

Agents are owned by the process that connected (Ray's default lifetime), so
they, and through the parent-death signal their backends, end with it. Every
node needs the same rosterd and Ray versions installed (Ray's rule for a
cluster). Library choice: Ray, the ``ray`` extra, imported only when a
function here is called; without it :func:`import_ray` raises
``RayNotInstalledError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import logging
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
from rosterd.fleet.addresses import node_addresses
from rosterd.node_agent import AgentBackends, AgentConfig, AgentInfo, NodeAgent, map_ray_errors
from rosterd.ray_match import NodeConnection, RayNode, match_fleet
from rosterd.supervisor import BackendEvent

#: What a user is told when a Ray fleet is asked for without the extra.
RAY_MISSING: Final[str] = (
    "Ray is not installed: pip install '.[ray]' in rosterd's checkout (rosterd is not on PyPI)"
)
#: How long the cluster's address is given to accept a TCP connection before joining (seconds).
CONNECT_CHECK_S: Final[float] = 5.0
#: How long joining the cluster may take by default (``--ray-join-timeout``), seconds: Ray
#: joins a live head in a few seconds, and retries an address that is no head for minutes.
JOIN_TIMEOUT_S: Final[float] = 30.0
#: How often :meth:`RayCluster.watch` looks at the Ray nodes (seconds).
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
    """Refuse a bad or unreachable ``host:port`` at once (``ray.init`` would retry for minutes).

    A loopback address is checked like any other: a head started on this machine
    listens there too (Ray's GCS binds every interface), and nothing listening there
    means no cluster to join, said now rather than after Ray's retries.
    """
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


class _NotMainThreadNote(logging.Filter):
    """Drops Ray's note that it set no SIGTERM handler off the main thread: rosterd joins
    off it on purpose (its own handlers stop the run) and the note would only puzzle."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _start_join(address: str) -> concurrent.futures.Future[None]:
    """Run ``ray.init(address)`` in a daemon thread of its own; its outcome as a future.

    Off the caller's thread so that a deadline and signals can end the wait: Ray's
    join retries for minutes on an address that accepts connections but is no Ray
    head, inside calls that no signal interrupts. A daemon thread, so that a join
    given up on never holds the process's exit.
    """
    ray = import_ray()
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()
    worker_log = logging.getLogger("ray._private.worker")

    def init() -> None:
        if not outcome.set_running_or_notify_cancel():
            return
        note = _NotMainThreadNote()
        worker_log.addFilter(note)
        try:
            ray.init(
                address=address,
                ignore_reinit_error=True,
                logging_level=logging.WARNING,
                log_to_driver=False,  # the agents' own output stays in Ray's logs
            )
        except BaseException as exc:  # handed to the waiting caller, whatever it is
            outcome.set_exception(exc)
        else:
            outcome.set_result(None)
        finally:
            worker_log.removeFilter(note)

    threading.Thread(target=init, name="rosterd-ray-join", daemon=True).start()
    return outcome


def _join_error(address: str, exc: BaseException) -> ClusterConnectError:
    if isinstance(exc, TimeoutError):
        return ClusterConnectError(
            f"cannot join the Ray cluster at {address}: no answer within {exc.args[0]:g} s "
            "(--ray-join-timeout); is it the port `ray start --head` printed, and is that "
            "head running?"
        )
    return ClusterConnectError(f"cannot join the Ray cluster at {address}: {exc}")


_JOIN_ERRORS = (ConnectionError, RuntimeError, ValueError, TimeoutError)


def join(address: str, *, timeout_s: float = JOIN_TIMEOUT_S) -> RayCluster:
    """Join the Ray cluster at ``address``: ``HOST:PORT`` of the cluster's head
    (``--ray-address`` or ``RAY_ADDRESS``), or ``auto`` (the cluster this machine
    joined), within ``timeout_s`` seconds. A cluster is never started here. Joining
    twice in one process reuses the first connection. Blocks while joining (seconds);
    :func:`join_async` is the same for a running event loop, which keeps taking signals.

    Raises:
        RayNotInstalledError: the ``ray`` extra is not installed.
        ClusterConnectError: the address is malformed or unreachable, Ray refused it, or
            no join completed within ``timeout_s``.
    """
    ray = import_ray()
    if not ray.is_initialized():
        _check_reachable(address)
        try:
            _start_join(address).result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise _join_error(address, TimeoutError(timeout_s)) from None
        except _JOIN_ERRORS as exc:
            raise _join_error(address, exc) from exc
    return RayCluster(address)


async def join_async(address: str, *, timeout_s: float = JOIN_TIMEOUT_S) -> RayCluster:
    """:func:`join` on the running event loop: the loop goes on (its signal handlers run,
    a cancellation ends the wait at once; the join then goes on in its thread, unused).

    Raises:
        RayNotInstalledError, ClusterConnectError: as :func:`join`.
    """
    ray = import_ray()
    if not ray.is_initialized():
        await asyncio.to_thread(_check_reachable, address)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wrap_future(_start_join(address))
        except TimeoutError:
            raise _join_error(address, TimeoutError(timeout_s)) from None
        except _JOIN_ERRORS as exc:
            raise _join_error(address, exc) from exc
    return RayCluster(address)


@functools.cache
def _agent_actor_class() -> Any:
    """``NodeAgent`` as a Ray actor class (made once, when first needed)."""
    ray = import_ray()

    class RayNodeAgent(NodeAgent):
        async def ray_node_id(self) -> str:
            """The Ray node this agent runs on (hex)."""
            return str(ray.get_runtime_context().get_node_id())

    return ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(RayNodeAgent)


class RayCluster:
    """The joined Ray cluster at ``address`` (made by :func:`join`): its nodes, matched to
    a fleet's; node agents started on them; a watch over their ``Alive`` flags.
    ``resolve``: a fleet address -> its IPs (default ``node_addresses``)."""

    def __init__(
        self, address: str, *, resolve: Callable[[str], Sequence[str]] = node_addresses
    ) -> None:
        self.address = address
        self.resolve = resolve

    def connections(
        self, fleet: Fleet
    ) -> tuple[tuple[NodeConnection, ...], dict[str, tuple[str, ...]]]:
        """Each node of ``fleet`` matched to the cluster's live nodes now (fleet order), and
        node -> the IPs its address resolved to (blocks briefly: it lists the nodes).

        Raises:
            ClusterError: the cluster's nodes cannot be listed.
        """
        addresses = {node.name: tuple(self.resolve(node.address)) for node in fleet.nodes}
        return match_fleet(fleet, list_ray_nodes(), addresses), addresses

    async def start_agent(
        self,
        config: AgentConfig,
        ray_node_id: str,
        *,
        on_event: Callable[[BackendEvent], None] | None = None,
        on_lost: Callable[[str, str], None] | None = None,
    ) -> AgentBackends:
        """Run the agent of ``config.node`` on Ray node ``ray_node_id`` and return the node's
        backends boundary (``on_event`` hears its backend events, ``on_lost(node, why)``
        once if it is lost). Returns once the agent has locked its state folder and
        reaped what an earlier run left there.

        Raises:
            NodeLostError / NodeAgentError: the agent could not be started there.
            StateDirLockedError: another rosterd runs this node from that folder.
        """
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = config.node
        with map_ray_errors(node):
            actor = (
                _agent_actor_class()
                .options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False)
                )
                .remote(config)
            )
        backends = AgentBackends(node, actor, on_event=on_event, on_lost=on_lost)
        try:
            where: str = await backends.call(actor.ray_node_id.remote())
            if where != ray_node_id:  # hard affinity makes this impossible; say so if not
                raise NodeAgentError(node, f"the agent of node {node} runs on Ray node {where}")
            info: AgentInfo = await backends.call(actor.open.remote())
        except BaseException:
            await backends.close()
            raise
        backends.info = info
        await backends.refresh_kept()  # what an earlier run kept on the node
        backends.start_events()
        return backends

    async def watch(
        self, look: Callable[[Sequence[RayNode]], None], *, poll_s: float = WATCH_POLL_S
    ) -> None:
        """Hand ``look`` the cluster's nodes, alive and dead, every ``poll_s`` seconds, until
        cancelled (a failed look is tried again at the next poll)."""
        while True:
            with contextlib.suppress(RosterdError):
                look(await asyncio.to_thread(list_ray_nodes))
            await asyncio.sleep(poll_s)


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
