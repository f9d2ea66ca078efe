"""What the router's upstream side keeps, over real HTTP on 127.0.0.1: keep-alive reuse,
backends that close idle connections or say ``Connection: close``, a client leaving
mid-stream, answers bigger than the read buffer, and a backend that goes silent.

The backend is a raw asyncio HTTP/1.1 server written here, so each test can count the
connections it accepts, see when the router closes one, and answer exactly as a backend
may (chunked or with a length, keep-alive or not). The router is the real app on uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

from rosterd.backends.values import Endpoint
from rosterd.errors import UpstreamClosedError
from rosterd.router import RoleRoute, RouterConfig, RouterError, create_app
from rosterd.router.openai_errors import upstream_errors
from rosterd.router.upstream import Upstream
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port

MIB = 2**20
ANSWER = b'{"object":"text_completion","choices":[{"index":0,"text":"hi"}]}'

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, object]], Awaitable[bool]]


@dataclass
class RawBackend:
    """Counts connections; ``answer(reader, writer, body)`` answers one request and says
    whether the connection stays open for the next one; a connection idle for
    ``idle_timeout_s`` is closed (llama-server's keep-alive timeout is 5 s)."""

    answer: Answer
    idle_timeout_s: float = 60.0
    connections: int = 0
    open_connections: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    requests: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout_s):
                        head = await reader.readuntil(b"\r\n\r\n")
                except TimeoutError:
                    return  # idle too long: the backend closes it
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the router closed the connection
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = json.loads(await reader.readexactly(length))
                self.requests += 1
                if not await self.answer(reader, writer, body):
                    return
        except ConnectionError:
            return
        finally:
            self.open_connections -= 1
            self.closed.set()
            writer.close()


async def answer_with_length(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
) -> bool:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(ANSWER), ANSWER)
    )
    await writer.drain()
    return True


@dataclass
class Routed:
    url: str
    backend: RawBackend


@contextlib.asynccontextmanager
async def serve(
    answer: Answer, config: RouterConfig | None = None, idle_timeout_s: float = 60.0
) -> AsyncIterator[Routed]:
    backend = RawBackend(answer, idle_timeout_s)
    upstream = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]

    class Backends(NoLiveness):
        async def start(self, role: str) -> Endpoint:
            return Endpoint(f"http://127.0.0.1:{upstream_port}", role)

        async def stop(self, role: str) -> None:
            return None

    specs = {
        "a": InferenceSpec(role="a", flavor=InferFlavor.LLAMACPP, model="a", memory=MemorySpec(MIB))
    }
    node = NodeScheduler(
        "n1",
        100 * MIB,
        specs,
        Backends(),
        limits=SchedulerLimits(tick_s=0.02, drain_s=1.0, max_concurrency=8),
    )
    app = create_app(NodeDirectory({"n1": node}), {"a": RoleRoute("a")}, config=config)
    port = pick_free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield Routed(f"http://127.0.0.1:{port}", backend)
    finally:
        server.should_exit = True
        await task
        await node.shutdown()
        upstream.close()
        await upstream.wait_closed()


def completion(stream: bool = False) -> dict[str, object]:
    return {"model": "a", "prompt": "hi", "max_tokens": 2, "stream": stream}


async def test_sequential_requests_reuse_one_backend_connection() -> None:
    async with serve(answer_with_length) as up, httpx.AsyncClient(timeout=10) as client:
        for _ in range(20):
            r = await client.post(f"{up.url}/v1/completions", json=completion())
            assert r.status_code == 200
            assert r.content == ANSWER
            assert r.headers["content-length"] == str(len(ANSWER))  # passed on, not chunked
        assert up.backend.requests == 20
        assert up.backend.connections == 1


async def test_concurrent_requests_keep_their_connections_for_the_next_burst() -> None:
    async def slow_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
    ) -> bool:
        await asyncio.sleep(0.05)  # all 8 of a burst are in flight at once
        return await answer_with_length(reader, writer, body)

    limits = httpx.Limits(max_connections=8)
    async with serve(slow_answer) as up, httpx.AsyncClient(timeout=10, limits=limits) as client:
        for _ in range(5):
            replies = await asyncio.gather(
                *(client.post(f"{up.url}/v1/completions", json=completion()) for _ in range(8))
            )
            assert [r.status_code for r in replies] == [200] * 8
        assert up.backend.requests == 40
        assert up.backend.connections == 8


async def test_a_backend_closing_idle_connections_costs_no_request() -> None:
    """Like llama-server's keep-alive timeout: the backend closes a connection idle for
    0.1 s; requests 0.3 s apart each find theirs closed and go on a new one."""

    config = RouterConfig(upstream_keepalive_s=5.0)  # longer than the backend's: it closes first
    backend_closes = serve(answer_with_length, config, idle_timeout_s=0.1)
    async with backend_closes as up, httpx.AsyncClient(timeout=10) as c:
        for _ in range(4):
            r = await c.post(f"{up.url}/v1/completions", json=completion())
            assert r.status_code == 200, r.text
            await asyncio.sleep(0.3)
        assert up.backend.requests == 4
        assert up.backend.connections == 4


