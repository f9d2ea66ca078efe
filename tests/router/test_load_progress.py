"""What a stream waiting for a load is sent (``rosterd.router.load_progress``): the progress
line, its bytes per path and mode, the expected total, and the answer after an early head.
The end-to-end behaviour, through the official clients, is ``tests/e2e/test_up_load_progress.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from starlette.types import Message

from rosterd.backends.values import Endpoint
from rosterd.flavors import InferFlavor
from rosterd.router.dialects.envelope import ANTHROPIC_ENVELOPE, OPENAI_ENVELOPE
from rosterd.router.load_progress import (
    ASSUMED_READ_BYTES_PER_S,
    PAST_LOADS_USED,
    continue_stream,
    expected_load_s,
    progress_messages,
    progress_text,
    wants_progress,
)
from rosterd.router.routing import LoadProgressMode
from rosterd.scheduler.values import SchedulerEvent
from rosterd.spec import InferenceSpec, MemorySpec
from support.router import NoBackends, serve


def _event(kind: str, role: str, duration_s: float | None = None) -> SchedulerEvent:
    return SchedulerEvent(1.0, "box", kind, role, "", (), 0, duration_s)


def test_the_expected_total_is_the_last_load_on_the_node_else_the_weights_at_a_disk_rate() -> None:
    spec = InferenceSpec("big", InferFlavor.LLAMACPP, memory=MemorySpec(weights_bytes=12 * 2**30))
    events = [
        _event("loaded", "big", 20.0),
        _event("loaded", "other", 3.0),
        _event("loaded", "big", 9.5),
    ]
    assert expected_load_s("big", events, spec) == 9.5
    assert (
        expected_load_s("big", [_event("loaded", "other", 3.0)], spec)
        == 12 * 2**30 / ASSUMED_READ_BYTES_PER_S
    )
    assert expected_load_s("big", [], None) == 0.0


def test_without_a_load_in_this_run_the_expected_total_is_the_median_of_the_recent_past_ones() -> (
    None
):
    spec = InferenceSpec("big", InferFlavor.LLAMACPP, memory=MemorySpec(weights_bytes=12 * 2**30))
    # Earlier runs' loads, oldest first: the old slow ones fall out of the last few read.
    past = [90.0, 80.0, 7.0, 30.0, 8.0, 9.0, 6.0]
    assert len(past) > PAST_LOADS_USED
    assert expected_load_s("big", [], spec, past) == 8.0  # median of 7, 30, 8, 9, 6
    assert expected_load_s("big", [_event("loaded", "other", 3.0)], spec, [4.0, 5.0]) == 4.5
    # A load in this run is the better guess: the node's disk and page cache as they are now.
    assert expected_load_s("big", [_event("loaded", "big", 2.5)], spec, past) == 2.5
    # No past loads (a first run, an older run's folder): the weights at a disk rate.
    assert expected_load_s("big", [], spec, ()) == 12 * 2**30 / ASSUMED_READ_BYTES_PER_S


def test_a_progress_line_names_the_role_the_seconds_the_expected_total_and_what_it_evicted() -> (
    None
):
    line = progress_text("chat-small", 3.2, 12.4, True, [("chat-big", "make_room")])
    assert line == "loading chat-small 3 s of ~12 s, evicted chat-big"
    assert progress_text("chat-small", 0.4, 0.0, False, []) == "waiting to load chat-small 0 s"


def test_openai_paths_get_sse_comments_and_anthropics_a_ping_event() -> None:
    line = "loading chat-small 3 s of ~12 s"
    assert progress_messages("/v1/completions", line, LoadProgressMode.TEXT, "m") == (
        b": loading chat-small 3 s of ~12 s\n\n"
    )
    ping = progress_messages("/v1/messages", line, LoadProgressMode.TEXT, "m")
    assert ping.endswith(b'event: ping\ndata: {"type": "ping"}\n\n')
    assert ping.startswith(b": loading chat-small")


def test_with_text_chat_completions_carry_the_line_as_reasoning_content() -> None:
    out = progress_messages("/v1/chat/completions", "loading a 1 s", LoadProgressMode.TEXT, "a")
    comment, chunk = out.split(b"\n\n", 1)
    assert comment == b": loading a 1 s"
    data = json.loads(chunk.removeprefix(b"data: "))
    assert data["object"] == "chat.completion.chunk"
    assert data["choices"][0]["delta"]["reasoning_content"] == "loading a 1 s\n"
    plain = progress_messages("/v1/chat/completions", "loading a 1 s", LoadProgressMode.PING, "a")
    assert plain == b": loading a 1 s\n\n"


def test_only_streamed_requests_on_sse_paths_get_progress_unless_it_is_off() -> None:
    assert wants_progress("/v1/chat/completions", {"stream": True}, LoadProgressMode.PING)
    assert not wants_progress("/v1/chat/completions", {}, LoadProgressMode.PING)
    assert not wants_progress("/v1/embeddings", {"stream": True}, LoadProgressMode.PING)
    assert not wants_progress("/v1/messages", {"stream": True}, LoadProgressMode.OFF)


def _through(envelope_path: str, messages: list[Message]) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    envelope = ANTHROPIC_ENVELOPE if envelope_path == "/v1/messages" else OPENAI_ENVELOPE

    async def run() -> None:
        send_on = continue_stream(send, envelope)
        for message in messages:
            await send_on(message)

    asyncio.run(run())
    return sent


def test_after_an_early_head_the_backends_head_is_dropped_and_its_body_passed_on() -> None:
    start = {"type": "http.response.start", "status": 200, "headers": []}
    body = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}
    assert _through("/v1/chat/completions", [start, body]) == [body]


def test_a_backends_refusal_after_an_early_head_becomes_the_paths_sse_error_event() -> None:
    start = {"type": "http.response.start", "status": 400, "headers": []}
    refusal = b'{"error": {"message": "the prompt is longer than the context"}}'
    half = {"type": "http.response.body", "body": refusal[:10], "more_body": True}
    rest = {"type": "http.response.body", "body": refusal[10:], "more_body": False}
    [openai_event] = _through("/v1/chat/completions", [start, half, rest])
    data = json.loads(openai_event["body"].removeprefix(b"data: "))
    assert data["error"]["message"] == "the prompt is longer than the context"
    assert openai_event["more_body"] is False
    [anthropic_event] = _through("/v1/messages", [start, half, rest])
    assert anthropic_event["body"].startswith(b"event: error\ndata: ")
    assert b"invalid_request_error" in anthropic_event["body"]


class _SlowStarts(NoBackends):
    """A start that takes 1.5 s, as a load does (the stand-in needs no process)."""

    async def start(self, role: str) -> Endpoint:
        await asyncio.sleep(1.5)
        return await super().start(role)


async def test_the_pages_stream_says_each_load_under_way_with_its_seconds_and_expected_total(
    tmp_path: Path,
) -> None:
    async with (
        serve(tmp_path, backends=_SlowStarts()) as up,
        httpx.AsyncClient(base_url=up.url, timeout=20) as client,
        client.stream("GET", "/rosterd/events/stream") as stream,
    ):
        lines = stream.aiter_lines()
        loader = asyncio.create_task(client.post("/rosterd/load/chat"))
        name = ""
        seen: list[dict[str, object]] = []
        async with asyncio.timeout(10):
            async for line in lines:
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name == "loads":
                    seen += json.loads(line.removeprefix("data: "))["loads"]
                    if any(float(load["elapsed_s"]) >= 0.5 for load in seen):  # type: ignore[arg-type]
                        break
        (await loader).raise_for_status()
        up.streams.close()
    load = seen[-1]
    assert (load["role"], load["node"]) == ("chat", "n1")
    assert load["expected_s"] == 1.0  # never loaded here: 1 MiB of weights, at least 1 s
