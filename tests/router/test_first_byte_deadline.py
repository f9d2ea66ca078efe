"""A request's first-byte deadline follows from its size and its role's speed
(``rosterd.router.deadlines``, ``rosterd.router.speeds``): the rule's figures, the speeds
learnt from llama-server's ``timings`` and from a stream's first byte, and the deadline
kept while the progress check vouches for the backend. Plain asyncio, no server: the
forward here is a coroutine that sends nothing, as a wedged backend does.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.types import Message, Send

from rosterd.errors import StalledError
from rosterd.router.deadlines import (
    Deadlines,
    FirstByteRule,
    first_byte_deadline_s,
    forward_within_deadlines,
)
from rosterd.router.speeds import RoleSpeeds, Speeds, estimated_speeds

RULE = FirstByteRule(floor_s=20.0, factor=4.0)
GIB = 2**30


def test_a_short_prompt_gets_the_floor_and_a_long_one_its_reading_time_times_the_factor() -> None:
    speeds = Speeds(prefill=100.0, decode=10.0)
    short = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert first_byte_deadline_s(short, speeds, RULE, 300.0) == 20.0
    text = "word " * 3000  # 15,000 bytes: 5,000 tokens counted, 50 s at 100 tokens/s
    long = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": True}
    deadline = first_byte_deadline_s(long, speeds, RULE, 300.0)
    assert 200.0 <= deadline <= 210.0
    assert first_byte_deadline_s(long, speeds, RULE, 60.0) == 60.0  # --first-byte-timeout


def test_a_whole_answer_waits_for_its_tokens_too_and_without_a_bound_gets_the_cap() -> None:
    speeds = Speeds(prefill=1000.0, decode=10.0)
    bounded = {"model": "m", "prompt": "hi", "max_tokens": 100}
    assert first_byte_deadline_s(bounded, speeds, RULE, 300.0) == pytest.approx(40.0, abs=1)
    assert first_byte_deadline_s({"model": "m", "prompt": "hi"}, speeds, RULE, 300.0) == 300.0


def test_an_unmeasured_role_is_estimated_slower_the_bigger_it_is() -> None:
    small, big = estimated_speeds(GIB // 2), estimated_speeds(8 * GIB)
    assert small.prefill > big.prefill
    assert small.decode > big.decode
    assert not small.measured
    assert estimated_speeds(0) == estimated_speeds(GIB)  # unknown size: counted as 1 GiB


def test_speeds_are_learnt_from_llama_servers_timings_and_the_slowest_recent_counts() -> None:
    speeds = RoleSpeeds()
    timings = {"prompt_n": 12, "prompt_per_second": 150.5, "predicted_per_second": 31.0}
    tail = json.dumps({"choices": [], "timings": timings}).encode()
    speeds.answered("chat", tail, first_byte_s=None, streamed=False)
    assert speeds.of("chat", GIB) == Speeds(150.5, 31.0, measured=True)
    cached = {"prompt_per_second": 9000.0, "predicted_per_second": 40.0}
    speeds.answered("chat", json.dumps({"timings": cached}).encode(), None, streamed=False)
    assert speeds.of("chat", GIB).prefill == 150.5  # a cached prompt does not shorten it


def test_a_backend_without_timings_is_timed_by_its_streams_first_byte_only() -> None:
    speeds = RoleSpeeds()
    usage = b'data: {"usage":{"prompt_tokens":400,"completion_tokens":5}}\n\ndata: [DONE]\n\n'
    speeds.answered("mlx", usage, first_byte_s=2.0, streamed=False)
    assert not speeds.of("mlx", GIB).measured  # a whole answer's first byte is its last
    speeds.answered("mlx", usage, first_byte_s=2.0, streamed=True)
    assert speeds.of("mlx", GIB).prefill == 200.0


async def silent(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await asyncio.sleep(10)


async def drop(message: Message) -> None:
    return None


async def test_a_request_nobody_vouches_for_ends_at_its_own_deadline() -> None:
    deadlines = Deadlines(first_byte_s=0.2, between_chunks_s=5.0, first_byte_cap_s=5.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(StalledError) as stall:
        await forward_within_deadlines(silent, drop, deadlines, "r", vouched=lambda: False)
    assert loop.time() - began < 1.0
    assert stall.value.waited_s == 0.2
    assert "prompt's size" in str(stall.value)


async def test_a_request_its_backend_vouches_for_waits_up_to_the_cap() -> None:
    deadlines = Deadlines(first_byte_s=0.1, between_chunks_s=5.0, first_byte_cap_s=0.4)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(StalledError) as stall:
        await forward_within_deadlines(silent, drop, deadlines, "r", vouched=lambda: True)
    assert loop.time() - began >= 0.4
    assert "(--first-byte-timeout)" in str(stall.value)


async def test_the_time_to_the_first_byte_is_returned() -> None:
    async def answers(send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"x"})

    took_s = await forward_within_deadlines(answers, drop, Deadlines(1.0, 1.0), "r")
    assert took_s is not None
    assert 0.1 <= took_s < 0.5
