"""The router's edges, over real HTTP on 127.0.0.1: bodies that are not strict JSON,
streams cut after they started, roles known but not served here, and OpenAI's
``GET /v1/models/{model}`` through the official ``openai`` client.

The backend is a small in-process server: ``/v1/chat/completions`` streams two
SSE chunks and then, by the model asked for, finishes (``data: [DONE]``), stops
without finishing (a backend evicted or killed mid-generation) or hangs (until
the router's drain time at shutdown runs out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from rosterd.backends.values import Endpoint
from rosterd.metrics import RosterdMetrics
from rosterd.router import RoleRoute, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port

MIB = 2**20
ROLES = ("done", "stops", "hangs")


def _chunk(text: str) -> bytes:
    body = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


async def _upstream_chat(request: Request) -> StreamingResponse:
    model = (await request.json())["model"]

    async def events() -> AsyncIterator[bytes]:
        yield _chunk("Hel")
        await asyncio.sleep(0.05)
        yield _chunk("lo")
        if model == "done":
            yield b"data: [DONE]\n\n"
        elif model == "hangs":
            await asyncio.sleep(3600)

    return StreamingResponse(events(), media_type="text/event-stream")


class _Backends(NoLiveness):
    """Every role is "loaded" at once and served by the in-process upstream."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.started: list[str] = []

    async def start(self, role: str) -> Endpoint:
        self.started.append(role)
        return Endpoint(f"http://127.0.0.1:{self.port}", role)

    async def stop(self, role: str) -> None:
        return None


@dataclass
class Up:
    url: str
    server: uvicorn.Server
    backends: _Backends


async def _serve_app(
    app: object, port: int, **config: object
) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config)  # type: ignore[arg-type]
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(200):
        if server.started:
            return server, task
        await asyncio.sleep(0.01)
    raise AssertionError("server did not start")


@contextlib.asynccontextmanager
async def serve(unserved: dict[str, str] | None = None) -> AsyncIterator[Up]:
    upstream_port = pick_free_port()
    upstream, upstream_task = await _serve_app(
        Starlette(routes=[Route("/v1/chat/completions", _upstream_chat, methods=["POST"])]),
        upstream_port,
        lifespan="off",
    )
    specs = {
        r: InferenceSpec(
            role=r, flavor=InferFlavor.LLAMACPP, model=f"{r}-model", memory=MemorySpec(MIB)
        )
        for r in ROLES
    }
    backends = _Backends(upstream_port)
    metrics = RosterdMetrics()
    limits = SchedulerLimits(tick_s=0.02, drain_s=1.0)
    node = NodeScheduler("n1", 100 * MIB, specs, backends, limits=limits, metrics=metrics)
    scheduler = NodeDirectory({"n1": node})
    routes = {r: RoleRoute(r, names=(f"{r}-model",)) for r in ROLES}
    app = create_app(scheduler, routes, metrics=metrics, unserved=unserved)
    port = pick_free_port()
    server, task = await _serve_app(app, port, lifespan="on", timeout_graceful_shutdown=1)
    try:
        yield Up(f"http://127.0.0.1:{port}", server, backends)
    finally:
        server.should_exit = True
        upstream.should_exit = True
        upstream.force_exit = True
        await asyncio.wait_for(asyncio.gather(task, upstream_task), 10)
        await scheduler.shutdown()


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    return str(error["message"])


