"""The main job end to end: ``rosterd up`` on the example lab, used through the ``openai`` client.

Starts ``rosterd up examples/roster.yaml --overlay examples/overlay.yaml
--fleet examples/fleet.yaml`` as a subprocess (after ``scripts/prepare-example``,
as the README's first line does), lists the models, asks SmolLM2-135M-Instruct
(llama.cpp) the capital of France and checks the answer names Paris, streams an
answer by alias, uses ``rosterd ps/load/unload``, then sends SIGINT and checks that the
process exits cleanly and leaves no backend behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from support.up import (
    EXAMPLE_LAB,
    StartUp,
    all_gone,
    prepare_example_models,
    rosterd_argv,
    wait_resident,
)

pytestmark = pytest.mark.slow

# --min-busy-residency 1: the scratch swap below need not wait the default 10 s
EXAMPLE_ARGS = [*EXAMPLE_LAB, "--min-busy-residency", "1"]


def rosterd(*args: str) -> str:
    done = subprocess.run(
        [*rosterd_argv(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_up_on_the_example_serves_real_completions_and_stops_clean(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    up = rosterd_up(EXAMPLE_ARGS)
    client = OpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        ids = {m.id for m in client.models.list()}
        assert {"chat-small", "voice-lite", "scratch-a", "scratch-b"} <= ids
        wait_resident(up, {"voice-lite", "chat-small"})  # interactive + sticky fit: warmed up

        reply = client.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0.0,
        )
        text = reply.choices[0].message.content or ""
        assert "Paris" in text, text  # an instruction-tuned model answers the question
        assert reply.model == "chat-small"  # the name asked for, as OpenAI answers

        pieces: list[str] = []
        stream = client.chat.completions.create(
            model="chat-small-alias",  # the roster's alias entry routes to chat-small
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=24,
            temperature=0.0,
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
        assert len(pieces) > 3
        assert sum(ch.isalnum() for ch in "".join(pieces)) >= 5  # "1, 2, 3, 4, 5" counts

        with httpx.stream(
            "POST",
            up.url + "/v1/chat/completions",
            json={
                "model": "voice-lite",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "stream": True,
            },
            timeout=60,
        ) as raw:
            assert raw.headers["content-type"].startswith("text/event-stream")
            assert raw.headers["x-accel-buffering"] == "no"
            assert b"data: [DONE]" in b"".join(raw.iter_raw())

        url = ["--url", up.url]
        assert "scratch-a" in rosterd("load", "scratch-a", *url)
        assert "scratch-b" in rosterd("load", "tiny-b", *url)  # by model name; evicts scratch-a
        ps = rosterd("ps", *url)
        assert "scratch-b" in ps
        assert "ready" in ps
        # chat-small counts the roster's "~0.5" guess: marked in ram_gb and in GiB
        chat_row = next(line for line in ps.splitlines() if "chat-small" in line)
        assert chat_row.count("~0.50") == 2, chat_row
        resident = up.get("/status")["nodes"]["local"]["resident"]
        assert "scratch-b" in resident
        assert "scratch-a" not in resident
        rosterd("unload", "scratch-b", *url)
        assert "scratch-b" not in up.get("/status")["nodes"]["local"]["resident"]
        pids = up.backend_pids()
        assert len(pids) >= 2
    finally:
        client.close()
        code = up.stop()
    assert code == 0, up.output()
    assert all_gone(pids) == set(), up.output()
    assert "~: the roster's guess (unmeasured)" in up.output()  # chat-small's ram_gb "~0.5"
    assert "no backend left running" in up.output()
