"""The page's event stream (``GET /rosterd/events/stream``) over real HTTP, with stand-in
backends: it starts with the event log and a ``/status`` snapshot, sends each scheduler
event as the node records it followed by a fresh snapshot, and ends when rosterd stops
serving. The same stream on a real ``rosterd up`` is in ``test_page.py``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from rosterd.router import RouterConfig
from support.router import serve


async def _events(lines: object, want: int) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    name = ""
    assert hasattr(lines, "__anext__")
    async with asyncio.timeout(20):
        while len(out) < want:
            line = await lines.__anext__()
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                out.append((name, json.loads(line.removeprefix("data: "))))
    return out


async def test_history_snapshot_then_events_as_they_happen(tmp_path: Path) -> None:
    async with (
        serve(tmp_path) as up,
        httpx.AsyncClient(base_url=up.url, timeout=20) as client,
        client.stream("GET", "/rosterd/events/stream") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["cache-control"] == "no-store"
        lines = stream.aiter_lines()
        (h, history), (s, snapshot) = await _events(lines, 2)
        assert (h, s) == ("history", "snapshot")
        assert history == {"events": []}
        assert isinstance(snapshot, dict)
        assert snapshot["nodes"]["n1"]["roles"]["chat"]["phase"] == "stopped"
        assert "uptime_s" in snapshot

        began = time.monotonic()
        (await client.post("/rosterd/load/chat")).raise_for_status()
        kinds: list[object] = []
        while True:
            [(name, data)] = await _events(lines, 1)
            assert isinstance(data, dict)
            if name == "scheduler":
                kinds.append(data["kind"])
            elif name == "snapshot" and kinds:
                assert data["nodes"]["n1"]["roles"]["chat"]["phase"] == "ready"
                break
        assert kinds == ["loading", "loaded"]
        assert time.monotonic() - began < 0.9  # sent at once, not at the next periodic one

        up.streams.close()  # as `rosterd up` does when it stops serving
        async with asyncio.timeout(5):
            async for _ in lines:
                pass  # the stream ends


async def test_the_stream_needs_the_key(tmp_path: Path) -> None:
    keyed = RouterConfig(api_keys=("sesame",))
    async with serve(tmp_path, config=keyed) as up, httpx.AsyncClient(base_url=up.url) as client:
        assert (await client.get("/rosterd/events/stream")).status_code == 401
        assert (await client.get("/")).status_code == 200  # the page itself holds no data
        assert (await client.get("/ui/static/page.js")).status_code == 200
        assert (await client.get("/ui/static/nothing.js")).status_code == 404
        async with client.stream(
            "GET", "/rosterd/events/stream", headers={"Authorization": "Bearer sesame"}
        ) as stream:
            assert stream.status_code == 200
            up.streams.close()


async def test_the_charts_points_come_as_sample_events(tmp_path: Path) -> None:
    config = RouterConfig(history_interval_s=0.2)
    async with (
        serve(tmp_path, config=config) as up,
        httpx.AsyncClient(base_url=up.url, timeout=20) as client,
        client.stream("GET", "/rosterd/events/stream") as stream,
    ):
        lines = stream.aiter_lines()
        (await client.post("/rosterd/load/chat")).raise_for_status()
        samples: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while len(samples) < 3 or not any(s["marks"] for s in samples):
            assert time.monotonic() < deadline, samples
            [(name, data)] = await _events(lines, 1)
            if name == "sample":
                assert isinstance(data, dict)
                samples.append(data)
        times = [s["t"] for s in samples]
        assert times == sorted(set(times))  # each point once, in order
        last = samples[-1]
        nodes = last["nodes"]
        assert isinstance(nodes, dict)
        assert nodes["n1"]["roles"] == {"chat": 2**20}  # resident: its 1 MiB counted
        assert {m["kind"] for s in samples for m in s["marks"]} == {"loaded"}
        history = (await client.get("/rosterd/history")).json()
        assert history["interval_s"] == 0.2
        assert history["t"][-len(times) :] == times or history["t"][-1] > times[-1]
        assert set(history["roles"]) >= {"chat"}
