"""What the router costs: latency and throughput through ``rosterd up`` vs straight to llama-server.

    .venv/bin/python bench/router_bench.py [--requests N] [--concurrency C] [--max-tokens T]
                                           [--rounds R]

In one run: writes a tiny random GGUF, starts ``rosterd up`` on a one-role
roster (a subprocess, as users run it), makes the role resident, reads its
backend's address from ``/status``, then sends the same small
``/v1/completions`` requests (``max_tokens`` small, temperature 0) to both:

- latency: ``N`` requests one after another; p50 and p99 in milliseconds, and
  the router's added latency (routed minus direct);
- throughput: ``N`` requests with ``C`` in flight; requests per second.

Direct and routed measurements alternate over ``--rounds`` rounds, because
the load of a shared machine drifts; latencies are pooled, throughput is the
median of the rounds.

It prints both sides and the ratios (routed / direct), then stops ``rosterd
up`` with SIGINT. Every loop is bounded by ``--requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx

ROOT = Path(__file__).resolve().parent.parent


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


def start_rosterd(work: Path, port: int) -> subprocess.Popen[bytes]:
    """``rosterd up`` on a one-role roster serving the tiny GGUF with 4 slots."""
    model = write_tiny_gguf(work / "tiny.gguf")
    roster = {
        "roster": [
            {
                "id": "bench",
                "role": "router benchmark",
                "name": "tiny-bench",
                "repo": "local/tiny-bench",
                "ram_gb": 0.1,
                "backend": "llama.cpp",
                "port": 18599,
                "status": "live",
            }
        ]
    }
    fleet = {
        "nodes": [
            {
                "name": "box",
                "memory_gb": 4,
                "reserved_gb": 1,
                "platform": "linux-x86_64",
                "flavors": ["llamacpp"],
            }
        ],
        "models": {"tiny-bench": {"path": str(model), "ctx_size": 512, "parallel": 4}},
    }
    (work / "roster.yaml").write_text(json.dumps(roster))
    (work / "fleet.yaml").write_text(json.dumps(fleet))
    rosterd = Path(sys.executable).with_name("rosterd")
    argv = [str(rosterd)] if rosterd.exists() else [sys.executable, "-m", "rosterd.cli"]
    log = (work / "up.log").open("wb")
    return subprocess.Popen(
        [
            *argv,
            "up",
            str(work / "roster.yaml"),
            "--fleet",
            str(work / "fleet.yaml"),
            "--port",
            str(port),
            "--state-dir",
            str(work / "state"),
            "--auto-backend-ports",
            "--max-concurrency",
            "64",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, NO_COLOR="1"),
    )


async def wait_ready(router: str, proc: subprocess.Popen[bytes]) -> str:
    """Wait for ``/health``, load the role, return its backend's base URL."""
    async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"rosterd up exited with {proc.returncode}")
            try:
                if (await client.get(router + "/health")).status_code == 200:
                    break
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
        (await client.post(router + "/rosterd/load/bench")).raise_for_status()
        status = (await client.get(router + "/status")).json()
        return str(status["nodes"]["box"]["roles"]["bench"]["base_url"])


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


async def throughput(base: str, model: str, n: int, concurrency: int, max_tokens: int) -> float:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=60, limits=limits) as client:
        remaining = n

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await one(client, base, model, max_tokens)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(router: str, direct: str, args: argparse.Namespace) -> None:
    """Alternate direct and routed rounds (the machine's load drifts), then pool them."""
    n, c, t = args.requests, args.concurrency, args.max_tokens
    sides = {"direct": (direct, "tiny-bench"), "router": (router, "bench")}
    lat: dict[str, list[float]] = {name: [] for name in sides}
    rps: dict[str, list[float]] = {name: [] for name in sides}
    for round_no in range(args.rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for name in order:
            base, model = sides[name]
            lat[name] += await latency(base, model, n, t)
            rps[name].append(await throughput(base, model, n, c, t))
    results = {
        name: {
            "p50_ms": 1000 * pct(lat[name], 0.50),
            "p99_ms": 1000 * pct(lat[name], 0.99),
            "mean_ms": 1000 * statistics.fmean(lat[name]),
            "rps": statistics.median(rps[name]),
        }
        for name in sides
    }
    d, r = results["direct"], results["router"]
    print(
        f"{args.rounds} rounds x {n} requests per side, max_tokens {t}; "
        f"throughput with {c} in flight (median of rounds)"
    )
    print(f"{'':8} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'req/s':>9}")
    for name in sides:
        x = results[name]
        print(f"{name:8} {x['p50_ms']:9.2f} {x['p99_ms']:9.2f} {x['mean_ms']:9.2f} {x['rps']:9.1f}")
    print(
        f"added latency by the router: p50 {r['p50_ms'] - d['p50_ms']:+.2f} ms, "
        f"p99 {r['p99_ms'] - d['p99_ms']:+.2f} ms"
    )
    print(
        f"ratios router/direct: p50 {r['p50_ms'] / d['p50_ms']:.2f}x, "
        f"p99 {r['p99_ms'] / d['p99_ms']:.2f}x, throughput {r['rps'] / d['rps']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=100, help="requests per round")
    parser.add_argument("--concurrency", type=int, default=8, help="in flight for throughput")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per completion")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rosterd-bench-") as tmp:
        port = free_port()
        proc = start_rosterd(Path(tmp), port)
        router = f"http://127.0.0.1:{port}"
        try:
            direct = asyncio.run(wait_ready(router, proc))
            asyncio.run(measure(router, direct, args))
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
