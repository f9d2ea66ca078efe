"""The pure translators of ``rosterd.router.dialects``, one table row per rule: a request
body in, the chat completions body out; a chat completion in, the dialect's answer out; an
error status in, the envelope's shape out. No server: values in, values out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rosterd.errors import RouterError
from rosterd.router.dialects.anthropic import chat_to_message, messages_to_chat
from rosterd.router.dialects.envelope import (
    ANTHROPIC_ENVELOPE,
    OPENAI_ENVELOPE,
    anthropic_error_body,
    anthropic_error_type,
    backend_error_text,
    envelope_for,
)
from rosterd.router.dialects.responses import chat_to_response, responses_to_chat

USER_HI = {"role": "user", "content": "hi"}
WEATHER_TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def chat_answer(message: dict[str, Any], finish: str = "stop", **usage: int) -> dict[str, Any]:
    """A chat completion whose first choice is ``message``."""
    return {
        "id": "chatcmpl-1",
        "model": "gemma",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage.get("given", 5),
            "completion_tokens": usage.get("made", 2),
        },
    }


# --------------------------------------------------------------------------- Anthropic Messages


@pytest.mark.parametrize(
    ("messages_request", "chat_request"),
    [
        pytest.param(
            {"model": "m", "max_tokens": 16, "messages": [USER_HI]},
            {"model": "m", "messages": [USER_HI], "max_tokens": 16},
            id="plain text; max_tokens kept",
        ),
        pytest.param(
            {
                "model": "m",
                "system": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "stop_sequences": ["END"],
            },
            {
                "model": "m",
                "messages": [{"role": "system", "content": "be brief"}, USER_HI],
                "temperature": 0.2,
                "top_p": 0.9,
                "top_k": 40,
                "stop": ["END"],
            },
            id="system blocks joined; text blocks as a string; stop_sequences -> stop",
        ),
        pytest.param(
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is it?"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/jpeg",
                                    "data": "QUJD",
                                },
                            },
                            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                        ],
                    }
                ],
            },
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is it?"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/jpeg;base64,QUJD"},
                            },
                            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                        ],
                    }
                ],
            },
            id="images as image_url parts",
        ),
        pytest.param(
            {
                "model": "m",
                "messages": [
                    USER_HI,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "hmm"},
                            {"type": "text", "text": "let me look"},
                            {
                                "type": "tool_use",
                                "id": "t1",
                                "name": "weather",
                                "input": {"city": "Oslo"},
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "and?"},
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": "rain",
                                "is_error": True,
                            },
                        ],
                    },
                ],
                "tools": [
                    {"name": "weather", "description": "now", "input_schema": WEATHER_TOOL_SCHEMA}
                ],
                "tool_choice": {"type": "any"},
            },
            {
                "model": "m",
                "messages": [
                    USER_HI,
                    {
                        "role": "assistant",
                        "content": "let me look",
                        "tool_calls": [
                            {
                                "id": "t1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "t1", "content": "error: rain"},
                    {"role": "user", "content": "and?"},
                ],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "weather",
                            "description": "now",
                            "parameters": WEATHER_TOOL_SCHEMA,
                        },
                    }
                ],
                "tool_choice": "required",
            },
            id="tool_use -> tool_calls, tool_result first as a tool message, thinking dropped",
        ),
        pytest.param(
            {
                "model": "m",
                "messages": [USER_HI],
                "tools": [{"name": "f"}],
                "tool_choice": {"type": "tool", "name": "f"},
                "stream": True,
            },
            {
                "model": "m",
                "messages": [USER_HI],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "description": "",
                            "parameters": {"type": "object", "properties": {}},
                        },
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            id="a named tool; a stream asks for usage",
        ),
    ],
)
def test_a_messages_request_becomes_this_chat_request(
    messages_request: dict[str, Any], chat_request: dict[str, Any]
) -> None:
    assert messages_to_chat(messages_request) == chat_request


@pytest.mark.parametrize(
    ("messages_request", "message"),
    [
        ({"messages": {"role": "user"}}, "'messages' must be a list"),
        ({"messages": [{"role": "system", "content": "x"}]}, r"messages\[0\] must be an object"),
        ({"messages": [{"role": "user", "content": 3}]}, r"messages\[0\]\.content must be"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}
                ]
            },
            "image source type 'file'",
        ),
    ],
)
def test_a_messages_request_chat_cannot_read_is_a_bad_request(
    messages_request: dict[str, Any], message: str
) -> None:
    with pytest.raises(RouterError, match=message) as raised:
        messages_to_chat(messages_request)
    assert (raised.value.code, raised.value.status) == ("bad_request", 400)


@pytest.mark.parametrize(
    ("chat", "answer"),
    [
        pytest.param(
            chat_answer({"role": "assistant", "content": "hello"}),
            {
                "id": "msg_chatcmpl-1",
                "type": "message",
                "role": "assistant",
                "model": "gemma",
                "content": [{"type": "text", "text": "hello"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 5, "output_tokens": 2},
            },
            id="text; stop -> end_turn",
        ),
        pytest.param(
            chat_answer(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}},
                        {"id": "c2", "function": {"name": "g", "arguments": "not json"}},
                    ],
                },
                "tool_calls",
            ),
            {
                "id": "msg_chatcmpl-1",
                "type": "message",
                "role": "assistant",
                "model": "gemma",
                "content": [
                    {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                    {
                        "type": "tool_use",
                        "id": "c2",
                        "name": "g",
                        "input": {"arguments": "not json"},
                    },
                ],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 5, "output_tokens": 2},
            },
            id="tool_calls -> tool_use blocks, arguments parsed (kept whole when not JSON)",
        ),
        pytest.param(
            chat_answer({"role": "assistant", "content": "cut"}, "length", given=7, made=16),
            {
                "id": "msg_chatcmpl-1",
                "type": "message",
                "role": "assistant",
                "model": "gemma",
                "content": [{"type": "text", "text": "cut"}],
                "stop_reason": "max_tokens",
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "output_tokens": 16},
            },
            id="length -> max_tokens",
        ),
    ],
)
def test_a_chat_completion_becomes_this_message(
    chat: dict[str, Any], answer: dict[str, Any]
) -> None:
    assert chat_to_message(chat) == answer


# --------------------------------------------------------------------------- OpenAI Responses


@pytest.mark.parametrize(
    ("responses_request", "chat_request"),
    [
        pytest.param(
            {
                "model": "m",
                "input": "hi",
                "instructions": "be brief",
                "max_output_tokens": 32,
                "temperature": 0.5,
                "top_p": None,
            },
            {
                "model": "m",
                "messages": [{"role": "system", "content": "be brief"}, USER_HI],
                "max_tokens": 32,
                "temperature": 0.5,
            },
            id="a string input; instructions -> system; max_output_tokens -> max_tokens",
        ),
        pytest.param(
            {
                "model": "m",
                "input": [
                    {"role": "developer", "content": "rules"},
                    {
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "what is "},
                            {"type": "input_text", "text": "this?"},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "see"},
                            {"type": "input_image", "image_url": "https://x/y.png"},
                        ],
                    },
                ],
            },
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "rules"},
                    {"role": "user", "content": "what is this?"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                        ],
                    },
                ],
            },
            id="developer -> system; text parts joined; an image keeps the parts",
        ),
        pytest.param(
            {
                "model": "m",
                "input": [
                    USER_HI,
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "one"},
                    {"type": "function_call_output", "call_id": "c2", "output": {"n": 2}},
                ],
                "tools": [{"type": "function", "name": "f", "parameters": WEATHER_TOOL_SCHEMA}],
                "tool_choice": {"type": "function", "name": "f"},
            },
            {
                "model": "m",
                "messages": [
                    USER_HI,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            },
                            {
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "g", "arguments": "{}"},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "one"},
                    {"role": "tool", "tool_call_id": "c2", "content": '{"n": 2}'},
                ],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "description": "",
                            "parameters": WEATHER_TOOL_SCHEMA,
                        },
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            id="calls in a row are one assistant message; outputs are tool messages",
        ),
        pytest.param(
            {
                "model": "m",
                "input": "hi",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {}, "strict": True}
                },
                "stream": True,
            },
            {
                "model": "m",
                "messages": [USER_HI],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {}, "strict": True},
                },
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            id="a JSON schema -> response_format; a stream asks for usage",
        ),
        pytest.param(
            {
                "model": "m",
                "input": "hi",
                "text": {"format": {"type": "json_object"}},
                "tool_choice": "auto",
            },
            {"model": "m", "messages": [USER_HI], "response_format": {"type": "json_object"}},
            id="json_object; a tool_choice without tools is dropped",
        ),
    ],
)
def test_a_responses_request_becomes_this_chat_request(
    responses_request: dict[str, Any], chat_request: dict[str, Any]
) -> None:
    assert responses_to_chat(responses_request) == chat_request


@pytest.mark.parametrize(
    ("responses_request", "code", "message"),
    [
        (
            {"input": "hi", "previous_response_id": "resp_1"},
            "not_translatable",
            "previous_response_id",
        ),
        ({"input": "hi", "background": True}, "not_translatable", "background"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "not_translatable", "tools\\[0\\]"),
        ({"input": [{"type": "reasoning"}]}, "not_translatable", "input\\[0\\].type='reasoning'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "not_translatable",
            "input\\[0\\].content\\[0\\]",
        ),
        ({"input": 3}, "bad_request", "'input' must be a string or a list"),
        ({"input": ["hi"]}, "bad_request", "input\\[0\\] must be an object"),
    ],
)
def test_a_responses_request_chat_cannot_carry_is_refused_naming_the_field(
    responses_request: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(RouterError, match=message) as raised:
        responses_to_chat(responses_request)
    assert raised.value.code == code


def _stable(response: dict[str, Any]) -> dict[str, Any]:
    """``response`` with its clock and random ids replaced by their kind."""
    out = {**response, "created_at": 0}
    out["output"] = [{**item, "id": item["id"].split("_")[0]} for item in response["output"]]
    return out


def _response(
    output: list[dict[str, Any]], usage: tuple[int, int], **changes: Any
) -> dict[str, Any]:
    given, made = usage
    base: dict[str, Any] = {
        "id": "resp_chatcmpl-1",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "incomplete_details": None,
        "error": None,
        "model": "gemma",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "instructions": None,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": given,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": made,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": given + made,
        },
    }
    return {**base, **changes}


HELLO_ITEM = {
    "type": "message",
    "id": "msg",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "hello", "annotations": []}],
}


@pytest.mark.parametrize(
    ("chat", "answer"),
    [
        pytest.param(
            chat_answer({"role": "assistant", "content": "hello"}),
            _response([HELLO_ITEM], (5, 2)),
            id="text -> a message item",
        ),
        pytest.param(
            chat_answer(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a":1}'}}],
                },
                "tool_calls",
            ),
            _response(
                [
                    {
                        "type": "function_call",
                        "id": "fc",
                        "call_id": "c1",
                        "name": "f",
                        "arguments": '{"a":1}',
                        "status": "completed",
                    }
                ],
                (5, 2),
            ),
            id="a tool call -> a function_call item",
        ),
        pytest.param(
            chat_answer({"role": "assistant", "content": "hello"}, "length", given=3, made=8),
            _response(
                [HELLO_ITEM],
                (3, 8),
                status="incomplete",
                incomplete_details={"reason": "max_output_tokens"},
            ),
            id="length -> incomplete, max_output_tokens",
        ),
    ],
)
def test_a_chat_completion_becomes_this_response(
    chat: dict[str, Any], answer: dict[str, Any]
) -> None:
    assert _stable(chat_to_response(chat)) == answer


# --------------------------------------------------------------------------- envelopes


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (418, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (507, "api_error"),
    ],
)
def test_a_status_is_this_anthropic_error_type(status: int, error_type: str) -> None:
    assert anthropic_error_type(status) == error_type
    assert json.loads(anthropic_error_body(status, "why")) == {
        "type": "error",
        "error": {"type": error_type, "message": "why"},
    }


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b'{"error": {"message": "context too long", "code": 400}}', "context too long"),
        (b'{"error": "model not found"}', "model not found"),
        (b'{"detail": "other"}', '{"detail": "other"}'),
        (b"plain words", "plain words"),
        (b"x" * 600, "x" * 500),
    ],
)
def test_a_backends_error_body_gives_this_text(raw: bytes, text: str) -> None:
    assert backend_error_text(raw) == text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
        ),
        (
            "/v1/messages/count_tokens",
            {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
        ),
        (
            "/v1/responses",
            {
                "error": {
                    "message": "busy",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        (
            "/v1/chat/completions",
            {
                "error": {
                    "message": "busy",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
    ],
)
def test_each_path_relays_a_backends_error_in_its_clients_shape(
    path: str, body: dict[str, Any]
) -> None:
    envelope = envelope_for(path)
    assert envelope is (ANTHROPIC_ENVELOPE if path.startswith("/v1/messages") else OPENAI_ENVELOPE)
    assert json.loads(envelope.status_body(503, "busy")) == body


def test_a_cut_anthropic_stream_ends_with_an_error_event() -> None:
    event = ANTHROPIC_ENVELOPE.sse_event(RouterError("queue_full", "the queue is full"))
    assert event["more_body"] is False
    name, data = bytes(event["body"]).decode().split("\n", 1)
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "the queue is full"},
    }
