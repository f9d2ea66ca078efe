"""Matching fleet nodes to Ray nodes (beside DESIGN.md layer 5, with ``ray_cluster``): the
values of a Ray cluster's nodes and of each fleet node's connection, and the match itself.

:func:`match_fleet` is pure: a fleet node is connected when exactly one live Ray
node has one of its IPs (:func:`node_addresses` resolves a name, the one I/O
here). No Ray import: these are plain values, so the matching is tested without
a cluster.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rosterd.fleet import Fleet


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


def _ip(text: str) -> str | None:
    """``text`` as a normalised IP address, or ``None`` if it is not one."""
    try:
        return str(ipaddress.ip_address(text.strip("[]").split("%", 1)[0]))
    except ValueError:
        return None


def node_addresses(address: str) -> tuple[str, ...]:
    """The IP addresses a fleet node's ``address`` stands for: itself when it is an IP,
    else what the resolver gives for the name (``()`` when it does not resolve)."""
    ip = _ip(address)
    if ip is not None:
        return (ip,)
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return ()
    found = (_ip(str(info[4][0])) for info in infos)
    return tuple(dict.fromkeys(ip for ip in found if ip is not None))


def match_fleet(
    fleet: Fleet,
    ray_nodes: Sequence[RayNode],
    addresses: Mapping[str, Sequence[str]] | None = None,
) -> tuple[NodeConnection, ...]:
    """Match each fleet node to the live Ray node at its address (pure; fleet order).

    ``addresses``: fleet node name -> the IPs its address stands for (see
    :func:`node_addresses`; default: the address itself, when it is an IP).
    A node is connected when exactly one live Ray node has one of those IPs;
    otherwise ``reason`` says whether none is there, only a dead one, several
    (one Ray node per machine is needed to tell them apart), or the address
    is not an IP at all. Two fleet nodes may share one Ray node.
    """
    live: dict[str, list[RayNode]] = {}
    dead: dict[str, list[RayNode]] = {}
    for rn in sorted(ray_nodes, key=lambda n: n.node_id):
        ip = _ip(rn.address) or rn.address
        (live if rn.alive else dead).setdefault(ip, []).append(rn)
    live_text = ", ".join(sorted(live)) or "none"
    out: list[NodeConnection] = []
    for node in fleet.nodes:
        if addresses is not None and node.name in addresses:
            ips = [_ip(a) or a for a in addresses[node.name]]
        else:
            own = _ip(node.address)
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
