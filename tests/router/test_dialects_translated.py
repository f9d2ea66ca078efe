"""Anthropic Messages and OpenAI Responses through a backend that serves chat completions only.

The backend is a stand-in for mlx_lm.server (which needs Apple hardware): a small
Starlette app serving only ``POST /v1/chat/completions``, plain and streamed, that records
every request it gets. It answers with a tool call when the request offers tools and has
no tool result yet, else with a fixed text. The router runs for real (uvicorn, the
scheduler, the proxy); clients are the official ``anthropic`` and ``openai`` SDKs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rosterd.backends.values import Endpoint
from rosterd.router import RoleRoute, RouterConfig, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.usage import UsageStore
from support.backends import NoLiveness, pick_free_port

MIB = 2**20
TEXT = "Paris is the capital of France."


def stand_in_mlx_server(seen: list[dict[str, Any]]) -> Starlette:
    """Stands in for mlx_lm.server: chat completions only (no /v1/messages, /v1/responses)."""

    def tool_call_wanted(body: dict[str, Any]) -> bool:
        return bool(body.get("tools")) and not any(m["role"] == "tool" for m in body["messages"])

    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        model = body["model"]
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": TEXT}
            finish = "stop"
            if tool_call_wanted(body):
                call = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": call}],
                }
                finish = "tool_calls"
            return JSONResponse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                }
            )

        async def chunks() -> AsyncIterator[bytes]:
            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                data = {"id": "chatcmpl-2", "model": model, "choices": [choice]}
                return b"data: " + json.dumps(data).encode() + b"\n\n"

            if tool_call_wanted(body):
                first = {"index": 0, "id": "call_9", "function": {"name": "get_weather"}}
                yield chunk({"role": "assistant", "tool_calls": [first]})
                for piece in ('{"city": ', '"Paris"}'):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                yield chunk({}, "tool_calls")
            else:
                for word in TEXT.split(" "):
                    yield chunk({"content": word + " "})
                    await asyncio.sleep(0)
                yield chunk({}, "stop")
            usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


class StandInBackends(NoLiveness):
    """Every role "starts" at once on the stand-in server's port."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def start(self, role: str) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.port}", f"{role}-served")

    async def stop(self, role: str) -> None:
        return None


@contextlib.asynccontextmanager
async def _serve(app: Any, port: int) -> AsyncIterator[None]:
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


