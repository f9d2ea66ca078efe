"""Two hosts made of network namespaces, for the tests of a fleet on Ray across machines.

Two network namespaces joined by a veth pair stand for two machines of a lab:
192.0.2.101 (the first: a Ray head and ``rosterd up``) and 192.0.2.102 (the
second: a Ray worker), addresses of TEST-NET-1 that exist only inside the
namespaces. The Ray processes are ``ray start ... --block`` processes a test
owns, stopped by their own process groups (never ``ray stop``); every process
left in a namespace is one the test started, stopped by its pid before the
namespace is deleted. The router is reached from inside the first namespace
(the test's own namespace has no route there). The ``lab`` fixture skips, with
the reason, where ``ip netns`` does not work (not root, no iproute2). No tests here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.polling import eventually_sync

FIRST_IP, SECOND_IP = "192.0.2.101", "192.0.2.102"
RAY_PORT, ROUTER_PORT = 6380, 8400
SRC = Path(__file__).resolve().parents[2] / "src"
RAY = Path(sys.executable).with_name("ray")

#: A one-request HTTP client run inside a namespace: METHOD URL [JSON] -> {"status", "body"}.
HTTP_CLIENT = """
import json, sys, httpx
method, url = sys.argv[1], sys.argv[2]
body = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
r = httpx.request(method, url, json=body, timeout=120, trust_env=False)
try:
    answer = r.json()
except ValueError:
    answer = r.text
print(json.dumps({"status": r.status_code, "body": answer}))
"""


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@dataclass
class Lab:
    """Two namespaces, ``first`` and ``second``, joined by a veth pair (``second_link``:
    its end in ``second``)."""

    first: str
    second: str
    second_link: str = ""

    def run_in(self, ns: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside namespace ``ns`` in a process group of its own."""
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv], start_new_session=True, **kwargs
        )

    def http(self, method: str, url: str, body: object | None = None) -> Any:
        """``method url`` from inside the first namespace: ``{"status", "body"}``."""
        argv = [sys.executable, "-c", HTTP_CLIENT, method, url]
        if body is not None:
            argv.append(json.dumps(body))
        done = subprocess.run(
            ["ip", "netns", "exec", self.first, *argv],
            capture_output=True,
            text=True,
            timeout=180,
            env=env(),
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def pids(self, ns: str) -> set[int]:
        listed = ip("netns", "pids", ns)
        return {int(p) for p in listed.stdout.split()}

    def llama_servers(self, ns: str) -> set[int]:
        """The pids of the llama-server processes running in namespace ``ns``."""
        found = set()
        for pid in self.pids(ns):
            with contextlib.suppress(OSError):  # it ended meanwhile
                if Path(os.readlink(f"/proc/{pid}/exe")).name == "llama-server":
                    found.add(pid)
        return found


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}


