"""Matching fleet nodes to Ray nodes (beside DESIGN.md layer 5, with ``ray_cluster``): the
values of a Ray cluster's nodes and of each fleet node's connection, and the match itself.

:func:`match_fleet` is pure: a fleet node is connected when exactly one live Ray
node has one of its IPs (``rosterd.fleet.addresses.node_addresses`` resolves a
name, before). :func:`lost_agents` and :func:`nodes_back` read what a look at the
cluster says of the nodes with agents and the nodes lost. No Ray import: these are
plain values, so the matching is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rosterd.fleet.model import Fleet, normal_ip


@dataclass(frozen=True, slots=True)
class RayNode:
    """One node of the Ray cluster as ``ray.nodes()`` lists it: ``node_id`` (hex),
    ``address`` (its IP, ``NodeManagerAddress``), ``alive``, ``hostname``, and why it
    died (``death_reason``, empty while alive or when Ray does not say)."""

    node_id: str
    address: str
    alive: bool
    hostname: str = ""
    death_reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeConnection:
    """Whether fleet node ``node`` (at ``address``) runs on the Ray cluster.

    ``ray_node_id`` is the matched Ray node, ``None`` when not connected;
    ``reason`` says which Ray node it is, or why there is none.
    """

    node: str
    address: str
    ray_node_id: str | None
    reason: str

    @property
    def connected(self) -> bool:
        """Whether a live Ray node was matched."""
        return self.ray_node_id is not None


@dataclass(frozen=True, slots=True)
class NodeLost:
    """Fleet node ``node`` was running on Ray node ``ray_node_id`` and is lost: ``reason``."""

    node: str
    ray_node_id: str
    reason: str


def match_fleet(
    fleet: Fleet,
    ray_nodes: Sequence[RayNode],
    addresses: Mapping[str, Sequence[str]] | None = None,
) -> tuple[NodeConnection, ...]:
    """Match each fleet node to the live Ray node at its address (pure; fleet order).

    ``addresses``: fleet node name -> the IPs its address stands for (see
    ``rosterd.fleet.addresses.node_addresses``; default: the address itself, when it is
    an IP).
    A node is connected when exactly one live Ray node has one of those IPs;
    otherwise ``reason`` says whether none is there, only a dead one, several
    (one Ray node per machine is needed to tell them apart), or the address
    is not an IP at all. Two fleet nodes may share one Ray node.
    """
    live: dict[str, list[RayNode]] = {}
    dead: dict[str, list[RayNode]] = {}
    for rn in sorted(ray_nodes, key=lambda n: n.node_id):
        ip = normal_ip(rn.address) or rn.address
        (live if rn.alive else dead).setdefault(ip, []).append(rn)
    live_text = ", ".join(sorted(live)) or "none"
    out: list[NodeConnection] = []
    for node in fleet.nodes:
        if addresses is not None and node.name in addresses:
            ips = [normal_ip(a) or a for a in addresses[node.name]]
        else:
            own = normal_ip(node.address)
            ips = [own] if own is not None else []
        if not ips:
            reason = f"address {node.address} does not resolve to an IP address"
            out.append(NodeConnection(node.name, node.address, None, reason))
            continue
        matches = [rn for ip in ips for rn in live.get(ip, [])]
        if len(matches) == 1:
            rn = matches[0]
            reason = f"Ray node {rn.node_id[:12]} at {rn.address}"
            out.append(NodeConnection(node.name, node.address, rn.node_id, reason))
            continue
        shown = "/".join(ips) if len(ips) > 1 else ips[0]
        if matches:
            reason = (
                f"{len(matches)} live Ray nodes have address {shown}; rosterd tells nodes "
                "apart by IP, so run one Ray node per address"
            )
        elif any(ip in dead for ip in ips):
            reason = f"the Ray node at {shown} is not alive"
        else:
            reason = (
                f"no live Ray node has address {shown} (live Ray nodes: {live_text}); "
                "join that machine with `ray start --address`"
            )
        out.append(NodeConnection(node.name, node.address, None, reason))
    return tuple(out)


def lost_agents(
    agents: Mapping[str, str], ray_nodes: Sequence[RayNode], addresses: Mapping[str, str]
) -> dict[str, str]:
    """Fleet node -> why it is lost, for each node with an agent (``agents``: node -> the
    Ray node id its agent runs on) whose Ray node is not alive, or no longer listed, in
    ``ray_nodes``; ``addresses``: node -> its address, for the words."""
    by_id = {rn.node_id: rn for rn in ray_nodes}
    lost: dict[str, str] = {}
    for node, ray_node_id in agents.items():
        rn = by_id.get(ray_node_id)
        if rn is None or not rn.alive:
            why = f": {rn.death_reason}" if rn is not None and rn.death_reason else ""
            where = addresses.get(node, "?")
            lost[node] = f"node {node} is lost: its Ray node at {where} is no longer alive{why}"
    return lost


def nodes_back(
    fleet: Fleet,
    lost: Sequence[str],
    ray_nodes: Sequence[RayNode],
    addresses: Mapping[str, Sequence[str]],
) -> dict[str, NodeConnection]:
    """Lost node -> its connection, for each node of ``lost`` that a live Ray node in
    ``ray_nodes`` now has the address of (as :func:`match_fleet`, with ``addresses``:
    node -> the IPs its address resolved to)."""
    wanted = tuple(n for n in fleet.nodes if n.name in set(lost))
    if not wanted:
        return {}
    sub = Fleet(nodes=wanted, models=fleet.models, model_roots=fleet.model_roots)
    return {c.node: c for c in match_fleet(sub, ray_nodes, addresses) if c.connected}
