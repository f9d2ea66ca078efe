"""A stream's missing opening events are put back (pure, on the byte shapes llama-server
sends; end to end in ``test_model_echo`` and ``test_stream_repair_real``).

llama-server drops a Messages stream's ``message_start`` (and a block's
``content_block_start``) when its first token ends inside a UTF-8 character, and its
Responses stream repeats ``response.created`` mid-way: the anthropic SDK then sees no
``message_start`` at all. Each case below is a stream seen from llama.cpp 0.3.36.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Message

from rosterd.router.stream_repair import StreamRepair

START: Message = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}


def event(name: str, data: Mapping[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def delta(text: str, index: int = 0) -> bytes:
    body = {"type": "text_delta", "text": text}
    return event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
    )


END = event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 4}}) + event(
    "message_stop", {"type": "message_stop"}
)


async def repaired(chunks: list[bytes], path: str = "/v1/messages") -> bytes:
    """The body a client reads after ``StreamRepair``, ``chunks`` sent one by one."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    repair = StreamRepair.wrap(send, path, {"stream": True}, "tiny")
    await repair(START)
    for n, chunk in enumerate(chunks):
        more = n < len(chunks) - 1
        await repair({"type": "http.response.body", "body": chunk, "more_body": more})
    assert sent[0] is START
    assert sent[-1]["more_body"] is False
    return b"".join(m.get("body", b"") for m in sent[1:])


async def mended(
    chunks: list[bytes], path: str = "/v1/messages"
) -> list[tuple[str, dict[str, Any]]]:
    """The events a client reads after ``StreamRepair``, as (name, data)."""
    events = []
    for block in (await repaired(chunks, path)).decode().split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.split("\n"))
            events.append((lines["event"], json.loads(lines["data"])))
    return events


async def test_a_messages_stream_without_its_message_start_gets_one_first() -> None:
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    stream = [event("content_block_start", block) + delta("\ufffd3"), delta("x") + END]
    events = await mended(stream)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "message_delta",
        "message_stop",
    ]
    message = events[0][1]["message"]
    assert (message["role"], message["model"], message["content"]) == ("assistant", "tiny", [])
    assert message["id"].startswith("msg_")


async def test_a_rebuilt_message_start_says_the_prompts_tokens_as_the_backend_counts_them() -> None:
    asked: list[str] = []

    async def count() -> int | None:
        asked.append("count_tokens")
        return 56

    async def run(chunks: list[bytes]) -> bytes:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        repair = StreamRepair.wrap(send, "/v1/messages", {"stream": True}, "tiny", count)
        assert isinstance(repair, StreamRepair)
        await repair(START)
        for chunk in chunks:
            await repair({"type": "http.response.body", "body": chunk, "more_body": True})
        await repair({"type": "http.response.body", "body": b"", "more_body": False})
        return repair.rebuilt_start

    rebuilt = await run([delta("\u4f60") + END])
    assert json.loads(rebuilt.split(b"data: ")[1])["message"]["usage"]["input_tokens"] == 56
    assert asked == ["count_tokens"]
    start = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 9}}}
    assert await run([event("message_start", start) + delta("hi") + END]) == b""
    assert asked == ["count_tokens"]  # a stream that has its message_start asks nothing


async def test_a_delta_without_its_blocks_start_gets_one() -> None:
    events = await mended([delta("\u06aa") + END])
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }


async def test_a_blocks_stop_without_its_start_gets_one() -> None:
    stop = event("content_block_stop", {"type": "content_block_stop", "index": 0})
    names = [name for name, _ in await mended([stop + END])]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_a_whole_stream_passes_unchanged_even_cut_inside_its_events() -> None:
    start = {"type": "message_start", "message": {"id": "m", "model": "tiny", "content": []}}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    whole = event("message_start", start) + event("content_block_start", block)
    whole += delta("hi") + END
    for cut in (1, 17, len(whole) // 2, len(whole) - 3):
        assert await repaired([whole[:cut], whole[cut:]]) == whole


async def test_a_responses_stream_keeps_one_opening_and_gets_one_when_it_has_none() -> None:
    created = {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}
    progress = {**created, "type": "response.in_progress"}
    item = {"type": "response.output_item.added", "item": {"id": "msg_1", "content": []}}
    text = {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "\u4f60"}
    done = {"type": "response.completed", "response": {"id": "resp_1", "output": []}}
    repeated = [
        event("response.created", created) + event("response.in_progress", progress),
        event("response.output_item.added", item) + event("response.output_text.delta", text),
        event("response.created", created) + event("response.in_progress", progress),
        event("response.output_text.delta", {**text, "delta": "\u597d"}),
        event("response.completed", done),
    ]
    names = [name for name, _ in await mended(repeated, "/v1/responses")]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    bare = await mended(
        [event("response.output_text.delta", text), event("response.completed", done)],
        "/v1/responses",
    )
    assert [name for name, _ in bare] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.completed",
    ]
    assert bare[2][1]["item"]["id"] == "msg_1"


async def test_plain_answers_other_paths_and_unstreamed_requests_pass_as_they_are() -> None:
    async def send(message: Message) -> None:
        raise AssertionError(message)

    assert StreamRepair.wrap(send, "/v1/chat/completions", {"stream": True}, "t") is send
    assert StreamRepair.wrap(send, "/v1/messages", {"stream": False}, "t") is send
    sent: list[Message] = []

    async def keep(message: Message) -> None:
        sent.append(message)

    opening = StreamRepair.wrap(keep, "/v1/messages", {"stream": True}, "t")
    plain = {**START, "headers": [(b"content-type", b"application/json")]}
    await opening(plain)
    body = {"type": "http.response.body", "body": b'{"error": 1}', "more_body": False}
    await opening(body)
    assert sent == [plain, body]


@given(st.lists(st.integers(min_value=1, max_value=400), max_size=6))
async def test_any_cutting_of_a_broken_stream_reads_the_same(cuts: list[int]) -> None:
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    whole = event("content_block_start", block) + delta("a") + delta("b") + END
    points = sorted({min(c, len(whole)) for c in cuts})
    pieces = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)], strict=True)]
    events = await mended([p for p in pieces if p] or [whole])
    names = [name for name, _ in events]
    assert names.count("message_start") == 1
    assert names[0] == "message_start"
    assert names[1:] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "message_delta",
        "message_stop",
    ]