async def test_non_strict_json_is_400_before_any_load() -> None:
    bodies = [
        b'{"model":"done","max_tokens":NaN,"messages":[]}',
        b'{"model":"done","temperature":Infinity,"messages":[]}',
        b'{"model":"done","temperature":-Infinity,"messages":[]}',
        b'{"model":"done","max_tokens":1e999,"messages":[]}',
        b'{"model":"done","messages":[{"role":"user","content":"\\ud800"}]}',
        b'{"model":"done","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model":"done","x":"\xff"}',
        b'{"model":"done","max_tokens":' + b"9" * 5000 + b"}",
    ]
    async with serve() as up, httpx.AsyncClient(timeout=10) as client:
        for body in bodies:
            r = await client.post(
                f"{up.url}/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert "not JSON" in _error(r, 400, "invalid_json") or "nested" in r.text
        assert up.backends.started == []  # nothing was loaded for a bad body
        events = (await client.get(f"{up.url}/rosterd/events")).json()["events"]
        assert events == []


async def _stream(client: httpx.AsyncClient, url: str, model: str) -> list[str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        return [line async for line in r.aiter_lines() if line]


async def test_a_finished_stream_has_no_error_event() -> None:
    async with serve() as up, httpx.AsyncClient(timeout=10) as client:
        lines = await _stream(client, up.url, "done")
        assert lines[-1] == "data: [DONE]"
        assert not any("error" in line for line in lines)


async def test_a_stream_the_backend_stops_ends_with_an_error_event() -> None:
    async with serve() as up, httpx.AsyncClient(timeout=10) as client:
        lines = await _stream(client, up.url, "stops")
        assert len(lines) == 3
        error = json.loads(lines[-1].removeprefix("data: "))["error"]
        assert error["code"] == "backend_error"
        assert "ended before it finished" in error["message"]


async def test_a_stream_cut_by_the_drain_time_at_shutdown_ends_with_an_error_event() -> None:
    async with serve() as up, httpx.AsyncClient(timeout=10) as client:
        body = {"model": "hangs", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        lines: list[str] = []
        async with client.stream("POST", f"{up.url}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line:
                    lines.append(line)
                if len(lines) == 2:
                    up.server.should_exit = True  # shutdown; drain time 1 s, then cut
        assert len(lines) == 3, lines
        error = json.loads(lines[-1].removeprefix("data: "))["error"]
        assert error["code"] == "shutting_down"
        assert "drain time" in error["message"]


async def test_an_unserved_role_says_why() -> None:
    """A role the plan left unplaced, or put on a node this process does not run, is 503
    ``model_unplaced`` with the plan's reason and no Retry-After (nothing changes until the
    operator does); a roster entry the import skipped is no role at all: 404."""
    unserved = {
        "planner": "unplaced: no node runs mlx_lm",
        "writer": "planned on node studio, which this process does not run",
    }
    skipped = {"old": "skipped in the roster: status is retired"}
    async with serve({**unserved, **skipped}) as up, httpx.AsyncClient(timeout=10) as client:
        for model, why in unserved.items():
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            r = await client.post(f"{up.url}/v1/chat/completions", json=body)
            message = _error(r, 503, "model_unplaced")
            assert "retry-after" not in r.headers
            assert r.headers["x-should-retry"] == "false"  # the SDKs do not retry it
            assert why in message
            assert "done, hangs, stops" in message
            r = await client.post(f"{up.url}/v1/messages", json={**body, "max_tokens": 8})
            assert r.status_code == 503
            assert r.json()["error"]["type"] == "overloaded_error"  # Anthropic's envelope
            assert why in r.json()["error"]["message"]
        r = await client.post(f"{up.url}/v1/chat/completions", json={"model": "old"})
        assert skipped["old"] in _error(r, 404, "model_not_found")
        r = await client.post(f"{up.url}/v1/chat/completions", json={"model": "nope"})
        assert "not served here; known models" in _error(r, 404, "model_not_found")
        r = await client.post(f"{up.url}/v1/chat/completions", json={"model": "x" * 100_000})
        assert len(_error(r, 404, "model_not_found")) < 300  # a huge name is not echoed whole


async def test_models_retrieve_with_the_openai_client() -> None:
    async with serve() as up:
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
        model = await client.models.retrieve("done")
        assert model.id == "done"
        assert model.owned_by == "rosterd"
        assert (await client.models.retrieve("stops-model")).id == "stops"  # by another name
        with pytest.raises(openai.NotFoundError) as caught:
            await client.models.retrieve("gpt-9")
        assert "gpt-9" in str(caught.value)
        await client.close()
