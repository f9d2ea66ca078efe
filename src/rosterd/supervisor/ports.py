"""Backend ports (DESIGN.md layer 5): is a port free, who holds it, pick a free one.

A port something else listens on is refused with ``PortInUseError`` naming
the holder when the OS lets us see it.

Library choice: psutil (socket owners portably).
"""

from __future__ import annotations

import socket

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


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it).

    Raises:
        OSError: ``host`` is not a local address.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
