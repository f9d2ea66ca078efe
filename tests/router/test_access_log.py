"""The access log: one line per request, refusals and backend failures with their reason.

A router over stand-in backends (a backend nobody listens on: every generation is a
backend failure) gets requests of the OpenAI, Anthropic and Ollama dialects, a body
that is not JSON, an unknown model and a wrong API key; each leaves exactly one
line on the ``rosterd.access`` logger with the model asked, the status and, for a
4xx or 5xx, the code and the reason the client was given. The JSON form parses
line by line; the plain form quotes values with spaces.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rosterd.backends.values import Endpoint
from rosterd.keys.values import MASTER_NAME
from rosterd.router import RouterConfig
from rosterd.router.access_log import (
    AccessFormatter,
    AccessLine,
    AccessLog,
    dialect_of,
    plain_line,
)
from rosterd.router.wait_report import wait_headers
from rosterd.scheduler.lease import Lease
from support.router import serve


@pytest.fixture
def access_text() -> Iterator[io.StringIO]:
    """What the ``rosterd.access`` logger writes, in the JSON form."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(AccessFormatter("json"))
    logger = logging.getLogger("rosterd.access")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def test_every_request_leaves_one_line_with_its_reason(
    tmp_path: Path, access_text: io.StringIO
) -> None:
    config = RouterConfig(api_keys=("lab-key",))
    async with serve(tmp_path, config=config) as router:
        key = {"Authorization": "Bearer lab-key"}
        async with httpx.AsyncClient(base_url=router.url, headers=key, timeout=30) as client:
            hi = [{"role": "user", "content": "Hi"}]
            chat = await client.post("/v1/chat/completions", json={"model": "chat", "messages": hi})
            claude = await client.post(
                "/v1/messages", json={"model": "chat-m", "max_tokens": 4, "messages": hi}
            )
            ollama = await client.post(
                "/api/chat", json={"model": "quiet", "messages": hi, "stream": False}
            )
            bad_json = await client.post("/v1/chat/completions", content=b"{not json")
            unknown = await client.post(
                "/v1/chat/completions", json={"model": "nope", "messages": hi}
            )
            wrong_key = await client.post(
                "/v1/chat/completions",
                json={"model": "chat", "messages": hi},
                headers={"Authorization": "Bearer not-it"},
            )
    answers = [chat, claude, ollama, bad_json, unknown, wrong_key]
    lines = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert [(x["path"], x["status"]) for x in lines] == [
        (a.request.url.path, a.status_code) for a in answers
    ]
    assert [x["dialect"] for x in lines] == [
        "openai",
        "anthropic",
        "ollama",
        "openai",
        "openai",
        "openai",
    ]
    # A wrong key is refused before its body is read: no model to log.
    assert [x["model"] for x in lines] == ["chat", "chat-m", "quiet", "", "nope", ""]
    # rosterd's own code in every dialect (X-Rosterd-Error), not its envelope's word
    assert [x["code"] for x in lines] == [
        "backend_error",
        "backend_error",  # Anthropic's envelope says api_error
        "backend_error",  # Ollama's envelope has no code
        "invalid_json",
        "model_not_found",
        "invalid_api_key",
    ]
    for line, answer in zip(lines, answers, strict=True):
        assert answer.status_code >= 400
        assert line["reason"]
        assert line["reason"] in answer.text.replace('\\"', '"') or line["reason"] in str(
            answer.json()
        )
        assert line["client"].startswith("127.0.0.1:")
        assert line["duration_s"] >= 0
    # The key's name, never the key: an --api-key key is named so; a wrong key has none.
    assert [x["key"] for x in lines] == [MASTER_NAME] * 5 + [""]
    assert "lab-key" not in access_text.getvalue()
    # A backend failure's reason names its role; every line of a request whose model
    # resolved carries its role and node, refusals too (no X-Rosterd-* headers on those).
    assert "backend of role 'chat' failed" in lines[0]["reason"]
    assert "backend of role 'quiet' failed" in lines[2]["reason"]
    assert [(x["role"], x["node"]) for x in lines] == [
        ("chat", "n1"),
        ("chat", "n1"),
        ("quiet", "n1"),
        ("", ""),
        ("", ""),
        ("", ""),
    ]


async def test_a_refusal_before_the_backend_names_role_and_node(
    tmp_path: Path, access_text: io.StringIO
) -> None:
    async with (
        serve(tmp_path) as router,
        httpx.AsyncClient(base_url=router.url, timeout=30) as client,
    ):
        empty = await client.post("/v1/chat/completions", json={"model": "chat-m", "messages": []})
    assert empty.status_code == 400
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["model"], line["role"], line["node"], line["status"]) == (
        "chat-m",
        "chat",
        "n1",
        400,
    )
    assert line["code"] == "bad_request"
    assert line["reason"].startswith("messages: the list is empty")


def test_plain_form_quotes_what_has_spaces_and_dialects_are_named() -> None:
    line = AccessLine(
        time="2026-01-01T00:00:00.000+00:00",
        client="127.0.0.1:5000",
        key="",
        dialect="openai",
        method="POST",
        path="/v1/chat/completions",
        model="chat-small",
        role="chat-small",
        node="box",
        status=400,
        code="not_supported",
        reason="role 'x' was started without --jinja",
        queue_wait_s=0.0,
        load_s=None,
        first_byte_s=0.0123,
        duration_s=0.5,
        tokens_in=None,
        tokens_out=None,
    )
    text = plain_line(line)
    assert 'key="" ' in text
    assert "status=400 code=not_supported reason=\"role 'x' was started without --jinja\"" in text
    assert "load_s=- first_byte_s=0.012" in text
    assert [dialect_of(p) for p in ("/v1/responses", "/rerank", "/status")] == [
        "responses",
        "rerank",
        "rosterd",
    ]


