"""Which machine a fleet node's address names (layer 2; reads the machine and the resolver).

:func:`node_addresses` is what an address stands for (itself when it is an IP, else
what the resolver gives for the name); :func:`is_this_machine` is the one answer to
"is this node this machine?": loopback, ``localhost``, this machine's hostname, or a
name or IP that resolves to one of this machine's interface addresses (psutil lists
them portably). ``rosterd up``, ``rosterd plan`` and the Ray matching all ask here.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

from rosterd.fleet.model import normal_ip


def node_addresses(address: str) -> tuple[str, ...]:
    """The IP addresses a fleet node's ``address`` stands for: itself when it is an IP,
    else what the resolver gives for the name (``()`` when it does not resolve)."""
    ip = normal_ip(address)
    if ip is not None:
        return (ip,)
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return ()
    found = (normal_ip(str(info[4][0])) for info in infos)
    return tuple(dict.fromkeys(ip for ip in found if ip is not None))


def interface_addresses() -> frozenset[str]:
    """This machine's own IP addresses, on every interface (normalised)."""
    found: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            ip = normal_ip(a.address)
            if ip is not None:
                found.add(ip)
    return frozenset(found)


def is_this_machine(address: str) -> bool:
    """Whether a node at ``address`` is this machine: ``localhost``, this machine's
    hostname, a loopback IP, or an address (or a name resolving to one) of one of its
    interfaces. A name that does not resolve is not this machine."""
    if address in ("localhost", socket.gethostname()):
        return True
    ips = node_addresses(address)
    if any(ipaddress.ip_address(ip).is_loopback for ip in ips):
        return True
    return bool(set(ips) & interface_addresses())
