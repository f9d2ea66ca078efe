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
  upstream pool, where ``nginx`` is installed (skipped, and said so, if not);
- ``msg-pass`` and ``msg-xlat``: the same Anthropic Messages request
  (``POST /v1/messages``, one short user message, ``max_tokens`` 4) through the
  router app served as ``rosterd up`` serves it (``create_app``, uvicorn configured
  by ``rosterd.up.listen.server_config`` on ``bind_listener``'s socket, the run's
  ``RouterConfig``, ``--max-concurrency 64``), in a child process of this script
  with two roles over the same upstream: ``msg-pass`` is a llama.cpp role, whose
  backend serves Messages itself, so the request passes through; ``msg-xlat`` is
  an mlx_lm role (no native dialect), so the router translates it to chat
  completions and the answer back. mlx_lm.server needs Apple hardware, so the
  translated path is measured on this stand-in role; the difference of the two
  rows is what the translation costs;
- ``keys``: a second ``rosterd up`` as ``rosterd``, with ``--keys`` (one key with the
  ``use`` scope, a model list and limits, so the scope, model and limit checks run) and
  its usage kept (the usage database in its state folder, Prometheus counters by key);
  the requests carry the key. Its difference from ``rosterd`` is what keys and usage
  cost.

The upstream is nginx ``return 200`` where nginx is installed, else a small
asyncio server (then ``direct`` may be slower than nginx would be; it says so).
It answers ``/v1/chat/completions`` with a fixed small ``chat.completion``,
``/v1/messages`` with a fixed small Anthropic message, any other path with the
completion.
Every server here runs one worker process; nginx runs from a temporary prefix
with its own config, pid file and loopback ports, and is stopped by its pid.

Each side gets the same ``POST /v1/completions`` (the ``msg-*`` sides their
Messages request) with 1 and 32 connections for ``--duration`` seconds, sides
rotating over ``--rounds`` rounds because the load of a shared machine drifts;
the figures are the medians of the rounds: req/s, p50 and p99 in milliseconds,
the latency rosterd adds at p50 over direct, rosterd's req/s as a share of
direct's and nginx's, and the latency the Messages translation adds at p50
over the passthrough (``msg-xlat`` less ``msg-pass``). The load
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
from typing import Any, ClassVar, cast

import httptools
import httpx

from rosterd.adapters import adapter_for
from rosterd.backends.values import Endpoint, ProbeResult
from rosterd.keys import ApiKey, KeyLimits, Scope, key_digest, new_token, render_keys
from rosterd.metrics import RosterdMetrics
from rosterd.router import RoleRoute, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeConcurrency, SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.up.listen import NoSignalServer, bind_listener, server_config
from rosterd.up.options import UpOptions

ROOT = Path(__file__).resolve().parent.parent

#: The request every side gets, and the upstream's fixed answer to it.
REQUEST_BODY = b'{"model":"bench","prompt":"Hello","max_tokens":4,"temperature":0.0}'
ANSWER_BODY = (
    b'{"id":"cmpl-bench","object":"text_completion","model":"tiny-bench",'
    b'"choices":[{"index":0,"text":" Hi","finish_reason":"length"}]}'
)
#: The Messages request of the ``msg-*`` sides (``%s``: the role, whose id is the model).
MESSAGES_BODY = b'{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":"Hello"}]}'
#: The upstream's fixed answer to ``POST /v1/chat/completions`` (what ``msg-xlat`` becomes).
CHAT_ANSWER_BODY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","model":"tiny-bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},'
    b'"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
    b'"total_tokens":6}}'
)
#: The upstream's fixed answer to ``POST /v1/messages`` (what ``msg-pass`` passes through).
MESSAGE_ANSWER_BODY = (
    b'{"id":"msg_bench","type":"message","role":"assistant","model":"tiny-bench",'
    b'"content":[{"type":"text","text":"Hi"}],"stop_reason":"max_tokens",'
    b'"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}'
)
#: The upstream's answer by request path (any other path: ``ANSWER_BODY``).
ANSWERS = {b"/v1/chat/completions": CHAT_ANSWER_BODY, b"/v1/messages": MESSAGE_ANSWER_BODY}

#: The router child's roles over the upstream: the passthrough (llama.cpp serves Messages
#: itself) and the translation (mlx_lm serves chat completions only).
MESSAGE_ROLES = {"msg-pass": InferFlavor.LLAMACPP, "msg-xlat": InferFlavor.MLX_LM}

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
        location = /v1/chat/completions {{ return 200 '{chat}'; }}
        location = /v1/messages {{ return 200 '{message}'; }}
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
{auth}wrk.body = '{body}'
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


def _http_answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


