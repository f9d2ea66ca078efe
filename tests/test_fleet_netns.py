"""Two real hosts: ``rosterd up --ray-address`` across two network namespaces.

Two network namespaces joined by a veth pair stand for two machines of a lab:
192.0.2.101 (the first: a Ray head and ``rosterd up``) and 192.0.2.102 (the
second: a Ray worker), addresses of TEST-NET-1 that exist only inside the
namespaces. The Ray processes are ``ray start ... --block`` processes this
test owns, stopped by their own process groups (never ``ray stop``); every
process left in a namespace is one this test started, stopped by its pid
before the namespace is deleted. The router is reached from inside the first
namespace (the test's own namespace has no route there), by a small HTTP
client run there. Skipped, with the reason, where ``ip netns`` does not work
(not root, no iproute2) or Ray is missing.
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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ray_helpers import needs_ray
from test_up_support import rosterd_argv

FIRST_IP, SECOND_IP = "192.0.2.101", "192.0.2.102"
RAY_PORT, ROUTER_PORT = 6380, 8400
SRC = Path(__file__).resolve().parents[1] / "src"
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


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@dataclass
class Lab:
    """Two namespaces, ``first`` and ``second``, joined by a veth pair."""

    first: str
    second: str

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
            env=_env(),
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def pids(self, ns: str) -> set[int]:
        listed = _ip("netns", "pids", ns)
        return {int(p) for p in listed.stdout.split()}

    def llama_servers(self, ns: str) -> set[int]:
        """The pids of the llama-server processes running in namespace ``ns``."""
        found = set()
        for pid in self.pids(ns):
            with contextlib.suppress(OSError):  # it ended meanwhile
                if Path(os.readlink(f"/proc/{pid}/exe")).name == "llama-server":
                    found.add(pid)
        return found


def _env() -> dict[str, str]:
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
            added = _ip("netns", "add", ns)
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
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot build the namespaces (ip {' '.join(step)}): {done.stderr}")
        yield Lab(first, second)
    finally:
        for ns in made:
            for pid in Lab(first, second).pids(ns):  # only processes this test started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _ip("netns", "del", ns)


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
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


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def _listening(pid: int) -> set[tuple[str, int]]:
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


def _wait(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, line: str, what: str) -> None:
    def said() -> bool:
        assert proc.poll() is None, f"{what} exited: {log.read_text(errors='replace')}"
        return line in log.read_text(errors="replace")

    _wait(said, 120, what)


def _write_lab(tmp: Path, gguf: Path) -> tuple[Path, Path, Path]:
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


@pytest.mark.slow
@needs_ray
def test_a_role_is_served_from_the_second_hosts_namespace_then_the_firsts_once_it_is_lost(
    lab: Lab, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    roster, overlay, fleet = _write_lab(tmp_path, tiny_gguf)
    # Ray's socket paths must stay short: a temp folder of its own per host.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rdray"))
    log = tmp_path / "up.log"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with (tmp_path / "head.log").open("wb") as head_log:
            head = lab.run_in(
                lab.first,
                [
                    *(str(RAY), "start", "--head", "--node-ip-address", FIRST_IP),
                    *("--port", str(RAY_PORT), "--num-cpus", "1", "--include-dashboard", "false"),
                    *("--temp-dir", str(ray_tmp / "a"), "--block", "--disable-usage-stats"),
                ],
                env=_env(),
                stdout=head_log,
                stderr=subprocess.STDOUT,
            )
        started.append(head)
        _wait_for_line(head, tmp_path / "head.log", "Ray runtime started", "the Ray head")
        with (tmp_path / "worker.log").open("wb") as worker_log:
            worker = lab.run_in(
                lab.second,
                [
                    *(str(RAY), "start", "--address", f"{FIRST_IP}:{RAY_PORT}"),
                    *("--node-ip-address", SECOND_IP, "--num-cpus", "1", "--block"),
                    "--disable-usage-stats",
                ],
                env=_env(),
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            )
        started.append(worker)
        _wait_for_line(worker, tmp_path / "worker.log", "Ray runtime started", "the Ray worker")
        with log.open("wb") as up_log:
            up = lab.run_in(
                lab.first,
                [
                    *(*rosterd_argv(), "up", str(roster), "--overlay", str(overlay)),
                    *("--fleet", str(fleet), "--ray-address", f"{FIRST_IP}:{RAY_PORT}"),
                    *("--host", FIRST_IP, "--port", str(ROUTER_PORT), "--no-warm-up"),
                    *("--auto-backend-ports", "--queue-timeout", "60", "--grace", "5"),
                    *("--drain", "2"),  # a request still waiting holds the HTTP server that long
                    *("--state-dir", str(tmp_path / "state")),
                ],
                env=_env(),
                stdout=up_log,
                stderr=subprocess.STDOUT,
            )
        started.append(up)
        url = f"http://{FIRST_IP}:{ROUTER_PORT}"

        def serving() -> bool:
            assert up.poll() is None, log.read_text(errors="replace")
            return "rosterd serving" in log.read_text(errors="replace")

        _wait(serving, 180, "rosterd up to serve (it waits for the worker to join)")
        status = lab.http("GET", f"{url}/status")["body"]
        assert status["nodes"]["far"]["connected"] is True, status
        role = next(iter(status["nodes"]["far"]["roles"]))  # the role planned on the second host
        answer = lab.http(
            "POST", f"{url}/v1/completions", {"model": role, "prompt": "Hi", "max_tokens": 4}
        )
        assert answer["status"] == 200, answer
        info = lab.http("GET", f"{url}/status")["body"]["nodes"]["far"]["roles"][role]
        assert info["base_url"].startswith(f"http://{SECOND_IP}:")
        second_ns = _netns_inode(f"/run/netns/{lab.second}")
        servers = list(lab.llama_servers(lab.second))
        assert len(servers) == 1, servers
        (server,) = servers
        assert _netns_inode(f"/proc/{server}/ns/net") == second_ns  # it runs on the second host
        assert {ip for ip, _ in _listening(server)} == {SECOND_IP}  # on that host's address

        # The second host's Ray processes stop: its role is lost, and moves to the first host.
        _stop_group(worker)
        _wait(lambda: server not in lab.pids(lab.second), 60, "the role's backend to end")

        def lost() -> bool:
            events = lab.http("GET", f"{url}/rosterd/events")["body"]["events"]
            return any(e["kind"] == "lost" and e["role"] == role for e in events)

        _wait(lost, 60, "the loss to be recorded")
        # Asked while the role is lost (or already moved): served from the first host.
        answer = lab.http(
            "POST", f"{url}/v1/completions", {"model": role, "prompt": "Hi", "max_tokens": 4}
        )
        assert answer["status"] == 200, answer
        events = lab.http("GET", f"{url}/rosterd/events")["body"]["events"]
        moved = [e for e in events if e["kind"] == "moved"]
        assert [(e["role"], e["node"]) for e in moved] == [(role, "far")], events
        assert moved[0]["cause"].startswith("moved to node near: node far is lost"), moved
        status = lab.http("GET", f"{url}/status")["body"]
        assert status["nodes"]["far"]["connected"] is False, status
        assert status["nodes"]["far"]["roles"] == {}, status
        near = status["nodes"]["near"]["roles"]
        assert sorted(near) == ["chat", "code"], status
        assert near[role]["phase"] == "ready", status
        assert near[role]["base_url"].startswith(f"http://{FIRST_IP}:"), status
        port = int(near[role]["base_url"].rsplit(":", 1)[1].split("/")[0])
        first_ns = _netns_inode(f"/run/netns/{lab.first}")
        moved_servers = [
            pid for pid in lab.llama_servers(lab.first) if (FIRST_IP, port) in _listening(pid)
        ]
        assert len(moved_servers) == 1, moved_servers
        (moved_server,) = moved_servers
        assert _netns_inode(f"/proc/{moved_server}/ns/net") == first_ns  # now on the first host
        assert {ip for ip, _ in _listening(moved_server)} == {FIRST_IP}
        _stop_group(up, 90)  # SIGTERM: rosterd drains and stops everything
        assert up.returncode == 0, log.read_text(errors="replace")
        assert lab.llama_servers(lab.first) == set()  # rosterd stopped them all
        said = " ".join(log.read_text(errors="replace").split())
        assert "node far is lost" in said
        assert f"role {role}: moved to node near: node far is lost" in said
        assert said.rstrip().endswith("rosterd stopped; no backend left running")
    finally:
        for proc in reversed(started):
            _stop_group(proc)
        shutil.rmtree(ray_tmp, ignore_errors=True)
