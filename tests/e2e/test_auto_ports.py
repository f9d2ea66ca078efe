"""``--auto-backend-ports`` picks ports outside the kernel's ephemeral range and tries
another when one is taken before the bind (issue 22).

An outgoing connection takes its local port from ``ip_local_port_range``; a port
the OS hands out for ``bind(0)`` lies there too, so it could be taken between
the pick and the backend's bind. The retry runs on a real llama-server.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import support.specs as spec_helpers
from rosterd.backends.local import SupervisorBackends
from rosterd.supervisor import Supervisor
from rosterd.supervisor.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PICKED_PORT,
    ephemeral_range,
    free_port,
)
from rosterd.weights import ResolvedWeights
from support.up import MODELS, prepare_example_models


def test_picked_ports_lie_outside_the_ephemeral_range_and_are_free() -> None:
    low, high = 32768, 60999
    for _ in range(200):
        port = free_port("127.0.0.1", (low, high))
        assert LOWEST_PICKED_PORT <= port < low or high < port <= 65535, port
        with socket.socket() as sock:
            # nothing listens there (a socket of the other tests may linger in TIME_WAIT,
            # which a server's SO_REUSEADDR bind, llama-server's too, does not mind)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_the_kernels_range_is_read_and_a_broken_file_falls_back(tmp_path: Path) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t50000\n")
    assert ephemeral_range(range_file) == (40000, 50000)
    range_file.write_text("not numbers\n")
    assert ephemeral_range(range_file) == DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE


def test_a_range_that_leaves_no_room_falls_back_to_the_os_pick() -> None:
    port = free_port("127.0.0.1", (LOWEST_PICKED_PORT, 65535))
    assert 0 < port <= 65535


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1: the port another process took first."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


async def test_a_start_on_a_picked_port_taken_before_the_bind_picks_another(
    tmp_path: Path,
    llama_server_binary: Path,
    listener: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prepare_example_models()
    taken = int(listener.getsockname()[1])
    picks = iter([taken])

    def pick(host: str) -> int:
        # the first pick loses the race to the listener; then a real pick
        return next(picks, None) or free_port(host)

    monkeypatch.setattr("rosterd.backends.local.free_port", pick)
    spec = spec_helpers.spec("a", 0.5, model="tiny-a")
    backends = SupervisorBackends(
        Supervisor(tmp_path),
        {"a": spec},
        host="127.0.0.1",
        resolve_weights=lambda _spec: ResolvedWeights(MODELS / "tiny-a.gguf", ctx_size=256),
        auto_ports=True,
    )
    try:
        endpoint = await backends.start("a")
        assert f":{taken}" not in endpoint.base_url
    finally:
        await backends.stop("a")
