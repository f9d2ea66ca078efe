"""A router served by uvicorn on 127.0.0.1 over stand-in backends, for the tests of what
the router adds around the models (logs, CORS, ``ps --json``): nothing there needs a
model, so a "load" only points at a port nobody listens on. No tests here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from rosterd.backends.interface import RoleBackends
from rosterd.backends.values import Endpoint
from rosterd.router import RoleRoute, RouterConfig, create_app
from rosterd.router.logs import CopyLogs
from rosterd.router.streams import LiveStreams
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port

MIB = 2**20
#: The roles a stand-in router serves.
ROLES = ("chat", "quiet")


class NoBackends(NoLiveness):
    """Every start "succeeds" at once, towards a port nobody listens on."""

    async def start(self, role: str) -> Endpoint:
        return Endpoint("http://127.0.0.1:9", role)

    async def stop(self, role: str) -> None:
        return None


@dataclass
class Served:
    url: str
    logs: Path
    streams: LiveStreams


@contextlib.asynccontextmanager
async def serve(
    tmp_path: Path,
    *,
    config: RouterConfig | None = None,
    backends: RoleBackends | None = None,
    capacity_bytes: int = 100 * MIB,
    excludes: dict[str, tuple[str, ...]] | None = None,
    limits: SchedulerLimits | None = None,
    native: frozenset[str] = frozenset(),
    copy_logs: CopyLogs | None = None,
) -> AsyncIterator[Served]:
    """Serve :data:`ROLES` (model names ``<role>-m``, 1 MiB each) with logs in
    ``tmp_path/logs``, on one node ``n1`` of ``capacity_bytes`` whose roles
    ``backends`` start (default :class:`NoBackends`); ``excludes``: role -> the
    roles it excludes; ``limits``: the node's (default ``SchedulerLimits()``); ``native``: the
    dialects every role's backend serves itself (``RoleRoute.native``); ``copy_logs``: the
    logs of each role's copies by node (``create_app``'s)."""
    specs = {
        r: InferenceSpec(
            role=r,
            flavor=InferFlavor.LLAMACPP,
            model=f"{r}-m",
            memory=MemorySpec(MIB),
            excludes=(excludes or {}).get(r, ()),
        )
        for r in ROLES
    }
    node = NodeScheduler("n1", capacity_bytes, specs, backends or NoBackends(), limits=limits)
    scheduler = NodeDirectory({"n1": node})
    logs = tmp_path / "logs"
    logs.mkdir()
    streams = LiveStreams()
    app = create_app(
        scheduler,
        {r: RoleRoute(r, names=(f"{r}-m",), native=native) for r in ROLES},
        config=config,
        log_path=lambda role: logs / f"{role}.log",
        copy_logs=copy_logs,
        streams=streams,
    )
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
        yield Served(f"http://127.0.0.1:{port}", logs, streams)
    finally:
        streams.close()
        server.should_exit = True
        await task
        await scheduler.shutdown()
