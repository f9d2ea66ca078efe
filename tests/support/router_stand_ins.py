"""A router over stand-in backends that load nothing (``dead``, ``slow``, ``broken``), served by
uvicorn on 127.0.0.1, with the limits and the request body its tests share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import uvicorn

from rosterd.backends.values import Endpoint
from rosterd.metrics import RosterdMetrics
from rosterd.router import RoleRoute, RouterConfig, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port

MIB = 2**20


class StandInBackends(NoLiveness):
    """``slow`` loads take ``load_s``; ``broken`` fails to load; others point at a dead port."""

    def __init__(self, load_s: float = 0.0) -> None:
        self.load_s = load_s
        self.dead_port = pick_free_port()

    async def start(self, role: str) -> Endpoint:
        await asyncio.sleep(self.load_s if role == "slow" else 0.0)
        if role == "broken":
            raise RuntimeError("llama-server exited with code 1: invalid model file")
        return Endpoint(f"http://127.0.0.1:{self.dead_port}", role)

    async def stop(self, role: str) -> None:
        return None


@dataclass
class Running:
    url: str
    metrics: RosterdMetrics


@contextlib.asynccontextmanager
async def serve(
    *,
    limits: SchedulerLimits,
    config: RouterConfig | None = None,
    load_s: float = 0.0,
) -> AsyncIterator[Running]:
    roles = ["dead", "slow", "broken"]
    specs = {
        r: InferenceSpec(
            role=r, flavor=InferFlavor.LLAMACPP, model=f"{r}-model", memory=MemorySpec(MIB)
        )
        for r in roles
    }
    metrics = RosterdMetrics()
    node = NodeScheduler(
        "n1", 100 * MIB, specs, StandInBackends(load_s), limits=limits, metrics=metrics
    )
    scheduler = NodeDirectory({"n1": node})
    routes = {r: RoleRoute(r, names=(f"{r}-model", f"{r}-alias")) for r in roles}
    app = create_app(scheduler, routes, config=config, metrics=metrics)
    port = pick_free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    async with httpx.AsyncClient() as probe:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                    break
            await asyncio.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", metrics)
    finally:
        server.should_exit = True
        await task
        await scheduler.shutdown()


LIMITS = SchedulerLimits(max_queue=1, queue_timeout_s=5.0, tick_s=0.02)


def chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
