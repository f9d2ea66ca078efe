"""The example lab through the clients a lab points at it: the ``anthropic`` SDK on
``/v1/messages`` (plain, streamed, ``count_tokens``, a wrong ``x-api-key``), the openai
SDK's ``responses.create`` (plain, streamed) and chat (unchanged), on real llama-server
roles (SmolLM2-135M-Instruct with its own chat template, ``rosterd up`` as a
subprocess): each answer to "What is the capital of France?" names Paris. And the
start-time warning for a llama.cpp role whose GGUF has no chat template.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anthropic
import httpx
import pytest
from openai import OpenAI

from support.up import (
    EXAMPLE_LAB,
    MODELS,
    StartUp,
    llama_entry,
    prepare_example_models,
    wait_resident,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

KEY = "lab-key"
#: Chat template markers that must not show in an answer (ChatML's and Gemma's).
MARKERS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")


def test_example_answers_anthropic_and_responses_clients(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    up = rosterd_up([*EXAMPLE_LAB, "--api-key", KEY])
    try:
        wait_resident_keyed(up.url, {"chat-small"})
        assert "has no tokenizer.chat_template" not in up.output()  # the example sets them

        # Clients closed by their own ``with``: a failure must not leave sockets for a
        # later test's unraisable-exception check to trip over.
        with (
            OpenAI(base_url=up.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as chat,
            anthropic.Anthropic(base_url=up.url, api_key=KEY, max_retries=0, timeout=120) as claude,
            anthropic.Anthropic(base_url=up.url, api_key="not-it", max_retries=0) as wrong,
        ):
            reply = chat.chat.completions.create(
                model="chat-small",
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=32,
                temperature=0.0,
            )
            text = reply.choices[0].message.content or ""
            assert "Paris" in text, text
            assert not [m for m in MARKERS if m in text], text

            message = claude.messages.create(
                model="chat-small",
                max_tokens=24,
                system="Answer in one short sentence.",
                messages=[{"role": "user", "content": "What is the capital of France?"}],
            )
            assert message.type == "message"
            assert message.content[0].type == "text"
            assert "Paris" in message.content[0].text, message.content[0].text
            assert message.stop_reason in ("end_turn", "max_tokens")
            assert message.usage.output_tokens > 0

            with claude.messages.stream(
                model="SmolLM2-135M-Instruct",  # the roster's model name reaches the same role
                max_tokens=24,
                messages=[{"role": "user", "content": "Count to five."}],
            ) as stream:
                kinds = [event.type for event in stream]
                final = stream.get_final_message()
            assert kinds[0] == "message_start"
            assert kinds[-1] == "message_stop"
            assert kinds.count("text") >= 3  # relayed event by event
            assert final.usage.output_tokens > 0

            short = claude.messages.count_tokens(
                model="chat-small", messages=[{"role": "user", "content": "Hi"}]
            )
            longer = claude.messages.count_tokens(
                model="chat-small",
                messages=[
                    {"role": "user", "content": "What is the capital of France, and why? " * 4}
                ],
            )
            assert 0 < short.input_tokens < longer.input_tokens  # llama-server's own count

            with pytest.raises(anthropic.AuthenticationError) as refused:
                wrong.messages.create(
                    model="chat-small", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
                )
            assert refused.value.body == {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid API key"},
            }

            response = chat.responses.create(
                model="chat-small", input="What is the capital of France?", max_output_tokens=24
            )
            assert "Paris" in response.output_text, response.output_text
            events = chat.responses.create(
                model="chat-small", input="Count to five.", max_output_tokens=24, stream=True
            )
            names = [event.type for event in events]
            assert names[0] == "response.created"
            assert names.count("response.output_text.delta") >= 3
            assert names[-1] in ("response.completed", "response.incomplete")
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()


def wait_resident_keyed(url: str, roles: set[str], timeout_s: float = 90.0) -> None:
    """:func:`wait_resident` for a run behind ``--api-key``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(url + "/status", headers={"authorization": f"Bearer {KEY}"}).json()
        resident = {
            role
            for node in status["nodes"].values()
            for role, info in node["roles"].items()
            if info["phase"] == "ready"
        }
        if roles <= resident:
            return
        time.sleep(0.2)
    raise AssertionError(f"{roles} not resident within {timeout_s} s")


def test_up_warns_once_for_a_gguf_without_chat_template(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("plain", "tiny-a", 0.1, 8391)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"tiny-a": {"path": str(MODELS / "tiny-a.gguf")}}
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet)])
    try:
        wait_resident(up, {"plain"})
        output = up.output()
        line = f"role plain: {MODELS / 'tiny-a.gguf'} has no tokenizer.chat_template"
        assert output.count(line) == 1, output
        assert "--chat-template" in output
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()
