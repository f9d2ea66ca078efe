"""Load progress to whoever waits: a streamed request that waits for its role's load gets
bytes at once and a progress line every few seconds, through ``rosterd up`` on real
processes and real HTTP, read by the official openai and anthropic clients.

The stand-in backend (``tests/support/fake_backend.py``) stands in for a slow load, which
the example's small models cannot show (they load in a second): its ``/health`` says 503
for ``--load-s`` seconds, as llama-server's does while it loads; in mode ``crash`` its
load fails after that time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from support.backends import pick_free_port
from support.up import Up, llama_entry, stand_in, start_up, write_roster

pytestmark = pytest.mark.slow

LOAD_S = 4.0


def _start(tmp: Path, *flags: str) -> Up:
    fleet, env = stand_in(
        tmp,
        {
            "slow": ["--load-s", str(LOAD_S)],
            "broken": ["--mode", "crash", "--load-s", "1"],
            "quiet": ["--load-s", "2"],
        },
    )
    written = json.loads(fleet.read_text())
    written["models"]["quiet"]["load_progress"] = "off"  # the role's own word wins
    fleet.write_text(json.dumps(written))
    entries = [
        llama_entry("slow", "slow", 0.1, 18801),
        llama_entry("broken", "broken", 0.1, 18802),
        llama_entry("quiet", "quiet", 0.1, 18803),
    ]
    roster = write_roster(tmp / "roster.yaml", entries)
    argv = [str(roster), "--fleet", str(fleet), "--no-warm-up", "--max-wait", "60", *flags]
    return start_up(argv, tmp, pick_free_port(), env=env)


def _unload(up: Up, role: str) -> None:
    reply = httpx.post(f"{up.url}/rosterd/unload/{role}", timeout=30, trust_env=False)
    assert reply.status_code == 200, reply.text


def _stream_lines(
    up: Up, path: str, body: dict[str, object]
) -> tuple[float, list[tuple[float, str]]]:
    """Stream ``body`` to ``path``: the seconds to the first byte, and every line read with
    the seconds when it came."""
    began = time.monotonic()
    first_byte_s = -1.0
    lines: list[tuple[float, str]] = []
    with httpx.stream("POST", up.url + path, json=body, timeout=60, trust_env=False) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if first_byte_s < 0:
                first_byte_s = time.monotonic() - began
            if line:
                lines.append((time.monotonic() - began, line))
    return first_byte_s, lines


def test_a_stream_that_waits_for_a_load_gets_its_first_byte_at_once_and_progress_lines(
    tmp_path: Path,
) -> None:
    up = _start(tmp_path)
    try:
        body = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        first_byte_s, lines = _stream_lines(up, "/v1/chat/completions", body)
        print(f"first byte after {first_byte_s:.2f} s; lines: {lines}")
        assert first_byte_s < 1.0
        progress = [(at, line) for at, line in lines if line.startswith(": loading slow")]
        assert len(progress) >= 2, lines  # at once, then every 3 s through a 4 s load
        assert progress[1][0] - progress[0][0] < 4.0
        assert "of ~" in progress[0][1]  # the expected total, from the weights' size
        assert any(line.startswith("data: {") for _, line in lines)
        assert lines[-1][1] == "data: [DONE]"

        # The official clients read through the comments and pings without error.
        _unload(up, "slow")
        client = openai.OpenAI(base_url=up.url + "/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "x"

        _unload(up, "slow")
        claude = anthropic.Anthropic(base_url=up.url, api_key="none", max_retries=0)
        began = time.monotonic()
        with claude.messages.stream(
            model="slow", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as messages:
            text = "".join(messages.text_stream)
        assert text == "x"
        assert time.monotonic() - began >= LOAD_S - 0.5  # it did wait for the load
    finally:
        up.stop()


def test_a_load_that_fails_after_the_head_went_ends_the_stream_with_the_dialects_error(
    tmp_path: Path,
) -> None:
    up = _start(tmp_path)
    try:
        body = {"model": "broken", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        _first_byte_s, lines = _stream_lines(up, "/v1/chat/completions", body)
        errors = [line for _, line in lines if line.startswith("data: {")]
        assert errors, lines
        assert '"backend_load_failed"' in errors[-1]

        client = openai.OpenAI(base_url=up.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIError, match="broken"):
            for _chunk in client.chat.completions.create(
                model="broken", messages=[{"role": "user", "content": "hi"}], stream=True
            ):
                pass

        claude = anthropic.Anthropic(base_url=up.url, api_key="none", max_retries=0)
        with (
            pytest.raises(anthropic.APIStatusError, match="broken"),
            claude.messages.stream(
                model="broken", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            ) as messages,
        ):
            "".join(messages.text_stream)
    finally:
        up.stop()


def test_with_load_progress_text_the_openai_stream_carries_the_progress_before_the_answer(
    tmp_path: Path,
) -> None:
    up = _start(tmp_path, "--load-progress", "text")
    try:
        client = openai.OpenAI(base_url=up.url + "/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        seen: list[tuple[str, str]] = []
        for chunk in stream:
            delta = chunk.choices[0].delta
            thinking = (delta.model_extra or {}).get("reasoning_content")
            if thinking:
                seen.append(("reasoning", thinking))
            if delta.content:
                seen.append(("content", delta.content))
        print(seen)
        kinds = [kind for kind, _ in seen]
        assert kinds[0] == "reasoning"
        assert kinds[-1] == "content"
        assert kinds.index("content") >= 2  # progress lines, the ready line, then the answer
        assert seen[0][1].startswith("loading slow") or seen[0][1].startswith("waiting to load")
        assert any("is ready after" in text for kind, text in seen if kind == "reasoning")
    finally:
        up.stop()


def test_a_role_whose_fleet_entry_says_off_gets_no_progress_whatever_up_says(
    tmp_path: Path,
) -> None:
    up = _start(tmp_path, "--load-progress", "text")
    try:
        body = {"model": "quiet", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        first_byte_s, lines = _stream_lines(up, "/v1/chat/completions", body)
        assert first_byte_s >= 1.5  # the answer's own first byte, after the 2 s load
        assert all(line.startswith("data: ") for _, line in lines), lines
    finally:
        up.stop()
