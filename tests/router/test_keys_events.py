"""A watch key with a ``models`` list sees only its roles' scheduler events: on the page's
stream (``GET /rosterd/events/stream``) and in ``GET /rosterd/events``, as ``/status``
already shows only its roles (stand-in backends, the router over real HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from rosterd.keys import Scope
from support.keys_lab import KEYS, MASTER, lab

#: A watcher of ``chat`` only, beside the lab's keys.
CHAT_WATCHER = "rk-chat-watcher"
WITH_CHAT_WATCHER = {
    **KEYS,
    "chat-watcher": (CHAT_WATCHER, frozenset({Scope.WATCH}), ("chat",)),
}


async def test_a_watch_keys_stream_and_events_hold_only_its_roles(tmp_path: Path) -> None:
    master = {"Authorization": f"Bearer {MASTER}"}
    watcher = {"Authorization": f"Bearer {CHAT_WATCHER}"}
    async with (
        lab(tmp_path, keys=WITH_CHAT_WATCHER) as up,
        httpx.AsyncClient(base_url=up.url, timeout=20) as client,
        client.stream("GET", "/rosterd/events/stream", headers=watcher) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        # secret first: loading chat beside it records secret as resident in chat's events.
        for role in ("secret", "chat"):
            (await client.post(f"/rosterd/load/{role}", headers=master)).raise_for_status()
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(20):
            name = ""
            async for line in lines:
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name == "scheduler":
                    seen.append(json.loads(line.removeprefix("data: ")))
                    if seen[-1]["kind"] == "loaded":
                        break
        logged = (await client.get("/rosterd/events", headers=watcher)).json()["events"]
        everything = (await client.get("/rosterd/events", headers=master)).json()["events"]
    assert [(e["role"], e["kind"]) for e in seen] == [("chat", "loading"), ("chat", "loaded")]
    assert [e["resident"] for e in seen] == [["chat"], ["chat"]]
    assert "secret" not in json.dumps(seen)
    assert logged == seen
    # The operator's key (every role) sees both loads, with secret resident beside chat.
    assert [(e["role"], e["kind"]) for e in everything] == [
        ("secret", "loading"),
        ("secret", "loaded"),
        ("chat", "loading"),
        ("chat", "loaded"),
    ]
    assert everything[-1]["resident"] == ["chat", "secret"]