@pytest.fixture
def lab() -> Iterator[Lab]:
    """Two namespaces named after this process (unique per run), deleted afterwards."""
    if not sys.platform.startswith("linux") or shutil.which("ip") is None:
        pytest.skip("ip netns needs Linux and iproute2")
    tag = str(os.getpid())
    first, second = f"rosterd-a-{tag}", f"rosterd-b-{tag}"
    made: list[str] = []
    try:
        for ns in (first, second):
            added = ip("netns", "add", ns)
            if added.returncode != 0:
                pytest.skip(f"ip netns does not work here: {added.stderr.strip()}")
            made.append(ns)
        veth_a, veth_b = f"rda{tag}"[:15], f"rdb{tag}"[:15]
        steps = [
            ["link", "add", veth_a, "type", "veth", "peer", "name", veth_b],
            ["link", "set", veth_a, "netns", first],
            ["link", "set", veth_b, "netns", second],
            ["-n", first, "addr", "add", f"{FIRST_IP}/24", "dev", veth_a],
            ["-n", second, "addr", "add", f"{SECOND_IP}/24", "dev", veth_b],
            *(
                ["-n", ns, "link", "set", dev, "up"]
                for ns, dev in ((first, veth_a), (second, veth_b))
            ),
            *(["-n", ns, "link", "set", "lo", "up"] for ns in (first, second)),
            # Ray finds a machine's own IP by the route out; the link is the only one.
            ["-n", first, "route", "add", "default", "dev", veth_a],
            ["-n", second, "route", "add", "default", "dev", veth_b],
        ]
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot build the namespaces (ip {' '.join(step)}): {done.stderr}")
        yield Lab(first, second, veth_b)
    finally:
        for ns in made:
            for pid in Lab(first, second).pids(ns):  # only processes this test started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            ip("netns", "del", ns)


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM the process group of ``proc`` (this test's), SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its children, if any are left
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def listening(pid: int) -> set[tuple[str, int]]:
    """The IPv4 (address, port) pairs ``pid`` listens on, read in its own namespace
    (/proc/PID/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    with open(f"/proc/{pid}/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.add((socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16)))
    return found


def wait_for_line(proc: subprocess.Popen[bytes], log: Path, line: str, what: str) -> None:
    def said() -> bool:
        assert proc.poll() is None, f"{what} exited: {log.read_text(errors='replace')}"
        return line in log.read_text(errors="replace")

    eventually_sync(said, what=what, timeout_s=120, interval_s=0.5)


def write_lab(tmp: Path, gguf: Path) -> tuple[Path, Path, Path]:
    """``near`` (the first host) and ``far`` (the second), 1 GiB budget each: ``chat`` and
    ``code`` are interactive and 0.3 GiB, planned one per node; both fit on ``near`` once
    ``far`` is lost."""
    entries = [
        {"id": role, "role": "test", "name": role, "repo": f"local/{role}", "ram_gb": 0.3}
        | {"backend": "llama.cpp", "status": "live"}
        for role in ("chat", "code")
    ]
    roster = tmp / "roster.yaml"
    roster.write_text(json.dumps({"roster": entries}))
    overlay = tmp / "overlay.yaml"
    overlay.write_text(
        json.dumps({"latency_class": {"chat": "interactive", "code": "interactive"}})
    )
    source = {"path": str(gguf), "ctx_size": 256, "extra_args": ["-t", "1"]}
    fleet = tmp / "fleet.yaml"
    nodes = [
        {"name": name, "memory_gb": 2, "reserved_gb": 1, "platform": "linux-x86_64"}
        | {"flavors": ["llamacpp"], "address": address}
        for name, address in (("near", FIRST_IP), ("far", SECOND_IP))
    ]
    fleet.write_text(
        json.dumps(
            {
                "nodes": nodes,
                "models": {"chat": source, "code": source},
                "model_roots": [str(gguf.parent)],
            }
        )
    )
    return roster, overlay, fleet


@dataclass
class RunningFleet:
    """A Ray head (first host), a Ray worker (second host) and ``rosterd up`` (first host)
    started by :func:`running_fleet`; ``url`` is the router's, ``log`` up's output."""

    head: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    up: subprocess.Popen[bytes]
    url: str
    log: Path

    def said(self) -> str:
        """What ``up`` printed so far."""
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_fleet(
    lab: Lab, tmp: Path, files: tuple[Path, Path, Path], up_argv: list[str], *extra: str
) -> Iterator[RunningFleet]:
    """Start the Ray head, the worker and ``up_argv`` (``rosterd``'s argv) ``up ROSTER
    --overlay OVERLAY --fleet FLEET`` (``files``) joined to it, plus ``extra`` options; yield
    once ``up`` serves; stop all three by their process groups afterwards."""
    roster, overlay, fleet = files
    # Ray's socket paths must stay short: a temp folder of its own per host.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rdray"))
    started: list[subprocess.Popen[bytes]] = []
    log = tmp / "up.log"
    try:
        with (tmp / "head.log").open("wb") as head_log:
            head = lab.run_in(
                lab.first,
                [
                    *(str(RAY), "start", "--head", "--node-ip-address", FIRST_IP),
                    *("--port", str(RAY_PORT), "--num-cpus", "1", "--include-dashboard", "false"),
                    *("--temp-dir", str(ray_tmp / "a"), "--block", "--disable-usage-stats"),
                ],
                env=env(),
                stdout=head_log,
                stderr=subprocess.STDOUT,
            )
        started.append(head)
        wait_for_line(head, tmp / "head.log", "Ray runtime started", "the Ray head")
        with (tmp / "worker.log").open("wb") as worker_log:
            worker = lab.run_in(
                lab.second,
                [
                    *(str(RAY), "start", "--address", f"{FIRST_IP}:{RAY_PORT}"),
                    *("--node-ip-address", SECOND_IP, "--num-cpus", "1", "--block"),
                    "--disable-usage-stats",
                ],
                env=env(),
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            )
        started.append(worker)
        wait_for_line(worker, tmp / "worker.log", "Ray runtime started", "the Ray worker")
        with log.open("wb") as up_log:
            up = lab.run_in(
                lab.first,
                [
                    *(*up_argv, "up", str(roster), "--overlay", str(overlay)),
                    *("--fleet", str(fleet), "--ray-address", f"{FIRST_IP}:{RAY_PORT}"),
                    *("--host", FIRST_IP, "--port", str(ROUTER_PORT), "--no-warm-up"),
                    *("--auto-backend-ports", "--grace", "5"),
                    *("--drain", "2"),  # a request still waiting holds the HTTP server that long
                    *("--state-dir", str(tmp / "state")),
                    *extra,
                ],
                env=env(),
                stdout=up_log,
                stderr=subprocess.STDOUT,
            )
        started.append(up)
        running = RunningFleet(head, worker, up, f"http://{FIRST_IP}:{ROUTER_PORT}", log)

        def serving() -> bool:
            assert up.poll() is None, running.said()
            return "rosterd serving" in running.said()

        eventually_sync(
            serving,
            what="rosterd up to serve (it waits for the worker to join)",
            timeout_s=180,
            interval_s=0.5,
        )
        yield running
    finally:
        for proc in reversed(started):
            stop_group(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)