async def test_a_connection_close_answer_is_not_reused_and_costs_nothing() -> None:
    async def answer_and_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
    ) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
        )
        await writer.drain()
        return False

    async with serve(answer_and_close) as up, httpx.AsyncClient(timeout=10) as client:
        for _ in range(3):
            r = await client.post(f"{up.url}/v1/completions", json=completion())
            assert r.status_code == 200
        assert up.backend.connections == 3


async def test_the_pool_drops_a_connection_the_backend_closed_while_idle() -> None:
    """Straight on the upstream client: a pooled connection the backend closed while idle
    is not handed out again (the request would fail unanswered); one closed under a
    request raises ``UpstreamClosedError``, the error the proxy retries once."""
    closes_idle = RawBackend(answer_with_length, idle_timeout_s=0.05)
    server = await asyncio.start_server(closes_idle.handle, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream = Upstream(connect_s=5.0, read_s=5.0, keepalive_s=30.0)
    try:
        for expected_connections in (1, 2):
            answer = await upstream.post(base, "/v1/completions", b"{}", "application/json")
            assert await answer.read() == ANSWER
            answer.close()
            assert closes_idle.connections == expected_connections
            await closes_idle.closed.wait()  # the backend closed it, idle
            closes_idle.closed.clear()
            await asyncio.sleep(0.05)
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()

    async def never_answers(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
    ) -> bool:
        return False

    silent = RawBackend(never_answers)
    server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream = Upstream(connect_s=5.0, read_s=5.0, keepalive_s=30.0)
    try:
        with pytest.raises(UpstreamClosedError):
            await upstream.post(base, "/v1/completions", b"{}", "application/json")
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()


def _event(n: int) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": n}}]}).encode()


async def endless_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
) -> bool:
    """An event stream that goes on until the router closes the connection."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    n = 0
    while True:
        event = _event(n) + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        n += 1
        await asyncio.sleep(0.02)


async def test_a_client_leaving_mid_stream_closes_the_backend_connection_at_once() -> None:
    async with serve(endless_stream) as up, httpx.AsyncClient(timeout=10) as client:
        lines: list[str] = []
        body = completion(stream=True)
        async with client.stream("POST", f"{up.url}/v1/completions", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 3:
                    break  # the client leaves: the response is closed below
        left = time.monotonic()
        await asyncio.wait_for(up.backend.closed.wait(), 2.0)
        assert time.monotonic() - left < 1.0
        assert up.backend.open_connections == 0
        assert lines[0] == _event(0).decode()
        status = (await client.get(f"{up.url}/status")).json()
        assert status["nodes"]["n1"]["roles"]["a"]["running"] == 0
        text = (await client.get(f"{up.url}/metrics")).text
        assert 'rosterd_requests_total{code="499",endpoint="completions",role="a"} 1.0' in text
        # The router serves the next request as before.
        up.backend.answer = answer_with_length
        r = await client.post(f"{up.url}/v1/completions", json=completion())
        assert r.status_code == 200


async def test_a_big_chunked_answer_passes_through_whole() -> None:
    """Bigger than the pause threshold: the backend connection pauses and resumes reading
    while the client takes the chunks, and every byte arrives in order."""
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB

    async def chunked_answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
    ) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for at in range(0, len(big), 65536):
            piece = big[at : at + 65536]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with serve(chunked_answer) as up, httpx.AsyncClient(timeout=30) as client:
        for _ in range(2):  # and the connection is reused after it
            r = await client.post(f"{up.url}/v1/completions", json=completion())
            assert r.status_code == 200
            assert r.content == big
        assert up.backend.connections == 1


async def silent(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict[str, object]
) -> bool:
    await asyncio.sleep(10)
    return False


async def test_a_backend_silent_past_the_read_timeout_is_502() -> None:
    # The client's own read timeout, mapped as the proxy maps it. Through the router it
    # is only the backstop above the liveness deadlines (next test), which come first.
    backend = RawBackend(silent, 60.0)
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0)
    base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    upstream = Upstream(connect_s=5.0, read_s=0.3, keepalive_s=30.0)
    started = time.monotonic()
    try:
        with pytest.raises(RouterError) as caught, upstream_errors("a"):
            await upstream.post(base_url, "/v1/completions", b"{}", "application/json")
        assert caught.value.code == "backend_error"
        assert caught.value.status == 502
        assert "UpstreamTimeoutError" in caught.value.message
        assert time.monotonic() - started < 3.0
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()


async def test_a_silent_backend_meets_the_first_byte_deadline_before_the_read_timeout() -> None:
    config = RouterConfig(upstream_read_s=0.3, first_byte_timeout_s=0.5, chunk_timeout_s=0.5)
    async with serve(silent, config) as up, httpx.AsyncClient(timeout=10) as client:
        started = time.monotonic()
        r = await client.post(f"{up.url}/v1/completions", json=completion())
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "backend_timeout"
        assert time.monotonic() - started < 3.0
