"""What the router costs: ``rosterd up`` vs straight to the backend vs nginx ``proxy_pass``.

    apt-get install -y nginx wrk     # Debian's packages; optional, see below
    .venv/bin/python bench/router_bench.py [--duration S] [--rounds R]
                                           [--connections 1,32] [--loadgen auto|wrk|python]

In one run, against one fixed-response upstream (the backend answers every
request with the same small completion JSON, so what is measured is the path,
not a model):

- ``direct``: the upstream itself;
- ``rosterd``: ``rosterd up`` (a subprocess, as users run it) on a one-role
  roster with ``--max-concurrency 64``, whose "llama-server" is the upstream
  (``ROSTERD_LLAMA_SERVER`` points at a stand-in that starts it on the host
  and port rosterd picks), so rosterd supervises and routes to it;
- ``nginx``: nginx ``proxy_pass`` to the same upstream with a keep-alive
  upstream pool, where ``nginx`` is installed (skipped, and said so, if not).

The upstream is nginx ``return 200`` where nginx is installed, else a small
asyncio server (then ``direct`` may be slower than nginx would be; it says so).
Every server here runs one worker process; nginx runs from a temporary prefix
with its own config, pid file and loopback ports, and is stopped by its pid.

Each side gets the same ``POST /v1/completions`` with 1 and 32 connections
for ``--duration`` seconds, sides rotating over ``--rounds`` rounds because the
load of a shared machine drifts; the figures are the medians of the rounds:
req/s, p50 and p99 in milliseconds, the latency rosterd adds at p50 over
direct, and rosterd's req/s as a share of direct's and nginx's. The load
comes from ``wrk`` (one thread) where it is installed, else from an asyncio
load generator in this process (uvloop where installed) whose ceiling is the
``direct`` row: a side far below it is not limited by the generator.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httptools
import httpx

ROOT = Path(__file__).resolve().parent.parent

#: The request every side gets, and the upstream's fixed answer to it.
REQUEST_BODY = b'{"model":"bench","prompt":"Hello","max_tokens":4,"temperature":0.0}'
ANSWER_BODY = (
    b'{"id":"cmpl-bench","object":"text_completion","model":"tiny-bench",'
    b'"choices":[{"index":0,"text":" Hi","finish_reason":"length"}]}'
)

UPSTREAM_CONF = """
worker_processes 1;
pid {prefix}/upstream.pid;
error_log {prefix}/upstream-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    server {{
        listen {host}:{port} reuseport;
        default_type application/json;
        location / {{ return 200 '{answer}'; }}
    }}
}}
"""

PROXY_CONF = """
worker_processes 1;
pid {prefix}/proxy.pid;
error_log {prefix}/proxy-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    upstream backend {{ server {upstream}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
done = function(summary, latency, requests)
  io.write(string.format("RESULT %d %d %d %d %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), summary.errors.status
    + summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout))
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_tiny_gguf(path: Path) -> Path:
    """The project's tiny random llama GGUF (``scripts/make_tiny_gguf.py``): the role's
    weights file, which rosterd checks before it starts the stand-in."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_gguf", ROOT / "scripts" / "make_tiny_gguf.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    writer = cast(Callable[[Path, int], Path], module.write_tiny_gguf)
    return writer(path, 7)


# ---- the upstream --------------------------------------------------------------------------


class FixedAnswer(asyncio.Protocol):
    """The upstream without nginx: answers every HTTP/1.1 request with ``ANSWER_BODY``."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = b""
        self.answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(ANSWER_BODY), ANSWER_BODY)
        )

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in self.buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(self.answer)


