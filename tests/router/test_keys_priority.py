"""A key's priority: on one role, a ``batch`` key's requests wait behind an ``interactive``
key's, whatever the role's own class; without priorities the role's queue stays first come,
first served. The router runs for real over a stand-in backend that serves one request at
a time and notes the order it got them in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rosterd.keys import ApiKey, KeyRing, key_digest
from rosterd.router import RoleRoute, create_app
from rosterd.router.auth import Keys
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, LatencyClass, MemorySpec
from support.backends import pick_free_port
from support.keys_lab import StandInBackends, serve_app

MIB = 2**20
#: Each answer's time, seconds: longer than the waves take to send (0.4 s), so b0 still
#: holds the one slot when i1 and i2 arrive, on a loaded machine too (at 0.3 s, b1 could
#: take the slot first).
SERVICE_S = 1.0


@contextlib.asynccontextmanager
async def one_at_a_time(keys: KeyRing) -> AsyncIterator[tuple[str, list[str]]]:
    """The router over a backend that answers one request at a time in ``SERVICE_S``; yields
    its URL and the list of what each request said, in the order the backend got them."""
    seen: list[str] = []

    async def answer(request: Request) -> Response:
        body = await request.json()
        seen.append(body["messages"][0]["content"])
        await asyncio.sleep(SERVICE_S)
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        message = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"choices": [choice], "usage": usage})

    backend_port, router_port = pick_free_port(), pick_free_port()
    spec = InferenceSpec(
        role="chat",
        flavor=InferFlavor.LLAMACPP,
        model="chat-m",
        memory=MemorySpec(MIB),
        latency_class=LatencyClass.INTERACTIVE,
    )
    limits = SchedulerLimits(max_concurrency=1, tick_s=0.02)
    node = NodeScheduler(
        "n1", 100 * MIB, {"chat": spec}, StandInBackends(backend_port), limits=limits
    )
    app = create_app(NodeDirectory({"n1": node}), {"chat": RoleRoute("chat")}, keys=Keys(keys))
    backend = Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])
    async with serve_app(backend, backend_port), serve_app(app, router_port):
        yield f"http://127.0.0.1:{router_port}", seen


async def send_in_waves(url: str) -> list[int]:
    """b0 takes the one slot; b1..b3 (batch key) queue; then i1, i2 (interactive key)."""

    async def chat(client: httpx.AsyncClient, token: str, said: str) -> int:
        body = {"model": "chat", "messages": [{"role": "user", "content": said}]}
        headers = {"Authorization": f"Bearer {token}"}
        return (await client.post("/v1/chat/completions", json=body, headers=headers)).status_code

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        tasks: list[asyncio.Task[int]] = []
        tasks.append(asyncio.create_task(chat(client, "rk-batch", "b0")))
        await asyncio.sleep(0.1)
        for said in ("b1", "b2", "b3"):
            tasks.append(asyncio.create_task(chat(client, "rk-batch", said)))
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)
        for said in ("i1", "i2"):
            tasks.append(asyncio.create_task(chat(client, "rk-inter", said)))
            await asyncio.sleep(0.05)
        return list(await asyncio.gather(*tasks))


def ring(batch: LatencyClass | None, inter: LatencyClass | None) -> KeyRing:
    return KeyRing(
        [
            ApiKey("nightly", key_digest("rk-batch"), priority=batch),
            ApiKey("alice", key_digest("rk-inter"), priority=inter),
        ]
    )


async def test_a_batch_key_waits_behind_an_interactive_key_on_the_same_role() -> None:
    keys = ring(LatencyClass.BATCH, LatencyClass.INTERACTIVE)
    async with one_at_a_time(keys) as (url, seen):
        statuses = await send_in_waves(url)
    assert statuses == [200] * 6
    assert seen == ["b0", "i1", "i2", "b1", "b2", "b3"]


async def test_without_priorities_the_queue_is_first_come_first_served() -> None:
    async with one_at_a_time(ring(None, None)) as (url, seen):
        statuses = await send_in_waves(url)
    assert statuses == [200] * 6
    assert seen == ["b0", "b1", "b2", "b3", "i1", "i2"]


async def test_a_batch_request_whose_client_leaves_gives_its_place_up() -> None:
    keys = ring(LatencyClass.BATCH, LatencyClass.INTERACTIVE)
    async with (
        one_at_a_time(keys) as (url, seen),
        httpx.AsyncClient(base_url=url, timeout=60) as client,
    ):
        body: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "b0"}]}
        first = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": "Bearer rk-batch"}
            )
        )
        await asyncio.sleep(0.1)
        body = {"model": "chat", "messages": [{"role": "user", "content": "gone"}]}
        with contextlib.suppress(httpx.TimeoutException):
            await client.post(
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": "Bearer rk-batch"},
                timeout=0.1,
            )
        assert (await first).status_code == 200
        body = {"model": "chat", "messages": [{"role": "user", "content": "b1"}]}
        later = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer rk-batch"}
        )
        assert later.status_code == 200
    assert seen == ["b0", "b1"]
