"""What a coding agent gets from the example lab, as docs/clients.md says.

``chat-small`` (SmolLM2-135M-Instruct, started with ``--jinja``) takes requests with
``tools`` in each dialect an agent speaks: chat completions (opencode), Anthropic
Messages (Claude Code) and OpenAI Responses (Codex CLI). A first prompt longer than
its 4,096-token context (every agent's is: Claude Code's about 20,000 tokens, Codex
CLI's about 6,400) gets a 400 naming the context at once, in the dialect's own
envelope, never a 5xx that an agent retries.
One ``rosterd up`` of the example (a subprocess, real llama-server backends).
"""

from __future__ import annotations

import signal
from pathlib import Path

import anthropic
import openai
import pytest

from support.up import EXAMPLE_LAB, StartUp, prepare_example_models, wait_resident

pytestmark = pytest.mark.slow

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
ASKED = "What is the weather in Paris?"
#: About 24,000 tokens for SmolLM2's tokenizer: more than its training length, 8,192 tokens.
LONG_SYSTEM = "Read the repository's files before you change them. " * 2400
#: About 6,000 tokens, as long as Codex CLI's first prompt: within SmolLM2's training
#: length, but the example's context is shorter, as a CPU would prefill it for minutes.
CODEX_SIZED = LONG_SYSTEM[: len(LONG_SYSTEM) // 4]


def test_the_example_takes_tools_and_refuses_an_agents_long_prompt_with_a_400(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    up = rosterd_up(EXAMPLE_LAB)
    try:
        wait_resident(up, {"chat-small"}, timeout_s=120)
        with (
            openai.OpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0) as chat,
            anthropic.Anthropic(base_url=up.url, api_key="unused", max_retries=0) as claude,
        ):
            tool = {
                "type": "function",
                "function": {"name": "get_weather", "parameters": PARAMETERS},
            }
            reply = chat.chat.completions.create(
                model="chat-small",
                messages=[{"role": "user", "content": ASKED}],
                tools=[tool],  # type: ignore[list-item]
                max_tokens=48,
            )
            assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")

            message = claude.messages.create(
                model="chat-small",
                max_tokens=48,
                tools=[{"name": "get_weather", "input_schema": PARAMETERS}],  # type: ignore[typeddict-item]
                messages=[{"role": "user", "content": ASKED}],
            )
            assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")

            response = chat.responses.create(
                model="chat-small",
                input=ASKED,
                tools=[{"type": "function", "name": "get_weather", "parameters": PARAMETERS}],  # type: ignore[list-item]
                max_output_tokens=48,
            )
            assert response.status in ("completed", "incomplete")

            with pytest.raises(anthropic.BadRequestError) as refused:
                claude.messages.create(
                    model="chat-small",
                    max_tokens=48,
                    system=LONG_SYSTEM,
                    tools=[{"name": "get_weather", "input_schema": PARAMETERS}],  # type: ignore[typeddict-item]
                    messages=[{"role": "user", "content": "Hi"}],
                )
            assert refused.value.status_code == 400
            assert "context" in str(refused.value.message), refused.value.body
            # ... and names the role's ctx_size and where to raise it.
            assert "ctx_size 4096" in str(refused.value.message), refused.value.body
            assert "fleet file" in str(refused.value.message), refused.value.body

            with pytest.raises(openai.BadRequestError) as too_long:
                chat.chat.completions.create(
                    model="chat-small",
                    messages=[
                        {"role": "system", "content": LONG_SYSTEM},
                        {"role": "user", "content": "Hi"},
                    ],
                    tools=[tool],  # type: ignore[list-item]
                    max_tokens=48,
                )
            assert "context" in str(too_long.value.message), too_long.value.body
            assert "ctx_size 4096" in str(too_long.value.message), too_long.value.body

            with pytest.raises(openai.BadRequestError) as codex_sized:
                chat.responses.create(
                    model="chat-small",
                    instructions=CODEX_SIZED,
                    input="Hi",
                    max_output_tokens=48,
                )
            assert "(4096 tokens)" in str(codex_sized.value.message), codex_sized.value.body

            # Claude Code's first prompt is mostly its tools' definitions: the example's
            # template renders them, so they count against the context and are refused
            # (a template without them let such a request through, its tools dropped).
            many_tools = [
                {"name": f"tool_{i}", "description": LONG_SYSTEM[:4000], "input_schema": PARAMETERS}
                for i in range(24)
            ]
            with pytest.raises(anthropic.BadRequestError) as tools_too_long:
                claude.messages.create(
                    model="chat-small",
                    max_tokens=48,
                    tools=many_tools,  # type: ignore[arg-type]
                    messages=[{"role": "user", "content": "Hi"}],
                )
            assert "context" in str(tools_too_long.value.message), tools_too_long.value.body
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()
