"""A role's configuration fault is a 400 naming the fix, never a retriable 5xx.

A real llama-server role started with ``--no-jinja`` answers a request with ``tools``
500 "tools param requires --jinja flag". Through ``rosterd up`` the official openai
and anthropic SDKs, with their default retries on, get one 400 ``not_supported`` that
names the role and the flag to add, and send the request once (a 5xx would be sent
three times). The message table is checked on its own too.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rosterd.router.config_faults import config_fault
from rosterd.router.openai_errors import upstream_status_error
from support.up import (
    MODELS,
    Up,
    llama_entry,
    start_up,
    wait_resident,
    write_box_fleet,
    write_roster,
)

JINJA_500 = (
    '{"error":{"code":500,"message":"tools param requires --jinja flag","type":"server_error"}}'
)
TOOL: dict[str, object] = {"type": "object", "properties": {"city": {"type": "string"}}}


def requests_of(up: Up, role: str) -> float:
    """The requests ``role`` answered, as ``/metrics`` counts them (every status)."""
    text = httpx.get(up.url + "/metrics", timeout=30, trust_env=False).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "rosterd_requests_total" and sample.labels.get("role") == role
    )


def test_a_flag_the_backend_requires_is_named_with_where_to_add_it() -> None:
    err = upstream_status_error("chat", 500, JINJA_500, endpoint="chat")
    assert (err.status, err.code) == (400, "not_supported")
    assert "role 'chat' was started without --jinja; add --jinja to extra_args" in str(err)
    assert "remove --no-jinja" in str(err)
    assert "tools param requires --jinja flag" in str(err)  # the backend's own words
    fix = config_fault("chat", "tool_choice param requires --jinja flag")
    assert fix is not None
    assert "--jinja" in fix
    # A backend's failure that no configuration causes stays a retriable 502.
    assert upstream_status_error("chat", 500, "out of memory").status == 502


@pytest.mark.slow
def test_sdks_get_one_400_naming_the_fix_for_tools_without_jinja(
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
    up = start_up([str(roster), "--fleet", str(fleet)], tmp_path, free_port)
    try:
        wait_resident(up, {"chat"})
        # The SDKs' default retries stay on (2): a 5xx would reach rosterd three times.
        with (
            openai.OpenAI(base_url=up.url + "/v1", api_key="k") as chat,
            anthropic.Anthropic(base_url=up.url, api_key="k") as claude,
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                chat.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=[{"type": "function", "function": {"name": "w", "parameters": TOOL}}],
                    max_tokens=8,
                )
            assert requests_of(up, "chat") == 1
            body = refused.value.body
            assert isinstance(body, dict)
            assert body["code"] == "not_supported"
            assert "role 'chat' was started without --jinja; add --jinja" in body["message"]

            with pytest.raises(anthropic.BadRequestError) as claude_refused:
                claude.messages.create(
                    model="chat",
                    max_tokens=8,
                    messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=[{"name": "w", "input_schema": TOOL}],
                )
            assert requests_of(up, "chat") == 2
            error = claude_refused.value.body
            assert isinstance(error, dict)
            assert error["type"] == "error"
            assert error["error"]["type"] == "invalid_request_error"
            assert "add --jinja to extra_args" in error["error"]["message"]

        ollama = httpx.post(
            up.url + "/api/chat",
            json={
                "model": "chat",
                "stream": False,
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [{"type": "function", "function": {"name": "w", "parameters": TOOL}}],
            },
            timeout=60,
            trust_env=False,
        )
        assert ollama.status_code == 400, ollama.text
        assert "add --jinja to extra_args" in ollama.json()["error"]
        assert requests_of(up, "chat") == 3
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()
