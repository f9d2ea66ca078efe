"""Joining a Ray cluster as a new user does: ``rosterd up --ray-address`` where no cluster is.

Each test runs ``rosterd up`` as a process on the example lab with ``--ray-address``
at a loopback address of its own: a port nothing listens on (refused at once, like
any other address), or a port of a silent listener this test runs (it accepts
connections and never answers, so Ray's join would retry for minutes): the join
then ends at ``--ray-join-timeout``, or at once on SIGINT or SIGTERM. No Ray cluster
is started; each test needs Ray installed (the ``ray`` extra), and skips without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ray_nodes import needs_ray
from support.up import EXAMPLE_LAB, prepare_example_models, rosterd_argv

pytestmark = needs_ray

#: A loopback address no Ray test cluster uses (``support.ray_nodes``'s are 127.0.0.2-127.0.0.4).
SILENT_IP = "127.0.0.21"


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class SilentListener:
    """Accepts TCP connections on ``host`` and never answers; counts the connections."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[SilentListener]:
    listener = SilentListener(SILENT_IP)
    try:
        yield listener
    finally:
        listener.close()


def _up(tmp: Path, address: str, *extra: str) -> subprocess.Popen[str]:
    prepare_example_models()
    return subprocess.Popen(
        [
            *rosterd_argv(),
            "up",
            *EXAMPLE_LAB,
            *("--ray-address", address, "--port", str(_free_port("127.0.0.1"))),
            *("--state-dir", str(tmp / "state"), "--auto-backend-ports", *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="200"),
        text=True,
    )


def _ended(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, str, float]:
    """(exit status, output, seconds it took) once ``proc`` exits within ``timeout_s``."""
    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"still running after {timeout_s:g} s:\n{out}") from None
    return proc.returncode, " ".join(out.split()), time.monotonic() - started


def test_a_loopback_address_with_no_cluster_is_refused_at_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_free_port('127.0.0.1')}"  # nothing listens there
    status, said, took_s = _ended(_up(tmp_path, address), 30)
    assert status == 2, said
    assert f"cannot reach the Ray cluster at {address}: Connection refused" in said, said
    assert "Failed to connect to GCS" not in said, said
    assert "Traceback" not in said, said
    assert took_s < 15, took_s  # the process start included; no retries behind it


def test_a_join_that_gets_no_answer_ends_at_its_deadline(
    tmp_path: Path, silent: SilentListener
) -> None:
    proc = _up(tmp_path, silent.address, "--ray-join-timeout", "3")
    status, said, took_s = _ended(proc, 60)
    assert status == 2, said
    assert f"cannot join the Ray cluster at {silent.address}: no answer within 3 s" in said, said
    assert "--ray-join-timeout" in said, said
    assert "Traceback" not in said, said
    assert took_s < 25, took_s
    assert silent.accepted  # it did try


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_join_ends_it_at_once(
    tmp_path: Path, silent: SilentListener, sig: signal.Signals
) -> None:
    proc = _up(tmp_path, silent.address, "--ray-join-timeout", "120")
    deadline = time.monotonic() + 60
    # The reachability check connects once; Ray's join is the connection after it.
    while len(silent.accepted) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(silent.accepted) >= 2, "the join did not begin"
    time.sleep(0.5)  # well inside Ray's retries
    sent = time.monotonic()
    proc.send_signal(sig)
    status, said, _ = _ended(proc, 30)
    took_s = time.monotonic() - sent
    assert status == 130, said
    assert f"interrupted while joining the Ray cluster at {silent.address}" in said, said
    assert "nothing was started" in said, said
    assert "Traceback" not in said, said
    assert took_s < 5, took_s
