"""A request under way when its node is lost is sent again where its role moves.

A power cut leaves the router's connection to the dead machine's backend open and
unanswered: no RST, no FIN. That cannot be made here, so a listener that accepts and
never answers stands in for that backend (node ``n1``); the backend of node ``n2``,
where the role moves, is ``tests/support/fake_backend.py`` (one token per completion). The
router, the schedulers and the re-plan are rosterd's own, served by uvicorn on
127.0.0.1; the request is sent with httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest
import uvicorn

from rosterd.backends.values import Endpoint
from rosterd.fleet_scheduler.values import NodeServing
from rosterd.router import RoleRoute, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import FAKE_BACKEND, NoLiveness, pick_free_port

MIB = 2**20


class Unanswering:
    """Accepts connections on 127.0.0.1 and reads what comes, never answering (the backend
    of a machine whose power was cut, as the router's socket sees it); keeps what it read."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                self.received.append(conn.recv(65536))

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.sock.close()


class At(NoLiveness):
    """Backends whose every start "succeeds" towards ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def start(self, role: str) -> Endpoint:
        return Endpoint(self.url, "m")

    async def stop(self, role: str) -> None:
        return None


async def _until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


@pytest.fixture
def answering() -> Iterator[str]:
    """``tests/support/fake_backend.py`` on a free port: its base URL once it answers."""
    port = pick_free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_BACKEND), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_a_request_cut_by_its_nodes_loss_before_any_byte_is_served_where_its_role_moves(
    answering: str,
) -> None:
    dead = Unanswering()
    spec = InferenceSpec(
        role="chat", flavor=InferFlavor.LLAMACPP, model="m", memory=MemorySpec(MIB)
    )
    n1 = NodeScheduler("n1", 100 * MIB, {"chat": spec}, At(dead.url))
    scheduler = NodeDirectory({"n1": n1})
    scheduler.start()
    app = create_app(scheduler, {"chat": RoleRoute("chat", names=("chat",))})
    port = pick_free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            await _until(lambda: server.started, "the router to serve")
            body = {"model": "chat", "prompt": "Hi", "max_tokens": 4}
            request = asyncio.create_task(client.post("/v1/completions", json=body))
            # sent to n1's backend, which never answers
            await _until(lambda: bool(dead.received), "the request to reach n1's backend")
            n1.node_lost("node n1 is lost: its Ray node died")
            await asyncio.sleep(0.2)
            assert not request.done()  # cut, not failed: it waits for where its role goes
            # The fleet's re-plan: chat moves to n2, n1 stays with nothing.
            scheduler.apply_plan(
                {
                    "n1": NodeServing("n1", 100 * MIB, {}),
                    "n2": NodeServing("n2", 100 * MIB, {"chat": spec}),
                },
                {"n1": n1.backends, "n2": At(answering)},
            )
            answer = await asyncio.wait_for(request, 30)
        assert answer.status_code == 200, answer.text
        assert len(dead.received) == 1  # never sent to the lost node again
    finally:
        server.should_exit = True
        await serving
        await scheduler.shutdown()
        dead.close()