@contextlib.asynccontextmanager
async def router_over_stand_in(
    config: RouterConfig | None = None, usage: UsageStore | None = None
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """The router (role ``mlx-chat``, flavor mlx_lm, no native dialect) over the stand-in,
    keeping its usage in ``usage`` when given; yields its URL and the list of chat requests
    the stand-in got."""
    seen: list[dict[str, Any]] = []
    backend_port, router_port = pick_free_port(), pick_free_port()
    spec = InferenceSpec(
        role="mlx-chat", flavor=InferFlavor.MLX_LM, model="mlx-m", memory=MemorySpec(MIB)
    )
    node = NodeScheduler("n1", 100 * MIB, {"mlx-chat": spec}, StandInBackends(backend_port))
    scheduler = NodeDirectory({"n1": node})
    route = RoleRoute("mlx-chat", names=("mlx-m",), flavor="mlx_lm", native=frozenset())
    app = create_app(scheduler, {"mlx-chat": route}, config=config, usage=usage)
    async with _serve(stand_in_mlx_server(seen), backend_port), _serve(app, router_port):
        try:
            yield f"http://127.0.0.1:{router_port}", seen
        finally:
            await scheduler.shutdown()


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def test_messages_translated_plain_streamed_and_tool_round_trip() -> None:
    async with router_over_stand_in() as (url, seen):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        async with client:
            await messages_round_trips(client, seen)


async def messages_round_trips(
    client: anthropic.AsyncAnthropic, seen: list[dict[str, Any]]
) -> None:
    reply = await client.messages.create(
        model="mlx-m",
        max_tokens=32,
        system="Answer briefly.",
        messages=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                    },
                ],
            },
        ],
        stop_sequences=["\n\n"],
    )
    assert reply.type == "message"
    assert reply.role == "assistant"
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == TEXT  # type: ignore[union-attr]
    assert reply.stop_reason == "end_turn"
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (11, 7)
    sent = seen[-1]
    assert sent["model"] == "mlx-chat-served"  # rewritten to the backend's name
    assert sent["max_tokens"] == 32
    assert sent["stop"] == ["\n\n"]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][0]["content"] == "Answer briefly."
    assert sent["messages"][3]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }

    async with client.messages.stream(
        model="mlx-m", max_tokens=32, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert kinds.count("text") >= 5  # relayed event by event, one per chat chunk
    assert final.content[0].text.strip() == TEXT  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 7

    asked: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Weather in Paris?"}]
    call = await client.messages.create(
        model="mlx-chat",
        max_tokens=32,
        messages=asked,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert call.stop_reason == "tool_use"
    use = call.content[0]
    assert use.type == "tool_use"
    assert use.name == "get_weather"
    assert use.input == {"city": "Paris"}
    assert seen[-1]["tools"][0]["function"]["parameters"] == WEATHER_TOOL["input_schema"]
    answer = await client.messages.create(
        model="mlx-chat",
        max_tokens=32,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[
            *asked,
            {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[misc,list-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert answer.stop_reason == "end_turn"
    tool_turn = seen[-1]["messages"]
    assert tool_turn[1]["tool_calls"][0]["id"] == use.id
    assert tool_turn[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}

    async with client.messages.stream(
        model="mlx-chat",
        max_tokens=32,
        messages=asked,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    ) as stream:
        streamed = await stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert streamed.content[0].input == {"city": "Paris"}  # type: ignore[union-attr]


async def test_messages_errors_come_in_anthropics_envelope() -> None:
    async with router_over_stand_in(RouterConfig(api_keys=("right",))) as (url, seen):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="wrong", max_retries=0)
        keyed = anthropic.AsyncAnthropic(base_url=url, api_key="right", max_retries=0)
        async with client, keyed:
            await messages_errors(client, keyed, url, seen)


async def messages_errors(
    client: anthropic.AsyncAnthropic,
    keyed: anthropic.AsyncAnthropic,
    url: str,
    seen: list[dict[str, Any]],
) -> None:
    with pytest.raises(anthropic.AuthenticationError) as auth:
        await client.messages.create(
            model="mlx-m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert auth.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    with pytest.raises(anthropic.NotFoundError) as missing:
        await keyed.messages.create(
            model="nope", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )
    assert "known models: mlx-chat" in str(missing.value)
    # count_tokens has no chat equivalent: 501 naming the role and flavor, before any load
    async with httpx.AsyncClient() as http:
        counted = await http.post(
            url + "/v1/messages/count_tokens",
            headers={"x-api-key": "right"},
            json={"model": "mlx-m", "messages": [{"role": "user", "content": "Hi"}]},
        )
        bad = await http.post(
            url + "/v1/messages",
            headers={"x-api-key": "right"},
            json={"model": "mlx-m", "max_tokens": 8, "messages": "Hi"},
        )
        rerank = await http.post(
            url + "/v1/rerank",
            headers={"authorization": "Bearer right"},
            json={"model": "mlx-m", "query": "q", "documents": ["a", "b"]},
        )
    assert counted.status_code == 501
    assert counted.json()["type"] == "error"
    assert "role 'mlx-chat' (flavor mlx_lm)" in counted.json()["error"]["message"]
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert rerank.status_code == 400
    assert "role 'mlx-chat' (flavor mlx_lm) cannot rerank" in rerank.json()["error"]["message"]
    assert "reranking: true" in rerank.json()["error"]["message"]
    assert seen == []  # none of them reached the backend


async def test_responses_translated_plain_streamed_and_no_equivalent() -> None:
    async with router_over_stand_in() as (url, seen):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with client:
            await responses_round_trips(client, seen)


async def responses_round_trips(client: openai.AsyncOpenAI, seen: list[dict[str, Any]]) -> None:
    reply = await client.responses.create(
        model="mlx-m", input="What is the capital of France?", instructions="Be brief."
    )
    assert reply.output_text == TEXT
    assert reply.status == "completed"
    assert reply.usage is not None
    assert reply.usage.output_tokens == 7
    assert [m["role"] for m in seen[-1]["messages"]] == ["system", "user"]

    stream = await client.responses.create(model="mlx-m", input="Hello", stream=True)
    kinds: list[str] = []
    text = ""
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") >= 5
    assert text.strip() == TEXT

    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    called = await client.responses.create(
        model="mlx-m",
        input="Weather in Paris?",
        tools=[tool],  # type: ignore[list-item]
    )
    assert called.output[0].type == "function_call"
    assert json.loads(called.output[0].arguments) == {"city": "Paris"}

    asked = len(seen)
    with pytest.raises(openai.APIStatusError) as refused:
        await client.responses.create(
            model="mlx-m", input="Hi", tools=[{"type": "web_search_preview"}]
        )
    assert refused.value.status_code == 501
    assert "role 'mlx-chat' (flavor mlx_lm)" in refused.value.message
    assert "tools[0].type='web_search_preview'" in refused.value.message
    assert len(seen) == asked


async def test_a_translated_answer_carries_rosterds_headers_as_a_passed_through_one() -> None:
    async with router_over_stand_in() as (url, _), httpx.AsyncClient(base_url=url) as client:
        body = {"model": "mlx-m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        plain = await client.post("/v1/messages", json=body)
        streamed = await client.post("/v1/messages", json={**body, "stream": True})
    for answer in (plain, streamed):
        assert answer.status_code == 200
        assert answer.headers["x-rosterd-role"] == "mlx-chat"
        assert "x-rosterd-queue-wait-s" in answer.headers


async def test_a_translated_answer_counts_the_tokens_the_backend_reported(tmp_path: Path) -> None:
    """Usage per key (and the tokens-per-day limits, which count the same) reads the chat
    completion's own usage: 11 prompt and 7 completion tokens each, plain or streamed, though
    the dialect's answer says them in its own words."""
    store = UsageStore(tmp_path)
    store.open()
    try:
        async with (
            router_over_stand_in(usage=store) as (url, _),
            httpx.AsyncClient(base_url=url) as client,
        ):
            messages = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            responses = {"max_output_tokens": 8, "input": "hi"}
            for path, body in (("/v1/messages", messages), ("/v1/responses", responses)):
                for stream in (False, True):
                    payload = {**body, "model": "mlx-m", "stream": stream}
                    answer = await client.post(path, json=payload)
                    assert answer.status_code == 200, answer.text
            rows = (await client.get("/rosterd/usage")).json()["rows"]
    finally:
        store.close()
    assert [
        (r["role"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows
    ] == [("mlx-chat", 4, 4 * 11, 4 * 7)]
