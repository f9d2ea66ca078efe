"""What a remote node costs: the router's overhead to a role on a Ray node against one on this
machine, and how long a node's loss takes to show, in one run.

    .venv/bin/python bench/fleet_bench.py [--requests N] [--rounds R] [--max-tokens T]
    .venv/bin/python bench/fleet_bench.py --replicas [--requests N] [--service-ms MS]

Needs the ``ray`` extra and the llama-server binary. It starts a Ray test
cluster on this machine (``ray.cluster_utils``: a head at 127.0.0.2 and a node
at 127.0.0.3, standing for another machine) and ``rosterd up --ray-address``
(a subprocess, as users run it) on a fleet of two nodes: ``local`` at
127.0.0.1 (no Ray node there: this machine's supervisor runs it) and
``remote`` at 127.0.0.3 (run by its node agent on that Ray node). Two
interactive roles of the tiny GGUF (0.3 GiB each) are planned one per node, and
both fit on ``local`` alone. Then, alternating over
``--rounds`` (a shared machine's load drifts), ``N`` sequential
``/v1/completions`` to each role through the router and straight to its
backend; it prints p50/p99 per path and the router's added latency per role.
Requests never pass through Ray, so both overheads should match.

Loss: it removes the Ray node of ``remote`` and measures the time from the
removal to the role's ``lost`` event in ``/rosterd/events`` (loss detected ->
role marked lost), then asks for the role at once and measures the time from
the removal to that request's answer (200), served on ``local`` after the
run-time re-plan moved the role there and loaded it (a cold start of the
tiny GGUF included).

Replicas (``--replicas``): the same two nodes serve ``one`` (one copy) and ``two``
(``replicas: 2``, a copy on each node), both backends the stand-in of
``tests/support/fake_llama_server.py`` with a fixed service time (``--service-ms``, one slot:
a copy serves at most 1000 / MS requests a second). It prints the throughput of ``N``
requests at 8 connections to each role and their ratio (two copies should give about
twice one's), then the routing cost at one connection: the p50 through the router to
``two`` minus that to ``one`` (over ``--rounds``, alternating), and the in-process
time of the choice itself (``prefix_key`` and ``choose_copy`` on two copies).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx

ROOT = Path(__file__).resolve().parent.parent
HEAD_IP, REMOTE_IP = "127.0.0.2", "127.0.0.3"


def write_tiny_gguf(path: Path) -> Path:
    """The project's tiny random llama GGUF (``scripts/make_tiny_gguf.py``)."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_gguf", ROOT / "scripts" / "make_tiny_gguf.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    writer = cast(Callable[[Path, int], Path], module.write_tiny_gguf)
    return writer(path, 7)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_lab(work: Path) -> list[str]:
    """Roster, overlay and fleet files; ``rosterd up``'s arguments for them."""
    model = write_tiny_gguf(work / "tiny.gguf")
    roles = ("near", "far")
    roster = {
        "roster": [
            {"id": r, "role": "bench", "name": r, "repo": f"local/{r}", "ram_gb": 0.3}
            | {"backend": "llama.cpp", "status": "live"}
            for r in roles
        ]
    }
    nodes = [
        {"name": name, "memory_gb": 2, "reserved_gb": 1, "platform": "linux-x86_64"}
        | {"flavors": ["llamacpp"], "address": address}
        for name, address in (("local", "127.0.0.1"), ("remote", REMOTE_IP))
    ]
    source = {"path": str(model), "ctx_size": 512, "extra_args": ["-t", "1"]}
    fleet = {"nodes": nodes, "models": dict.fromkeys(roles, source)}
    (work / "roster.yaml").write_text(json.dumps(roster))
    (work / "overlay.yaml").write_text(
        json.dumps({"latency_class": dict.fromkeys(roles, "interactive")})
    )
    (work / "fleet.yaml").write_text(json.dumps(fleet))
    return [
        *(str(work / "roster.yaml"), "--overlay", str(work / "overlay.yaml")),
        *("--fleet", str(work / "fleet.yaml"), "--state-dir", str(work / "state")),
        *("--auto-backend-ports", "--drain", "2"),
    ]


async def one(client: httpx.AsyncClient, base: str, model: str, max_tokens: int) -> float:
    body = {"model": model, "prompt": "Hello", "max_tokens": max_tokens, "temperature": 0.0}
    started = time.perf_counter()
    response = await client.post(base + "/v1/completions", json=body)
    response.raise_for_status()
    response.json()
    return time.perf_counter() - started


