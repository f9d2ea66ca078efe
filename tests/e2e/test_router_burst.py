"""Bursts of concurrent requests above the backend's slots all get 200.

llama-server (cpp-httplib) closes a keep-alive connection idle for 5 s, and
httpx kept idle connections for 5 s as well: under bursts 1 s apart, the
router reused a connection the backend was closing at that moment, and the
request failed unanswered ("Server disconnected without sending a
response"), 2-4 of 60. The router now drops idle upstream connections after
2 s, and retries a request that failed that way once on a new connection
(the backend never saw it), so every request of the bursts gets 200.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from support.up import (
    MODELS,
    StartUp,
    llama_entry,
    prepare_example_models,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


async def _burst(url: str, rounds: int, per_round: int) -> list[tuple[int, str]]:
    """``rounds`` bursts of ``per_round`` concurrent chat requests (half streamed), 1 s apart;
    every answer as (status, body)."""
    results: list[tuple[int, str]] = []

    async def one(client: httpx.AsyncClient, stream: bool) -> None:
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "stream": stream,
        }
        reply = await client.post(url + "/v1/chat/completions", json=body)
        results.append((reply.status_code, reply.text))

    async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
        for _ in range(rounds):
            await asyncio.gather(*(one(client, i % 2 == 0) for i in range(per_round)))
            await asyncio.sleep(1.0)
    return results


def test_concurrent_bursts_above_the_slots_all_complete(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chat", "tiny-a", 0.1, 18531)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}},
        flavors=["llamacpp"],
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet)])
    try:
        httpx.post(up.url + "/rosterd/load/chat", timeout=60, trust_env=False)
        wait_resident(up, {"chat"})
        started = time.monotonic()
        results = asyncio.run(_burst(up.url, rounds=10, per_round=6))
        took = time.monotonic() - started
        bad = [(code, text[-300:]) for code, text in results if code != 200 or '"error"' in text]
        assert not bad, json.dumps(bad, indent=1)
        assert len(results) == 60
        assert took < 60
    finally:
        up.stop()
