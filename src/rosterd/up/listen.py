"""The listener of ``rosterd up`` (layer 8): the router's socket, the uvicorn server that
serves on it, and the open-files limit its connections need.

:func:`bind_listener` binds the socket before uvicorn starts (so a port in use is a
:class:`~rosterd.errors.ListenError` naming the port, and the backlog is rosterd's);
:class:`NoSignalServer` is uvicorn's server without its own signal capture
(``rosterd up`` handles signals itself), configured by :func:`server_config`;
:func:`open_files_wanted` and
:func:`raise_open_files_limit` size ``RLIMIT_NOFILE`` for the requests admitted.
uvicorn serves the ASGI router (a well-kept server; rosterd only hands it a socket).
"""

from __future__ import annotations

import contextlib
import ipaddress
import resource
import socket
from collections.abc import Generator

import uvicorn
from starlette.types import ASGIApp

from rosterd.errors import ListenError
from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.http_protocol import HEADER_TIMEOUT_S, bounded_http_protocol
from rosterd.up.options import UpOptions

#: The router's listen backlog: connections the kernel accepts before rosterd does (Linux
#: caps it at ``net.core.somaxconn``, 4096 by default since 5.4). Both
#: :func:`bind_listener` and uvicorn (which calls ``listen`` again on the socket it is
#: given) use it.
LISTEN_BACKLOG = 4096

#: Open files ``rosterd up`` needs beside its streams: logs, pipes, probes, the listener.
BASE_OPEN_FILES = 256


def open_files_wanted(limits: SchedulerLimits, roles: int) -> int:
    """The open-files limit one ``up`` wants: two sockets per request it admits (the
    client's and the backend's) for each role's ``max_concurrency + max_queue``, plus
    ``BASE_OPEN_FILES``. Measured: at the usual soft limit of 1,024, 1,000 streams
    through one role got 984 answers 502 (``connect`` to the backend failed with
    EMFILE)."""
    return BASE_OPEN_FILES + 2 * roles * (limits.max_concurrency + limits.max_queue)


def raise_open_files_limit(wanted: int) -> str | None:
    """When this process's soft ``RLIMIT_NOFILE`` is below ``wanted``, raise it to the hard
    limit (idle and slow connections hold descriptors too); what to tell the operator
    (raised, or still too low), or ``None`` when the limit was already enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return None
    target = max(wanted, 2**20) if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target >= wanted:
        return f"raised the open-files limit from {soft} to {target} for the requests admitted"
    return (
        f"warning: the open-files limit is {target} (hard limit), below the {wanted} the "
        "admitted requests may need (two sockets each); raise it (ulimit -Hn) or lower "
        "--max-concurrency / --max-queue, or requests will fail with backend_error"
    )


def is_loopback_host(host: str) -> bool:
    """Whether listening on ``host`` keeps the server on this machine (localhost, 127.x, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class NoSignalServer(uvicorn.Server):
    """uvicorn without its own signal capture: ``rosterd up`` handles signals itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def server_config(app: ASGIApp, options: UpOptions) -> uvicorn.Config:
    """The uvicorn configuration ``rosterd up`` serves the router ``app`` with, for a run of
    ``options``: no access log, the app's lifespan, ``options.limits.drain_s`` (at least
    1 s) for the graceful shutdown, ``LISTEN_BACKLOG``, and :mod:`rosterd.up.http_protocol`'s
    deadlines for slow clients (headers within ``HEADER_TIMEOUT_S``, or
    ``options.request_read_timeout_s`` when that is shorter). Serve it on the socket of
    :func:`bind_listener` (``Server.serve(sockets=[sock])``)."""
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=max(1, int(options.limits.drain_s)),
        # uvicorn listens again on the socket it is given, with its own backlog.
        backlog=LISTEN_BACKLOG,
        http=bounded_http_protocol(min(HEADER_TIMEOUT_S, options.request_read_timeout_s)),
    )


def bind_listener(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on ``host:port`` with ``LISTEN_BACKLOG``.

    Raises:
        ListenError: the address cannot be bound (e.g. another ``rosterd up`` has it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP,
    # and without it small responses wait ~40 ms on the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {host}:{port}: {exc.strerror}; "
            "is another rosterd up running? choose another --port"
        ) from None
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock
