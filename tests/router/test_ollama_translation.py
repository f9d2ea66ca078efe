"""The Ollama <-> OpenAI translation itself (pure): what a request becomes, and how an
answer (whole, or an event stream cut anywhere) comes back in Ollama's shapes. The shapes
are those of Ollama's API reference; the end-to-end tests with the ``ollama`` client are
``test_ollama_api.py`` (real llama-server) and ``test_ollama_passthrough.py``."""

from __future__ import annotations

import json

import pytest

from rosterd.errors import RouterError
from rosterd.router.ollama.answers import StreamTranslator, whole_answer
from rosterd.router.ollama.requests import (
    keep_alive_zero,
    loads_only,
    openai_call,
    resolve_ollama_name,
)
from rosterd.router.routing import ModelNames, RoleRoute


@pytest.mark.parametrize(
    ("keep_alive", "zero"),
    [
        (0, True),
        (0.0, True),
        ("0", True),
        ("0s", True),
        ("0m", True),
        ("5m", False),
        (-1, False),
        (None, False),
        (False, False),
        ("10", False),
    ],
)
def test_keep_alive_zero_in_every_form_ollama_takes(keep_alive: object, zero: bool) -> None:
    assert keep_alive_zero({"keep_alive": keep_alive}) is zero


def test_names_take_ollamas_latest_tag() -> None:
    names = ModelNames({"chat": RoleRoute("chat", names=("gemma-3-270m", "llama3.1:8b"))})
    assert resolve_ollama_name(names, "chat:latest") == "chat"
    assert resolve_ollama_name(names, "gemma-3-270m:latest") == "chat"
    assert resolve_ollama_name(names, "llama3.1:8b") == "chat"
    with pytest.raises(RouterError, match="known models: chat") as err:
        resolve_ollama_name(names, "chat:7b")
    assert err.value.status == 404


def test_a_request_naming_only_its_model_loads() -> None:
    assert loads_only("chat", {"model": "m"})
    assert loads_only("chat", {"model": "m", "messages": []})
    assert not loads_only("chat", {"model": "m", "messages": [{"role": "user"}]})
    assert loads_only("generate", {"model": "m", "prompt": ""})
    assert not loads_only("embed", {"model": "m"})


def test_a_chat_with_tools_images_options_and_format_becomes_openais() -> None:
    call = openai_call(
        "chat",
        "chat",
        {
            "model": "chat:latest",
            "messages": [
                {"role": "user", "content": "Weather?", "images": ["iVBORw0KGgo="]},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "w", "arguments": {"city": "Oslo"}}}],
                },
                {"role": "tool", "content": "3 C", "tool_name": "w"},
            ],
            "tools": [{"type": "function", "function": {"name": "w"}}],
            "format": "json",
            "options": {"num_predict": 7, "temperature": 0, "num_ctx": 9999, "top_k": 3},
        },
    )
    assert call.path == "/v1/chat/completions"
    assert call.stream  # Ollama streams unless told not to
    body = call.body
    assert body["model"] == "chat"
    assert body["max_tokens"] == 7
    assert body["top_k"] == 3
    assert "num_ctx" not in body  # the fleet sizes the load
    assert body["response_format"] == {"type": "json_object"}
    assert body["stream_options"] == {"include_usage": True}
    user, assistant, tool = body["messages"]
    assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]


def test_generate_is_a_chat_unless_raw() -> None:
    chat = openai_call("generate", "r", {"prompt": "Hi", "system": "Be brief", "stream": False})
    assert chat.path == "/v1/chat/completions"
    assert chat.body["messages"] == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hi"},
    ]
    raw = openai_call("generate", "r", {"prompt": "<s>Hi", "raw": True})
    assert raw.path == "/v1/completions"
    assert raw.body["prompt"] == "<s>Hi"
    with pytest.raises(RouterError, match="suffix") as err:
        openai_call("generate", "r", {"prompt": "def f(", "suffix": "return"})
    assert err.value.status == 400


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def test_an_event_stream_cut_anywhere_becomes_ndjson_lines() -> None:
    stream = (
        sse(
            {"choices": [{"delta": {"content": "Hel"}}]},
            {"choices": [{"delta": {"content": "lo"}}]},
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "w"}}]}}]},
            {
                "choices": [
                    {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}
                ]
            },
            {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
        )
        + b"data: [DONE]\n\n"
    )
    translator = StreamTranslator("chat", "chat:latest")
    out = b"".join(
        translator.feed(stream[i : i + 7], now_s=0.0, total_ns=42) for i in range(0, len(stream), 7)
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["message"]["content"] for line in lines[:2]] == ["Hel", "lo"]
    assert lines[2]["message"]["tool_calls"] == [{"function": {"name": "w", "arguments": {}}}]
    last = lines[-1]
    assert last["done"] is True
    assert last["done_reason"] == "stop"
    assert (last["prompt_eval_count"], last["eval_count"], last["total_duration"]) == (5, 2, 42)
    assert last["created_at"] == "1970-01-01T00:00:00.000000Z"
    assert all(line["model"] == "chat:latest" for line in lines)


def test_a_cut_stream_ends_with_ollamas_error_line() -> None:
    translator = StreamTranslator("generate", "m")
    out = translator.feed(
        sse({"choices": [{"text": "a"}]}, {"error": {"message": "evicted", "code": "evicted"}}),
        now_s=0.0,
        total_ns=1,
    )
    first, last = (json.loads(line) for line in out.splitlines())
    assert first["response"] == "a"
    assert last == {"error": "evicted"}


def test_whole_answers_in_ollamas_shapes() -> None:
    chat = {
        "choices": [{"message": {"content": "Paris"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        "timings": {"prompt_ms": 1.5, "predicted_ms": 2.0},
    }
    answer = whole_answer("chat", chat, model="c", now_s=0.0, total_ns=9)
    assert answer["message"] == {"role": "assistant", "content": "Paris"}
    assert answer["done_reason"] == "length"
    assert answer["prompt_eval_duration"] == 1_500_000
    embeddings = {"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}]}
    assert whole_answer("embed", embeddings, model="e", now_s=0, total_ns=1)["embeddings"] == [
        [1.0],
        [2.0],
    ]
    assert whole_answer("embeddings", embeddings, model="e", now_s=0, total_ns=1) == {
        "embedding": [1.0]
    }


def test_a_misspelt_model_gets_the_closest_served_name() -> None:
    names = ModelNames({"chat-small": RoleRoute("chat-small", names=("gemma-3-270m",))})
    with pytest.raises(RouterError, match=r"\(did you mean 'chat-small'\?\); known") as err:
        names.resolve("chat-smal")
    assert err.value.status == 404
    with pytest.raises(RouterError) as far:
        names.resolve("whisper")
    assert "did you mean" not in str(far.value)
    # the known models are role ids; the roster's names answer too, and it says where
    assert "known models: chat-small (other names: GET /v1/models)" in str(far.value)