async def test_a_served_answer_logs_role_node_waits_and_tokens(access_text: io.StringIO) -> None:
    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        told = [(b"x-rosterd-role", b"chat"), (b"x-rosterd-node", b"n1")]
        told += [(b"x-rosterd-queue-wait-s", b"0.250"), (b"x-rosterd-load-s", b"1.500")]
        await send({"type": "http.response.start", "status": 200, "headers": told})
        usage = b'data: {"usage":{"prompt_tokens":12,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
        await send({"type": "http.response.body", "body": usage, "more_body": False})

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"model":"chat-small"}', "more_body": False}

    async def send(message: Message) -> None:
        return None

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "client": ("10.0.0.7", 4242),
    }
    await AccessLog(served)(scope, receive, send)
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert line["client"] == "10.0.0.7:4242"
    assert (line["model"], line["role"], line["node"], line["status"]) == (
        "chat-small",
        "chat",
        "n1",
        200,
    )
    assert (line["queue_wait_s"], line["load_s"]) == (0.25, 1.5)
    assert (line["tokens_in"], line["tokens_out"]) == (12, 3)
    assert (line["code"], line["reason"]) == ("", "")
    assert line["first_byte_s"] is not None


async def test_a_further_copy_on_its_nodes_other_device_is_told_apart(
    access_text: io.StringIO,
) -> None:
    # replicas: 2 on one node's two GPUs: the answer of chat~2 says which copy served it,
    # in a header and in the access log's node; the first copy's answers say the node alone.
    endpoint = Endpoint("http://127.0.0.1:1", "m", 1)
    further = Lease("chat", "box", endpoint, 1, 0.0, copy="chat~2")
    first = Lease("chat", "box", endpoint, 1, 0.0)
    assert (b"x-rosterd-copy", b"box/chat~2") in wait_headers(further, 0.0, (), {})
    assert b"x-rosterd-copy" not in dict(wait_headers(first, 0.0, (), {}))

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        told = wait_headers(further, 0.0, (), {})
        await send({"type": "http.response.start", "status": 200, "headers": told})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"model":"chat"}', "more_body": False}

    async def send(message: Message) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    await AccessLog(served)(scope, receive, send)
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["role"], line["node"]) == ("chat", "box/chat~2")


async def served_then_left(app: ASGIApp) -> None:
    """Run ``app`` behind :class:`AccessLog` for a chat request whose client disconnects
    after sending it (the next ``receive`` says ``http.disconnect``)."""
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"model":"chat"}', "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": None}
    await AccessLog(app)(scope, receive, send)


async def test_a_client_that_leaves_a_stream_is_logged_as_leaving(
    access_text: io.StringIO,
) -> None:
    """A stream whose client disconnects before its end is status 499 (nginx's "client
    closed request") with the reason, not the 200 its headers said."""
    left = asyncio.Event()

    async def streaming(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        told = [(b"x-rosterd-role", b"chat"), (b"x-rosterd-node", b"n1")]
        await send({"type": "http.response.start", "status": 200, "headers": told})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        left.set()

    await served_then_left(streaming)
    assert left.is_set()
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["role"], line["status"], line["code"]) == ("chat", 499, "client_closed")
    assert "client closed the connection" in line["reason"]


async def test_a_client_that_closes_after_the_streams_final_event_was_served(
    access_text: io.StringIO,
) -> None:
    """The SDKs close the connection as soon as they read ``data: [DONE]`` (or
    ``message_stop``), which can come before the body's own close: a whole answer,
    logged 200, not a client that left."""

    async def streaming(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        told = [(b"x-rosterd-role", b"chat"), (b"x-rosterd-node", b"n1")]
        await send({"type": "http.response.start", "status": 200, "headers": told})
        body = b"data: {}\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": body, "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    await served_then_left(streaming)
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["role"], line["status"], line["code"]) == ("chat", 200, "")


async def test_a_stream_without_usage_logs_llama_servers_own_counts(
    access_text: io.StringIO,
) -> None:
    """llama-server sends ``usage`` in a stream only when asked; its last chunk's
    ``timings`` always count the tokens (prompt evaluated plus reused, and predicted)."""
    last = (
        b'data: {"choices":[{"finish_reason":"length","delta":{}}],'
        b'"timings":{"cache_n":4,"prompt_n":9,"predicted_n":160}}\n\ndata: [DONE]\n\n'
    )

    async def streaming(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": last, "more_body": False})

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"model":"chat"}', "more_body": False}

    async def send(message: Message) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": None}
    await AccessLog(streaming)(scope, receive, send)
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["tokens_in"], line["tokens_out"], line["status"]) == (13, 160, 200)


async def test_an_anthropic_answer_logs_the_whole_prompt_with_what_its_cache_held(
    access_text: io.StringIO,
) -> None:
    """Anthropic's ``input_tokens`` leaves out what its cache held: the log counts the whole
    prompt, as the key's usage does (an OpenAI answer to the same prompt says 16)."""
    body = b'{"type":"message","usage":{"input_tokens":1,"cache_read_input_tokens":15,'
    body += b'"output_tokens":4}}'

    async def answering(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def receive() -> Message:
        return {"type": "http.request", "body": b'{"model":"chat"}', "more_body": False}

    async def send(message: Message) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "client": None}
    await AccessLog(answering)(scope, receive, send)
    [line] = [json.loads(text) for text in access_text.getvalue().splitlines()]
    assert (line["tokens_in"], line["tokens_out"]) == (16, 4)
