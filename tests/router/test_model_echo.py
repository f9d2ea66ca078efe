"""The answer's ``model`` is the name the client asked for, as OpenAI answers.

On its own: :class:`ModelEcho` rewrites a plain answer (its ``Content-Length`` set
anew) and an event stream whose field is split across two chunks, and leaves text
that only quotes the name alone. End to end: a real llama-server role served as
``tiny`` and asked for as ``chat`` answers ``model: chat`` to the openai SDK (chat,
plain and streamed; responses) and the anthropic SDK (messages, plain and streamed),
and each answer leaves one JSON access-log line naming the role and node.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import anthropic
import openai
import pytest
from starlette.types import Message

from rosterd.router.model_echo import ModelEcho
from support.up import (
    MODELS,
    llama_entry,
    start_up,
    wait_resident,
    write_box_fleet,
    write_roster,
)

#: Streamed Messages answers asked for end to end (each may lose its opening upstream).
STREAMS = 8
#: A GBNF grammar whose answer begins with a character of three byte tokens.
GRAMMAR = 'root ::= "\u4f60\u597d"'


async def echoed(messages: list[Message], path: str = "/v1/chat/completions") -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    echo = ModelEcho.wrap(send, path, {"model": "chat"}, "tiny")
    for message in messages:
        await echo(message)
    return sent


async def test_a_plain_answer_gets_the_asked_name_and_its_new_length() -> None:
    body = b'{"model":"tiny","text":"the \\"model\\":\\"tiny\\" field"}'
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}
    sent = await echoed([start, {"type": "http.response.body", "body": body}])
    whole = sent[1]["body"]
    assert json.loads(whole) == {"model": "chat", "text": 'the "model":"tiny" field'}
    assert sent[0]["headers"] == [(b"content-length", str(len(whole)).encode())]


async def test_a_stream_split_inside_the_field_is_rewritten_whole() -> None:
    start = {"type": "http.response.start", "status": 200, "headers": []}
    parts = [b'data: {"model":"ti', b'ny","n":1}\n\ndata: {"model": "tiny"}\n\n', b"data: [DONE]"]
    bodies = [{"type": "http.response.body", "body": p, "more_body": True} for p in parts]
    end = {"type": "http.response.body", "body": b"\n\n", "more_body": False}
    sent = await echoed([start, *bodies, end])
    text = b"".join(m.get("body", b"") for m in sent[1:])
    assert text == b'data: {"model":"chat","n":1}\n\ndata: {"model": "chat"}\n\ndata: [DONE]\n\n'
    assert sent[-1]["more_body"] is False


async def test_ollama_paths_and_the_served_name_itself_are_left_alone() -> None:
    async def send(message: Message) -> None:
        raise AssertionError(message)

    assert ModelEcho.wrap(send, "/api/chat", {"model": "chat"}, "tiny") is send
    assert ModelEcho.wrap(send, "/v1/chat/completions", {"model": "tiny"}, "tiny") is send


@pytest.mark.slow
def test_every_dialect_answers_the_name_asked_for(
    tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path, free_port: int
) -> None:
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny": {"path": str(tiny_gguf), "ctx_size": 256, "extra_args": ["--no-jinja"]}},
        flavors=["llamacpp"],
        address="127.0.0.1",
    )
    # The tiny model's own folder is the model root (the helper names the example's).
    fleet.write_text(
        fleet.read_text().replace(json.dumps(str(MODELS)), json.dumps(str(tiny_gguf.parent)))
    )
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chat", "tiny", 0.1, 18090)])
    up = start_up(
        [str(roster), "--fleet", str(fleet), "--access-log-format", "json"], tmp_path, free_port
    )
    hi = "Hi"
    try:
        wait_resident(up, {"chat"})
        with (
            openai.OpenAI(base_url=up.url + "/v1", api_key="k", max_retries=0) as client,
            anthropic.Anthropic(base_url=up.url, api_key="k", max_retries=0) as claude,
        ):
            reply = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": hi}], max_tokens=4
            )
            assert reply.model == "chat"
            chunks = list(
                client.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": hi}],
                    max_tokens=4,
                    stream=True,
                )
            )
            assert chunks
            assert {c.model for c in chunks} == {"chat"}
            response = client.responses.create(model="chat", input=hi, max_output_tokens=4)
            assert response.model == "chat"

            message = claude.messages.create(
                model="chat", max_tokens=4, messages=[{"role": "user", "content": hi}]
            )
            assert message.model == "chat"
            # llama-server drops a stream's message_start when its first token ends inside
            # a UTF-8 character (this model answers in random bytes: about one in five);
            # rosterd puts it back (router/stream_repair.py), so every stream has one.
            for _ in range(STREAMS):
                with claude.messages.stream(
                    model="chat", max_tokens=4, messages=[{"role": "user", "content": hi}]
                ) as stream:
                    starts = [e.message for e in stream if e.type == "message_start"]
                    final = stream.get_final_message()
                assert [m.model for m in starts] == ["chat"]
                assert final.model == "chat"
                # A rebuilt message_start says the prompt as llama-server's count_tokens does.
                assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0
            # A Responses stream whose answer begins with a character of several byte
            # tokens: llama-server repeats its opening mid-way; the SDK reads one answer.
            with client.responses.stream(
                model="chat", input=hi, max_output_tokens=8, extra_body={"grammar": GRAMMAR}
            ) as events:
                created = [e for e in events if e.type == "response.created"]
                whole = events.get_final_response()
            assert len(created) == 1
            assert whole.output_text == "\u4f60\u597d"
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()
    # One access-log line per answer, in JSON, with who served it.
    text = (tmp_path / "state" / "logs" / "access.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [x["dialect"] for x in lines] == [
        "openai",
        "openai",
        "responses",
        "anthropic",
        *["anthropic"] * STREAMS,
        "responses",
    ]
    for line in lines:
        assert (line["model"], line["role"], line["node"], line["status"]) == (
            "chat",
            "chat",
            "box",
            200,
        )
        assert line["first_byte_s"] is not None
        assert line["duration_s"] >= line["first_byte_s"]
    assert lines[0]["tokens_out"] == 4
    assert lines[0]["tokens_in"] > 0
    # Every Messages stream counts its prompt, a rebuilt message_start's too.
    assert all(x["tokens_in"] > 0 for x in lines if x["dialect"] == "anthropic"), lines
