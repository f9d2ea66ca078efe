"""A lab of keys over stand-in backends, for the tests of the key gate, limits, priority and
usage: two roles, a key of each scope, the router served on a free port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rosterd.backends.values import Endpoint
from rosterd.keys import ApiKey, KeyRing, Scope, key_digest
from rosterd.router import RoleRoute, create_app
from rosterd.router.auth import Keys
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.usage import UsageStore
from support.backends import NoLiveness, pick_free_port

MIB = 2**20
ROLES = ("chat", "secret")
MASTER = "master-key"
#: name -> (token, scopes, models)
KEYS: dict[str, tuple[str, frozenset[Scope], tuple[str, ...]]] = {
    "user": ("rk-user", frozenset({Scope.USE}), ("chat",)),
    "watcher": ("rk-watcher", frozenset({Scope.WATCH}), ("*",)),
    "ops": ("rk-ops", frozenset({Scope.OPERATE}), ("*",)),
}
#: Open without a key: the liveness probe and the page's files (they hold no data).
OPEN = ("/health", "/", "/ui", "/ui/", "/ui/static/{path}")
#: What rosterd answers by design with every scope (Ollama's model store: models come from
#: the roster, 501 says so).
NOT_200 = {
    "/api/pull",
    "/api/push",
    "/api/create",
    "/api/copy",
    "/api/delete",
    "/api/blobs/{digest}",
}

BODY = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "prompt": "hi",
    "input": "hi",
    "query": "q",
    "documents": ["a"],
    "max_tokens": 2,
    "stream": False,
}
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def stand_in(request: Request) -> Response:
    """One body every inference path's caller can read: a chat and a text completion, an
    embedding, rerank results and usage."""
    await request.body()
    return JSONResponse(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "served",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "text": "ok",
                    "finish_reason": "stop",
                }
            ],
            "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.5]}],
            "results": [{"index": 0, "relevance_score": 0.9}],
            "usage": USAGE,
            "input_tokens": 3,
        }
    )


class StandInBackends(NoLiveness):
    def __init__(self, port: int) -> None:
        self.port = port

    async def start(self, role: str) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.port}", f"{role}-served")

    async def stop(self, role: str) -> None:
        return None


@contextlib.asynccontextmanager
async def serve_app(app: Any, port: int) -> AsyncIterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn's Server has no "started" event
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        await task


@dataclass
class Lab:
    url: str
    keys: Keys


def ring(keys: dict[str, tuple[str, frozenset[Scope], tuple[str, ...]]]) -> KeyRing:
    return KeyRing.of(
        [
            ApiKey(name, key_digest(token), scopes, models)
            for name, (token, scopes, models) in keys.items()
        ],
        [MASTER],
    )


@contextlib.asynccontextmanager
async def lab(
    tmp_path: Any,
    usage: UsageStore | None = None,
    keys: dict[str, tuple[str, frozenset[Scope], tuple[str, ...]]] = KEYS,
) -> AsyncIterator[Lab]:
    from starlette.applications import Starlette
    from starlette.routing import Route

    backend_port, router_port = pick_free_port(), pick_free_port()
    specs = {
        r: InferenceSpec(
            role=r, flavor=InferFlavor.LLAMACPP, model=f"{r}-m", memory=MemorySpec(MIB)
        )
        for r in ROLES
    }
    node = NodeScheduler("n1", 100 * MIB, specs, StandInBackends(backend_port))
    scheduler = NodeDirectory({"n1": node})
    native = frozenset({"messages", "responses", "rerank"})
    routes = {r: RoleRoute(r, names=(f"{r}-m",), native=native) for r in ROLES}
    gate = Keys(ring(keys))
    store = usage or UsageStore(tmp_path / "usage-state")
    store.open()

    async def reload(force: bool) -> dict[str, object]:
        return {"changed": False}

    app = create_app(
        scheduler,
        routes,
        reload=reload,
        log_path=lambda role: tmp_path / f"{role}.log",
        keys=gate,
        usage=store,
    )
    backend = Starlette(routes=[Route("/{path:path}", stand_in, methods=["POST"])])
    try:
        async with serve_app(backend, backend_port), serve_app(app, router_port):
            yield Lab(f"http://127.0.0.1:{router_port}", gate)
    finally:
        store.close()
