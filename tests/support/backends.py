"""Helpers shared by the backend tests: the fake backend's launch, free ports, process checks
and a separate "rosterd" process that starts one backend (for the kill -9 test)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from pathlib import Path

import psutil

from rosterd.adapters.base import HttpProbe, Launch
from rosterd.supervisor import ProbeResult

FAKE_BACKEND = Path(__file__).resolve().parent / "fake_backend.py"


class NoLiveness:
    """The liveness half of ``RoleBackends`` for stand-in backends that run no process:
    every probe passes (there is nothing to wedge) and a restart is refused."""

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        return ProbeResult(True, 200)

    async def restart(self, role: str) -> None:
        raise RuntimeError(f"stand-in backend {role} has no process to restart")


def pick_free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pick_free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now (held
    together while chosen, so no two are the same)."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def wait_port_free(port: int, timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` seconds for 127.0.0.1:``port`` to be free; whether it is.

    A killed multi-threaded process shows as a zombie as soon as its main thread
    has exited, while its other threads (which share the listening socket) may
    still be on their way out; the port is free only once all are gone.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_is_free(port):
            return True
        await asyncio.sleep(0.05)
    return port_is_free(port)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie awaiting its reaper counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` seconds for ``pid`` to exit; whether it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        await asyncio.sleep(0.05)
    return gone(pid)


def fake_launch(
    port: int,
    mode: str = "ok",
    *,
    load_s: float = 0.0,
    child_pid_file: Path | None = None,
) -> Launch:
    """A ``Launch`` of ``tests/support/fake_backend.py`` (readiness ``GET /health``)."""
    argv = [sys.executable, str(FAKE_BACKEND), "--port", str(port), "--mode", mode]
    argv += ["--load-s", str(load_s)]
    if child_pid_file is not None:
        argv += ["--child-pid-file", str(child_pid_file)]
    return Launch(
        argv=tuple(argv),
        host="127.0.0.1",
        port=port,
        readiness=HttpProbe(method="GET", path="/health"),
        served_model="fake",
    )


CHILD_ROSTERD = """
import asyncio, json, sys
from pathlib import Path
from rosterd.adapters.base import HttpProbe, Launch
from rosterd.supervisor import ProbeResult
from rosterd.supervisor import Supervisor

async def main() -> None:
    state, port, argv = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    sup = Supervisor(state)
    launch = Launch(argv=tuple(argv), host="127.0.0.1", port=port,
                    readiness=HttpProbe("GET", "/health"), served_model="m")
    backend = await sup.start("orphan", launch)
    print(json.dumps({"pid": backend.pid}), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def run_rosterd_child(
    state: Path, launch: Launch, timeout_s: float
) -> tuple[asyncio.subprocess.Process, int]:
    """Start a separate rosterd process that starts ``launch``; return it and the backend's pid.

    Kill it with ``kill_rosterd_child`` (SIGKILL, then reap it and close its pipe).
    """
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD_ROSTERD,
        str(state),
        str(launch.port),
        json.dumps(list(launch.argv)),
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), timeout_s)
        return child, int(json.loads(line)["pid"])
    except BaseException:
        await kill_rosterd_child(child)
        raise


async def kill_rosterd_child(child: asyncio.subprocess.Process) -> None:
    """``kill -9`` the rosterd child, reap it and drain its stdout."""
    if child.returncode is None:
        child.kill()
    if child.stdout is not None:
        await child.stdout.read()
    await child.wait()