async def latency(base: str, model: str, n: int, max_tokens: int) -> list[float]:
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        for _ in range(5):  # warm the connection and the server
            await one(client, base, model, max_tokens)
        return [await one(client, base, model, max_tokens) for _ in range(n)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def wait_health(router: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the router answers ``/health``."""
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        for _ in range(1200):
            if proc.poll() is not None:
                raise SystemExit(f"rosterd up exited with {proc.returncode}")
            try:
                if (await client.get(router + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                await asyncio.sleep(0.1)


async def wait_serving(router: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Wait for ``/health``, load both roles, return ``/status``."""
    await wait_health(router, proc)
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        for role in ("near", "far"):
            (await client.post(router + f"/rosterd/load/{role}")).raise_for_status()
        status: dict[str, Any] = (await client.get(router + "/status")).json()
        return status


async def measure(router: str, status: dict[str, Any], args: argparse.Namespace) -> None:
    """Alternate the four paths over the rounds, then pool each path's latencies."""
    role_on = {
        role: node for node in ("local", "remote") for role in status["nodes"][node]["roles"]
    }
    paths: dict[str, tuple[str, str]] = {}
    for role, node in sorted(role_on.items(), key=lambda item: item[1]):
        info = status["nodes"][node]["roles"][role]
        served = info["base_url"]
        paths[f"{node} direct"] = (served, role)
        paths[f"{node} router"] = (router, role)
    lat: dict[str, list[float]] = {p: [] for p in paths}
    for round_no in range(args.rounds):
        order = list(paths) if round_no % 2 == 0 else list(reversed(paths))
        for name in order:
            base, model = paths[name]
            lat[name] += await latency(base, model, args.requests, args.max_tokens)
    print(
        f"{args.rounds} rounds x {args.requests} sequential requests per path, "
        f"max_tokens {args.max_tokens}"
    )
    print(f"{'':16} {'p50 ms':>8} {'p99 ms':>8}")
    for name in paths:
        print(f"{name:16} {1000 * pct(lat[name], 0.5):8.2f} {1000 * pct(lat[name], 0.99):8.2f}")
    for node in ("local", "remote"):
        added = pct(lat[f"{node} router"], 0.5) - pct(lat[f"{node} direct"], 0.5)
        print(f"router overhead to the {node} role (p50): {1000 * added:+.2f} ms")


async def time_loss(router: str, cluster: Any, worker: Any, status: dict[str, Any]) -> None:
    """Remove the remote role's Ray node; time until its role is marked lost, and until a
    request for it asked then is served on its new node."""
    (role,) = status["nodes"]["remote"]["roles"]
    removed_at = time.time()
    cluster.remove_node(worker)
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        for _ in range(1200):
            events = (await client.get(router + "/rosterd/events")).json()["events"]
            lost = [e for e in events if e["kind"] == "lost"]
            if lost:
                print(
                    f"node loss -> role {lost[0]['role']} marked lost: "
                    f"{lost[0]['at'] - removed_at:.2f} s (cause: {lost[0]['cause']})"
                )
                break
            await asyncio.sleep(0.05)
        else:
            print("node loss -> role marked lost: not seen within 60 s")
            return
        body = {"model": role, "prompt": "Hello", "max_tokens": 4, "temperature": 0.0}
        answer = await client.post(router + "/v1/completions", json=body)
        served_at = time.time()
        now = (await client.get(router + "/status")).json()["nodes"]
        where = [name for name, node in now.items() if role in node.get("roles", {})]
        where = [n for n in where if now[n]["roles"][role].get("phase") == "ready"]
        print(
            f"node loss -> first request served on its new node ({', '.join(where) or '?'}): "
            f"{served_at - removed_at:.2f} s (HTTP {answer.status_code})"
        )


def write_replicas_lab(work: Path) -> list[str]:
    """The replicas lab: roles ``one`` (one copy) and ``two`` (two), on the stand-in."""
    argv = write_lab(work)
    roster = {
        "roster": [
            {"id": r, "role": "bench", "name": r, "repo": f"local/{r}", "ram_gb": 0.3}
            | {"backend": "llama.cpp", "status": "live"}
            for r in ("one", "two")
        ]
    }
    (work / "roster.yaml").write_text(json.dumps(roster))
    (work / "overlay.yaml").write_text(json.dumps({"latency_class": {}}))
    fleet = json.loads((work / "fleet.yaml").read_text())
    source = {"path": str(work / "tiny.gguf"), "parallel": 1}
    fleet["models"] = {"one": source, "two": source | {"replicas": 2}}
    (work / "fleet.yaml").write_text(json.dumps(fleet))
    return argv


async def throughput(router: str, model: str, n: int, connections: int) -> float:
    """Requests a second for ``n`` short completions over ``connections`` at once."""
    todo = iter(range(n))
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:

        async def worker() -> None:
            for i in todo:
                body = {"model": model, "prompt": f"Say {i}", "max_tokens": 1}
                (await client.post(router + "/v1/completions", json=body)).raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return n / (time.perf_counter() - started)


def choice_cost_s(iterations: int = 20000) -> float:
    """Seconds per request of the choice among two copies (prefix hash and ring walk)."""
    from rosterd.replica_choice import Copy, CopyState, choose_copy, prefix_key

    copies = [Copy("local", CopyState.READY, 1, 1), Copy("remote", CopyState.READY, 0, 1)]
    body: dict[str, object] = {"model": "two", "prompt": "Say something " * 40}
    started = time.perf_counter()
    for _ in range(iterations):
        choose_copy(copies, prefix_key(body))
    return (time.perf_counter() - started) / iterations


async def measure_replicas(router: str, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        for role in ("one", "two"):
            (await client.post(router + f"/rosterd/load/{role}")).raise_for_status()
        status = (await client.get(router + "/status")).json()
    print(f"copies: {status.get('replicas')}; service time {args.service_ms:g} ms, one slot")
    await throughput(router, "two", 16, 8)  # warm both copies' connections
    rates = {role: await throughput(router, role, args.requests, 8) for role in ("one", "two")}
    for role, rate in rates.items():
        print(f"{role}: {rate:7.1f} requests/s ({args.requests} requests at 8 connections)")
    print(f"two copies / one copy: {rates['two'] / rates['one']:.2f}x")
    lat: dict[str, list[float]] = {"one": [], "two": []}
    for round_no in range(args.rounds):
        for role in ("one", "two") if round_no % 2 == 0 else ("two", "one"):
            lat[role] += await latency(router, role, args.requests // 4, 1)
    added = pct(lat["two"], 0.5) - pct(lat["one"], 0.5)
    print(
        f"c=1 p50: one {1000 * pct(lat['one'], 0.5):.2f} ms, two {1000 * pct(lat['two'], 0.5):.2f}"
        f" ms; added routing cost (p50 difference): {1000 * added:+.3f} ms"
    )
    print(f"the choice itself, in process: {1e6 * choice_cost_s():.1f} us per request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--replicas", action="store_true", help="measure replicas instead")
    parser.add_argument("--service-ms", type=float, default=50.0)
    args = parser.parse_args()
    if args.replicas:
        # The stand-in, for this process's supervisor and (inherited by the cluster's
        # processes, started below) the node agent's.
        wrapper_dir = Path(tempfile.mkdtemp(prefix="rosterd-fleet-bench-bin-"))
        wrapper = wrapper_dir / "llama-server"
        fake = ROOT / "tests" / "support" / "fake_llama_server.py"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
        wrapper.chmod(0o755)
        os.environ["ROSTERD_LLAMA_SERVER"] = str(wrapper)
        os.environ["FAKE_LLAMA_SERVICE_S"] = str(args.service_ms / 1000)
    from ray.cluster_utils import Cluster

    cluster: Any = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": HEAD_IP},
    )
    proc: subprocess.Popen[bytes] | None = None
    try:
        worker = cluster.add_node(num_cpus=1, node_ip_address=REMOTE_IP)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory(prefix="rosterd-fleet-bench-") as tmp:
            work = Path(tmp)
            port = free_port()
            rosterd = Path(sys.executable).with_name("rosterd")
            argv = [str(rosterd)] if rosterd.exists() else [sys.executable, "-m", "rosterd.cli"]
            with (work / "up.log").open("wb") as log:
                proc = subprocess.Popen(
                    [
                        *argv,
                        "up",
                        *(write_replicas_lab(work) if args.replicas else write_lab(work)),
                        "--port",
                        str(port),
                        "--ray-address",
                        cluster.address,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, NO_COLOR="1"),
                )
            router = f"http://127.0.0.1:{port}"
            try:
                if args.replicas:
                    asyncio.run(wait_health(router, proc))
                    asyncio.run(measure_replicas(router, args))
                else:
                    status = asyncio.run(wait_serving(router, proc))
                    asyncio.run(measure(router, status, args))
                    asyncio.run(time_loss(router, cluster, worker, status))
            finally:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=120)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
