"""A key's limits: requests per minute, tokens per UTC day and requests in flight answer 429
``key_limit`` naming the limit, with ``Retry-After`` right to the second, in the envelope
of the path's clients. The counts first (a clock of our own), then over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rosterd.errors import RouterError
from rosterd.keys import ApiKey, KeyLimits, KeyRing, Scope, key_digest
from rosterd.router.key_limits import KeyLimiter
from support.keys_lab import lab

DAY = 86400


def key(**limits: int) -> ApiKey:
    return ApiKey("k", key_digest("rk-k"), limits=KeyLimits(**limits))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def refused(limiter: KeyLimiter, k: ApiKey) -> RouterError:
    with pytest.raises(RouterError) as caught:
        limiter.admit(k)
    err = caught.value
    assert err.status == 429
    assert err.code == "key_limit"
    return err


def test_requests_per_minute_retry_when_the_oldest_leaves_the_window() -> None:
    clock = Clock(1000.0)
    limiter = KeyLimiter(clock)
    k = key(requests_per_minute=3)
    for at in (1000.0, 1010.0, 1020.5):
        clock.now = at
        limiter.admit(k)
        limiter.release(k)
    clock.now = 1030.0
    err = refused(limiter, k)
    assert "over its requests_per_minute limit" in err.message
    assert err.headers()["Retry-After"] == "30"  # 1000 + 60 - 1030
    clock.now = 1059.2
    assert refused(limiter, k).headers()["Retry-After"] == "1"  # 0.8 s, rounded up
    clock.now = 1060.0
    limiter.admit(k)  # the first left the window
    clock.now = 1061.0
    assert refused(limiter, k).headers()["Retry-After"] == "9"  # 1010 + 60 - 1061


def test_tokens_per_day_retry_at_the_next_utc_midnight() -> None:
    clock = Clock(20 * DAY + 3600.0)  # 01:00 UTC
    limiter = KeyLimiter(clock)
    limiter.start_day({"k": 900})  # from the usage database
    k = key(tokens_per_day=1000)
    limiter.admit(k)
    limiter.release(k)
    limiter.used("k", 150)  # the last request may go over once
    err = refused(limiter, k)
    assert "over its tokens_per_day limit (1050 of 1000 tokens used today (UTC))" in err.message
    assert err.headers()["Retry-After"] == str(DAY - 3600)
    clock.now = 21 * DAY  # midnight: a new day
    limiter.admit(k)


def test_requests_in_flight_free_as_they_end() -> None:
    limiter = KeyLimiter(Clock(0.0))
    k = key(in_flight=2)
    limiter.admit(k)
    limiter.admit(k)
    err = refused(limiter, k)
    assert "over its in_flight limit (2 requests in flight)" in err.message
    assert err.headers()["Retry-After"] == "1"
    limiter.release(k)
    limiter.admit(k)


def test_a_key_without_limits_is_never_counted() -> None:
    limiter = KeyLimiter(Clock(0.0))
    k = key()
    for _ in range(1000):
        limiter.admit(k)


async def test_over_a_limit_is_429_in_the_path_envelope(tmp_path: Path) -> None:
    limited = ApiKey(
        "capped",
        key_digest("rk-capped"),
        frozenset({Scope.USE}),
        limits=KeyLimits(requests_per_minute=2),
    )
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        up.keys.replace(KeyRing([limited]))
        headers = {"Authorization": "Bearer rk-capped"}
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(2):
            assert (
                await client.post("/v1/chat/completions", json=chat, headers=headers)
            ).status_code == 200
        openai_way = await client.post("/v1/chat/completions", json=chat, headers=headers)
        assert openai_way.status_code == 429
        assert openai_way.json()["error"]["code"] == "key_limit"
        assert "requests_per_minute" in openai_way.json()["error"]["message"]
        assert 58 <= int(openai_way.headers["retry-after"]) <= 60
        anthropic_way = await client.post("/v1/messages", json=chat, headers=headers)
        assert anthropic_way.status_code == 429
        assert anthropic_way.json()["error"]["type"] == "rate_limit_error"
        assert "requests_per_minute" in anthropic_way.json()["error"]["message"]
        assert "retry-after" in anthropic_way.headers
        ollama_way = await client.post("/api/chat", json={**chat, "stream": False}, headers=headers)
        assert ollama_way.status_code == 429
        assert "requests_per_minute" in ollama_way.json()["error"]
        assert "retry-after" in ollama_way.headers
        # Other scopes' paths are not counted (a watch request is no inference).
        assert (await client.get("/health")).status_code == 200


async def test_tokens_per_day_counts_what_the_backend_reported(tmp_path: Path) -> None:
    capped = ApiKey("tok", key_digest("rk-tok"), limits=KeyLimits(tokens_per_day=12))
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        up.keys.replace(KeyRing([capped]))
        headers = {"Authorization": "Bearer rk-tok"}
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        statuses = []
        for _ in range(4):  # the stand-in reports 3 + 2 tokens an answer
            r = await client.post("/v1/chat/completions", json=chat, headers=headers)
            statuses.append(r.status_code)
            await asyncio.sleep(0)
        assert statuses == [200, 200, 200, 429]  # 15 tokens after three: over 12
        assert "tokens_per_day" in r.json()["error"]["message"]