def run_python_upstream(host: str, port: int) -> None:
    """Serve :class:`FixedAnswer` on ``host:port`` until SIGTERM (uvloop where installed)."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(FixedAnswer, host, port, reuse_address=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    run(serve())


def upstream_child(argv: list[str]) -> None:
    """The stand-in llama-server: takes rosterd's ``--host H --port P`` (ignores the rest)
    and becomes nginx (``exec``, so rosterd's pid is nginx's master) or the asyncio server."""
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    nginx = os.environ.get("BENCH_NGINX", "")
    if not nginx:
        run_python_upstream(host, port)
        return
    prefix = Path(os.environ["BENCH_PREFIX"])
    conf = prefix / "upstream.conf"
    answer = ANSWER_BODY.decode()
    conf.write_text(UPSTREAM_CONF.format(prefix=prefix, host=host, port=port, answer=answer))
    os.execv(
        nginx, [nginx, "-e", "stderr", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
    )


# ---- rosterd and the nginx proxy -----------------------------------------------------------


def start_rosterd(work: Path, port: int, nginx: str | None) -> subprocess.Popen[bytes]:
    """``rosterd up`` on a one-role roster whose llama-server is the upstream stand-in."""
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
    stand_in = work / "llama-server"
    stand_in.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" upstream "$@"\n'
    )
    stand_in.chmod(0o755)
    rosterd = Path(sys.executable).with_name("rosterd")
    argv = [str(rosterd)] if rosterd.exists() else [sys.executable, "-m", "rosterd.cli"]
    env = dict(
        os.environ,
        NO_COLOR="1",
        ROSTERD_LLAMA_SERVER=str(stand_in),
        BENCH_NGINX=nginx or "",
        BENCH_PREFIX=str(work),
    )
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
        stdout=(work / "up.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
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


@contextlib.contextmanager
def nginx_proxy(nginx: str, work: Path, upstream: str) -> Iterator[str]:
    """nginx ``proxy_pass`` to ``upstream`` (``host:port``); yields its base URL."""
    port = free_port()
    conf = work / "proxy.conf"
    conf.write_text(PROXY_CONF.format(prefix=work, upstream=upstream, port=port))
    proc = subprocess.Popen(
        [nginx, "-e", "stderr", "-p", str(work), "-c", str(conf), "-g", "daemon off;"],
        stderr=(work / "proxy.log").open("wb"),
    )
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)  # nginx's fast shutdown, master and its worker
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- the load ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One measurement: requests per second, p50 and p99 in milliseconds, failed requests."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def wrk_run(wrk: str, script: Path, url: str, connections: int, duration_s: float) -> Run:
    out = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(duration_s))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            url + "/v1/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    requests, duration_us, p50_us, p99_us, errors = (int(x) for x in line.split()[1:])
    return Run(requests / (duration_us / 1e6), p50_us / 1000, p99_us / 1000, errors)


class _LoadConnection(asyncio.Protocol):
    """One keep-alive connection of the asyncio load generator: one request at a time,
    answers parsed by httptools (llhttp, a C parser: chunked and Content-Length bodies)."""

    def __init__(self, request: bytes, latencies: list[float], deadline: float) -> None:
        self.request = request
        self.latencies = latencies
        self.deadline = deadline
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._send()

    def _send(self) -> None:
        self.sent = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() != 200:
            self.errors += 1
        now = time.perf_counter()
        self.latencies.append(now - self.sent)
        if now < self.deadline:
            self._send()
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def python_load(url: str, connections: int, duration_s: float) -> Run:
    host, port = url.removeprefix("http://").split(":")
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(REQUEST_BODY), REQUEST_BODY)
    )
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + duration_s
    conns = []
    for _ in range(connections):
        _, proto = await loop.create_connection(
            lambda: _LoadConnection(request, latencies, deadline), host, int(port)
        )
        conns.append(proto)
    await asyncio.gather(*(c.done for c in conns))
    took = time.perf_counter() - started
    return Run(
        len(latencies) / took,
        1000 * pct(latencies, 0.50),
        1000 * pct(latencies, 0.99),
        sum(c.errors for c in conns),
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(coro: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run``, on uvloop's event loop where uvloop is installed (it is no
    dependency of rosterd; the bench's own clients go faster on it)."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


# ---- the run -------------------------------------------------------------------------------


def measure(
    sides: dict[str, str], args: argparse.Namespace, wrk: str | None, work: Path
) -> dict[tuple[str, int], list[Run]]:
    script = work / "bench.lua"
    script.write_text(WRK_SCRIPT.format(body=REQUEST_BODY.decode()))

    def once(url: str, c: int, duration_s: float) -> Run:
        if wrk:
            return wrk_run(wrk, script, url, c, duration_s)
        result: list[Run] = []

        async def go() -> None:
            result.append(await python_load(url, c, duration_s))

        run(go())
        return result[0]

    for url in sides.values():  # warm every path (connections, caches)
        once(url, 8, 1.0)
    runs: dict[tuple[str, int], list[Run]] = {}
    names = list(sides)
    for round_no in range(args.rounds):
        for c in args.connections:
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                result = once(sides[name], c, args.duration)
                runs.setdefault((name, c), []).append(result)
                print(
                    f"  round {round_no + 1} c={c:<3} {name:8} {result.rps:9.0f} req/s "
                    f"p50 {result.p50_ms:6.2f} ms p99 {result.p99_ms:6.2f} ms",
                    file=sys.stderr,
                )
    return runs


def report(runs: dict[tuple[str, int], list[Run]], args: argparse.Namespace, how: str) -> None:
    def med(name: str, c: int, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in runs[(name, c)]))

    names = list(dict.fromkeys(name for name, _ in runs))
    print(how)
    print(f"{args.rounds} rounds x {args.duration:g} s per side; medians of the rounds")
    print(f"{'path':10} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
    for c in args.connections:
        for name in names:
            errors = sum(r.errors for r in runs[(name, c)])
            print(
                f"{name:10} {c:5} {med(name, c, 'rps'):9.0f} {med(name, c, 'p50_ms'):8.2f} "
                f"{med(name, c, 'p99_ms'):8.2f} {errors:6}"
            )
    for c in args.connections:
        added = med("rosterd", c, "p50_ms") - med("direct", c, "p50_ms")
        line = (
            f"c={c}: rosterd adds {added:+.2f} ms at p50; req/s "
            f"{med('rosterd', c, 'rps') / med('direct', c, 'rps'):.1%} of direct"
        )
        if "nginx" in names:
            line += f", {med('rosterd', c, 'rps') / med('nginx', c, 'rps'):.1%} of nginx proxy_pass"
        print(line)


def main() -> None:
    if sys.argv[1:2] == ["upstream"]:
        upstream_child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rotating rounds per side")
    parser.add_argument(
        "--connections",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 32],
        help="comma-separated connection counts",
    )
    parser.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto")
    args = parser.parse_args()
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None
    )
    wrk = shutil.which("wrk") if args.loadgen != "python" else None
    if args.loadgen == "wrk" and not wrk:
        raise SystemExit("wrk is not installed (apt-get install -y wrk)")
    loop_name = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    how = (
        "load: wrk, one thread"
        if wrk
        else f"load: this script's {loop_name} load generator (wrk not installed); its ceiling "
        "is the direct row, so a side well below direct is not limited by it"
    )
    how += "; upstream: " + ("nginx return 200" if nginx else "asyncio fixed answer (no nginx)")
    with tempfile.TemporaryDirectory(prefix="rosterd-bench-") as tmp:
        work = Path(tmp)
        port = free_port()
        proc = start_rosterd(work, port, nginx)
        router = f"http://127.0.0.1:{port}"
        try:
            holder: list[str] = []

            async def ready() -> None:
                holder.append(await wait_ready(router, proc))

            asyncio.run(ready())
            direct = holder[0]
            sides = {"direct": direct, "rosterd": router}
            with contextlib.ExitStack() as stack:
                if nginx:
                    upstream = direct.removeprefix("http://")
                    sides["nginx"] = stack.enter_context(nginx_proxy(nginx, work, upstream))
                else:
                    print("nginx is not installed: no proxy_pass row (apt-get install -y nginx)")
                runs = measure(sides, args, wrk, work)
            report(runs, args, how)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
