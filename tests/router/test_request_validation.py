"""The checks of a request before it reaches a backend (``rosterd.router.validation``): what
each dialect's own API refuses is a 400 naming the field, and what it takes passes."""

from __future__ import annotations

from typing import Any

import pytest

from rosterd.errors import RouterError
from rosterd.router.validation import check_request, context_overflow_fix

USER = {"role": "user", "content": "hi"}
CTX = 8192

#: (path, body, the field path the 400's message starts with).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    # OpenAI chat completions
    ("/v1/chat/completions", {"messages": []}, "messages: the list is empty"),
    ("/v1/chat/completions", {}, "messages: required"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages: required"),
    ("/v1/chat/completions", {"messages": {"role": "user"}}, "messages: required"),
    ("/v1/chat/completions", {"messages": ["hi"]}, "messages[0]: expected an object"),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content: required"),
    (
        "/v1/chat/completions",
        {"messages": [USER, {"role": "user", "content": None}]},
        "messages[1].content: required",
    ),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    (
        "/v1/chat/completions",
        {"messages": [USER, {"role": "assistant", "content": None}]},
        "messages[1].content: required",
    ),
    (
        "/v1/chat/completions",
        {"messages": [USER, {"role": "tool", "content": "42"}]},
        "messages[1].tool_call_id",
    ),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": 0}, "max_tokens: expected"),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": -1}, "max_tokens: expected"),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": "9"}, "max_tokens: expected"),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": 1.5}, "max_tokens: expected"),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": True}, "max_tokens: expected"),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": CTX + 1}, "max_tokens: 8193"),
    (
        "/v1/chat/completions",
        {"messages": [USER], "max_completion_tokens": 0},
        "max_completion_tokens: expected",
    ),
    ("/v1/chat/completions", {"messages": [USER], "stream": "yes"}, "stream: expected"),
    # OpenAI completions: 0 is OpenAI's minimum there
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens: expected"),
    ("/v1/completions", {"prompt": "x", "max_tokens": CTX + 1}, "max_tokens: 8193"),
    # Anthropic Messages
    ("/v1/messages", {"messages": [], "max_tokens": 8}, "messages: the list is empty"),
    ("/v1/messages", {"messages": [USER]}, "max_tokens: required"),
    ("/v1/messages", {"messages": [USER], "max_tokens": -1}, "max_tokens: expected"),
    ("/v1/messages", {"messages": [USER], "max_tokens": CTX + 1}, "max_tokens: 8193"),
    (
        "/v1/messages",
        {"messages": [{"role": "system", "content": "x"}], "max_tokens": 8},
        "messages[0].role: expected user or assistant",
    ),
    ("/v1/messages", {"messages": [{"role": "user"}], "max_tokens": 8}, "messages[0].content"),
    ("/v1/messages", {"messages": [USER], "max_tokens": 8, "system": 3}, "system: expected"),
    ("/v1/messages/count_tokens", {"messages": []}, "messages: the list is empty"),
    # OpenAI Responses
    ("/v1/responses", {"input": 3}, "input: expected"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens: expected"),
    # Ollama
    ("/api/chat", {"messages": "hi"}, "messages: expected a list"),
    ("/api/chat", {"messages": [{"content": "hi"}]}, "messages[0]: expected an object"),
    ("/api/chat", {"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content"),
    ("/api/chat", {"messages": [USER], "options": []}, "options: expected an object"),
    ("/api/chat", {"messages": [USER], "options": {"num_predict": "5"}}, "options.num_predict"),
    ("/api/generate", {"prompt": ["x"]}, "prompt: expected a string"),
    ("/api/generate", {"prompt": "x", "options": {"num_predict": CTX + 1}}, "options.num_predict"),
]

#: Odd but valid requests every dialect takes: they must pass untouched.
TAKEN: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": [USER]}),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": None, "stream": None}),
    ("/v1/chat/completions", {"messages": [USER], "max_tokens": 1, "max_completion_tokens": CTX}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "developer", "content": "be brief"},
                USER,
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
                {"role": "assistant", "content": ""},
            ]
        },
    ),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
    ("/v1/completions", {}),
    ("/v1/messages", {"messages": [USER], "max_tokens": 0}),
    (
        "/v1/messages",
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "system": [{"type": "text", "text": "be brief"}],
            "max_tokens": 16,
            "stream": True,
        },
    ),
    ("/v1/messages/count_tokens", {"messages": [USER]}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/responses", {"input": [USER], "max_output_tokens": 16}),
    ("/v1/responses", {"previous_response_id": "r1"}),
    ("/api/chat", {}),  # Ollama loads the model
    ("/api/chat", {"messages": [{"role": "user"}]}),
    ("/api/chat", {"messages": [USER], "options": {"num_predict": -1}}),
    ("/api/chat", {"messages": [USER], "options": {"num_predict": -2}}),
    ("/api/generate", {"prompt": "x", "options": {"num_predict": 0, "temperature": 0}}),
    ("/v1/embeddings", {"input": []}),  # no rules there
]


@pytest.mark.parametrize(("path", "body", "start"), REFUSED)
def test_what_the_dialect_refuses_is_a_400_naming_the_field(
    path: str, body: dict[str, Any], start: str
) -> None:
    with pytest.raises(RouterError) as caught:
        check_request(path, {"model": "chat-small", **body}, ctx_size=CTX)
    assert caught.value.code == "bad_request"
    assert caught.value.status == 400
    assert caught.value.message.startswith(start), caught.value.message


@pytest.mark.parametrize(("path", "body"), TAKEN)
def test_what_the_dialect_takes_passes(path: str, body: dict[str, Any]) -> None:
    check_request(path, {"model": "chat-small", **body}, ctx_size=CTX)


def test_a_limit_over_the_context_names_the_setting_to_raise() -> None:
    with pytest.raises(RouterError) as caught:
        check_request(
            "/v1/chat/completions", {"messages": [USER], "max_tokens": 9000}, ctx_size=CTX
        )
    assert "context size of 8192 tokens" in caught.value.message
    assert "ctx_size" in caught.value.message
    assert "fleet file" in caught.value.message


def test_an_unknown_context_sets_no_upper_bound() -> None:
    check_request("/v1/chat/completions", {"messages": [USER], "max_tokens": 10**6}, ctx_size=None)


def test_a_context_overflow_names_the_roles_ctx_size() -> None:
    llama = (
        "request (20307 tokens) exceeds the available context size (8192 tokens), try increasing it"
    )
    fix = context_overflow_fix("chat-small", 8192, llama)
    assert fix is not None
    assert "'chat-small'" in fix
    assert "ctx_size 8192" in fix
    assert "fleet file" in fix
    assert context_overflow_fix("chat-small", 8192, "tools param requires --jinja flag") is None
