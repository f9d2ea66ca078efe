"""Backend ports (DESIGN.md layer 5): is a port free, who holds it, pick a free one
outside the kernel's ephemeral range.

A port something else listens on is refused with ``PortInUseError`` naming
the holder when the OS lets us see it.

Library choice: psutil (socket owners portably).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import psutil

from rosterd.errors import PortInUseError


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_holder(host: str, port: int) -> str | None:
    """Who listens on ``port`` (any local address matching ``host``), e.g. ``pid 42 (python3)``.

    ``None`` when nothing visible listens there or the OS hides the owner
    (another user's process without privileges).
    """
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        # A listener on the wildcard address holds the port on every address.
        if conn.laddr.ip not in {host, f"::ffff:{host}", "0.0.0.0", "::"}:
            continue
        if conn.pid is None:
            return None
        try:
            proc = psutil.Process(conn.pid)
            return f"pid {conn.pid} ({proc.name()}: {_short_command(proc.cmdline())})"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return f"pid {conn.pid}"
    return None


def _short_command(argv: list[str], limit: int = 120) -> str:
    """``argv`` joined, whole arguments only, up to about ``limit`` characters (then ``…``)."""
    shown: list[str] = []
    for arg in argv:
        if shown and len(" ".join([*shown, arg])) > limit:
            return " ".join(shown) + " …"
        shown.append(arg)
    return " ".join(shown)


def check_port_free(host: str, port: int) -> None:
    """Return if nothing listens on ``host``:``port``.

    Binds a throwaway socket (``SO_REUSEADDR``, so a closed socket lingering in
    TIME_WAIT does not count as a holder).

    Raises:
        PortInUseError: something listens there (named when the OS shows it).
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise PortInUseError(host, port, port_holder(host, port)) from None


#: Where the kernel picks the local ports of outgoing connections (Linux), and the
#: range assumed where that file is missing (Linux's default).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
#: The lowest port picked: below it sit the well-known and much-used service ports.
LOWEST_PICKED_PORT = 10000
_PICK_TRIES = 50


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, ``(low, high)`` inclusive, from ``path``
    (``ip_local_port_range``: two numbers); ``DEFAULT_EPHEMERAL_RANGE`` when it cannot
    be read or parsed."""
    try:
        low, high = (int(word) for word in path.read_text().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL_RANGE


def free_port(host: str, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port on ``host`` that nothing listens on right now, outside the kernel's
    ephemeral range (``ephemeral``, default ``ephemeral_range()``).

    A port the OS hands out for ``bind(0)`` lies inside that range, where any
    outgoing connection may take it between the pick and the backend's own bind
    (32911-59087 were seen picked, issue 22); above ``LOWEST_PICKED_PORT`` and
    outside it, only a listener can, and the pick checks for one. Picks at random,
    so that two rosterd processes rarely try the same port. Falls back to the OS's
    pick when the range leaves no room outside it.

    Raises:
        OSError: ``host`` is not a local address.
    """
    low, high = ephemeral if ephemeral is not None else ephemeral_range()
    spans = [
        (first, last)
        for first, last in ((LOWEST_PICKED_PORT, low - 1), (high + 1, 65535))
        if first <= last
    ]
    if spans:
        sizes = [last - first + 1 for first, last in spans]
        for _ in range(_PICK_TRIES):
            index = _RANDOM.randrange(sum(sizes))
            for (first, _last), size in zip(spans, sizes, strict=True):
                if index < size:
                    port = first + index
                    break
                index -= size
            try:
                check_port_free(host, port)
            except PortInUseError:
                continue
            return port
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_RANDOM = random.SystemRandom()