class FixedAnswer(asyncio.Protocol):
    """The upstream without nginx: answers every HTTP/1.1 request with its path's fixed
    answer (``ANSWERS``, else ``ANSWER_BODY``)."""

    answers: ClassVar[dict[bytes, bytes]] = {p: _http_answer(b) for p, b in ANSWERS.items()}
    default = _http_answer(ANSWER_BODY)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            request_line, *headers = self.buffer[:end].split(b"\r\n")
            path = request_line.split(b" ")[1] if request_line.count(b" ") >= 2 else b""
            for line in headers:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(self.answers.get(path, self.default))


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
    conf.write_text(
        UPSTREAM_CONF.format(
            prefix=prefix,
            host=host,
            port=port,
            answer=ANSWER_BODY.decode(),
            chat=CHAT_ANSWER_BODY.decode(),
            message=MESSAGE_ANSWER_BODY.decode(),
        )
    )
    os.execv(
        nginx, [nginx, "-e", "stderr", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
    )


# ---- rosterd and the nginx proxy -----------------------------------------------------------


def start_rosterd(
    work: Path, port: int, nginx: str | None, keys: Path | None = None
) -> subprocess.Popen[bytes]:
    """``rosterd up`` on a one-role roster whose llama-server is the upstream stand-in
    (with ``--keys keys`` when given)."""
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
            *(["--keys", str(keys)] if keys is not None else []),
        ],
        stdout=(work / "up.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )


async def wait_ready(router: str, proc: subprocess.Popen[bytes], key: str = "") -> str:
    """Wait for ``/health``, load the role, return its backend's base URL (``key``: the
    API key to ask with)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(trust_env=False, timeout=120, headers=headers) as client:
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


class StandInBackends:
    """The router child's backends: every role "starts" at once at the upstream's URL
    (``Endpoint``, served model ``tiny-bench``); no process, so every probe passes and a
    restart is refused (``RuntimeError``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def start(self, role: str) -> Endpoint:
        return Endpoint(self.upstream, "tiny-bench")

    async def stop(self, role: str) -> None:
        return None

    async def probe(self, role: str, *, timeout_s: float) -> ProbeResult:
        return ProbeResult(True, 200)

    async def restart(self, role: str) -> None:
        raise RuntimeError(f"the stand-in backend of {role} has no process to restart")


def router_child(argv: list[str]) -> None:
    """``router --port P --upstream URL``: the router app with ``MESSAGE_ROLES`` over the
    upstream at ``URL``, on 127.0.0.1:P, served as ``rosterd up --max-concurrency 64``
    serves it (its ``RouterConfig``, metrics, uvicorn configuration and listener, on the
    plain asyncio event loop), until SIGTERM."""
    port, upstream = int(argv[argv.index("--port") + 1]), argv[argv.index("--upstream") + 1]
    options = UpOptions(Path("roster.yaml"), port=port, limits=SchedulerLimits(max_concurrency=64))
    specs, routes = {}, {}
    for role, flavor in MESSAGE_ROLES.items():
        specs[role] = InferenceSpec(
            role=role, flavor=flavor, model="tiny-bench", memory=MemorySpec(2**20)
        )
        adapter = adapter_for(flavor)
        routes[role] = RoleRoute(
            role=role,
            rewrite=adapter.rewrite_request,
            flavor=flavor.value,
            native=adapter.dialects_for(None) if flavor is InferFlavor.LLAMACPP else frozenset(),
            flavor_dialects=adapter.native_dialects,
            ollama_api=adapter.serves_ollama_api,
            progress=adapter.progress_probe,
        )
    assert "messages" in routes["msg-pass"].native, "llama.cpp serves Messages itself"

    async def serve() -> None:
        metrics = RosterdMetrics()
        node = NodeScheduler(
            "box",
            2**30,
            specs,
            StandInBackends(upstream),
            limits=options.limits,
            metrics=metrics,
            concurrency=NodeConcurrency(None, {}),
        )
        scheduler = NodeDirectory({"box": node})
        app = create_app(scheduler, routes, config=options.router_config(), metrics=metrics)
        sock = bind_listener(options.host, options.port)
        server = NoSignalServer(server_config(app, options))
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGTERM, lambda: setattr(server, "should_exit", True)
        )
        try:
            await server.serve(sockets=[sock])
        finally:
            await scheduler.shutdown()
            sock.close()

    asyncio.run(serve())  # rosterd up runs on asyncio's own loop, not uvloop


def start_router(work: Path, port: int, upstream: str) -> subprocess.Popen[bytes]:
    """This script's ``router`` child on ``port`` over ``upstream`` (``http://host:port``)."""
    argv = ["router", "--port", str(port), "--upstream", upstream]
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        stdout=(work / "router.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, NO_COLOR="1"),
    )


async def wait_router(router: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait for the router child's ``/health``, then load its roles (``SystemExit`` if it
    exits first)."""
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"the router child exited with {proc.returncode}")
            try:
                if (await client.get(router + "/health")).status_code == 200:
                    break
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
        for role in MESSAGE_ROLES:
            (await client.post(f"{router}/rosterd/load/{role}")).raise_for_status()


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout_s: float) -> None:
    """Send ``sig`` to ``proc``, wait ``timeout_s`` for it, then kill it."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- the load ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What one side is sent: its base URL (``http://host:port``), the path, the JSON body."""

    url: str
    path: str = "/v1/completions"
    body: bytes = REQUEST_BODY
    key: str = ""


def messages_target(router: str, role: str) -> Target:
    """The Messages request of role ``role`` (``MESSAGE_ROLES``) on the router child."""
    return Target(router, "/v1/messages", MESSAGES_BODY % role.encode())


@dataclass(frozen=True)
class Run:
    """One measurement: requests per second, p50 and p99 in milliseconds, failed requests."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def wrk_run(wrk: str, script: Path, url: str, connections: int, duration_s: float) -> Run:
    """One ``wrk`` run of ``script`` against ``url`` (the whole URL, path included)."""
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
            url,
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


async def python_load(target: Target, connections: int, duration_s: float) -> Run:
    host, port = target.url.removeprefix("http://").split(":")
    auth = b"Authorization: Bearer %s\r\n" % target.key.encode() if target.key else b""
    request = (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
        b"Content-Length: %d\r\n\r\n%s"
        % (target.path.encode(), host.encode(), auth, len(target.body), target.body)
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
    sides: dict[str, Target], args: argparse.Namespace, wrk: str | None, work: Path
) -> dict[tuple[str, int], list[Run]]:
    scripts: dict[str, Path] = {}
    for name, target in sides.items():
        scripts[name] = work / f"bench-{name}.lua"
        auth = f'wrk.headers["Authorization"] = "Bearer {target.key}"\n' if target.key else ""
        scripts[name].write_text(WRK_SCRIPT.format(body=target.body.decode(), auth=auth))

    def once(name: str, c: int, duration_s: float) -> Run:
        target = sides[name]
        if wrk:
            return wrk_run(wrk, scripts[name], target.url + target.path, c, duration_s)
        result: list[Run] = []

        async def go() -> None:
            result.append(await python_load(target, c, duration_s))

        run(go())
        return result[0]

    for name in sides:  # warm every path (connections, caches)
        once(name, 8, 1.0)
    runs: dict[tuple[str, int], list[Run]] = {}
    names = list(sides)
    for round_no in range(args.rounds):
        for c in args.connections:
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                result = once(name, c, args.duration)
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
    for c in args.connections:
        added = med("keys", c, "p50_ms") - med("rosterd", c, "p50_ms")
        print(
            f"c={c}: keys and usage add {added:+.3f} ms at p50 over rosterd without keys "
            f"(req/s {med('keys', c, 'rps') / med('rosterd', c, 'rps'):.1%} of it)"
        )
    for c in args.connections:
        added = med("msg-xlat", c, "p50_ms") - med("msg-pass", c, "p50_ms")
        print(
            f"c={c}: the Messages translation adds {added:+.2f} ms at p50 over the passthrough "
            f"(req/s {med('msg-xlat', c, 'rps') / med('msg-pass', c, 'rps'):.1%} of it)"
        )


def main() -> None:
    if sys.argv[1:2] == ["upstream"]:
        upstream_child(sys.argv[2:])
        return
    if sys.argv[1:2] == ["router"]:
        router_child(sys.argv[2:])
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
        keyed_work = work / "keys"
        keyed_work.mkdir()
        token = new_token()
        bench_key = ApiKey(
            "bench",
            key_digest(token),
            frozenset(Scope),
            ("bench", "tiny-*"),
            limits=KeyLimits(in_flight=1000, requests_per_minute=10**9, tokens_per_day=10**12),
        )
        (keyed_work / "keys.yaml").write_text(render_keys((bench_key,)))
        keyed_port = free_port()
        keyed = start_rosterd(keyed_work, keyed_port, nginx, keyed_work / "keys.yaml")
        keyed_url = f"http://127.0.0.1:{keyed_port}"
        try:
            holder: list[str] = []

            async def ready() -> None:
                holder.append(await wait_ready(router, proc))

            asyncio.run(ready())
            direct = holder[0]
            asyncio.run(wait_ready(keyed_url, keyed, token))
            sides = {
                "direct": Target(direct),
                "rosterd": Target(router),
                "keys": Target(keyed_url, key=token),
            }
            with contextlib.ExitStack() as stack:
                if nginx:
                    upstream = direct.removeprefix("http://")
                    proxy = stack.enter_context(nginx_proxy(nginx, work, upstream))
                    sides["nginx"] = Target(proxy)
                else:
                    print("nginx is not installed: no proxy_pass row (apt-get install -y nginx)")
                child_port = free_port()
                child = start_router(work, child_port, direct)
                stack.callback(stop, child, signal.SIGTERM, 30)
                child_url = f"http://127.0.0.1:{child_port}"
                asyncio.run(wait_router(child_url, child))
                for role in MESSAGE_ROLES:
                    sides[role] = messages_target(child_url, role)
                runs = measure(sides, args, wrk, work)
            report(runs, args, how)
        finally:
            stop(keyed, signal.SIGINT, 60)
            stop(proc, signal.SIGINT, 60)


if __name__ == "__main__":
    main()
