"""Usage counts the tokens of every dialect: a request in Anthropic's Messages, OpenAI's
Responses or Ollama's ``/api/chat`` and ``/api/generate``, translated to a real
llama-server role's chat completions (SmolLM2-135M-Instruct), plain and streamed, adds to
``GET /rosterd/usage`` and ``rosterd usage --json`` exactly the tokens its answer
reported, as OpenAI's chat completions does."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from rosterd.up.options import UpOptions
from support.backends import pick_free_port
from support.polling import eventually
from support.up import (
    SMOLLM2,
    example_extra_args,
    llama_entry,
    prepare_example_models,
    rosterd_argv,
    serving,
    write_box_fleet,
    write_roster,
)

KEY = "usage-dialects-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ASK = "Name three colours."
#: (prompt tokens, completion tokens) as an answer reported them.
Reported = tuple[int, int]


def _sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data: {")]


def _chat(r: httpx.Response, stream: bool) -> Reported:
    usage = (
        [e["usage"] for e in _sse_data(r.text) if e.get("usage")][-1]
        if stream
        else (r.json()["usage"])
    )
    return usage["prompt_tokens"], usage["completion_tokens"]


def _anthropic_prompt(usage: dict[str, int]) -> int:
    """The whole prompt: Anthropic's ``input_tokens`` leave out what the cache held."""
    return (
        usage["input_tokens"]
        + usage.get("cache_read_input_tokens", 0)
        + usage.get("cache_creation_input_tokens", 0)
    )


def _messages(r: httpx.Response, stream: bool) -> Reported:
    if not stream:
        usage = r.json()["usage"]
        return _anthropic_prompt(usage), usage["output_tokens"]
    events = _sse_data(r.text)
    started = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    delta = next(e for e in events if e["type"] == "message_delta")["usage"]
    return _anthropic_prompt(started), delta["output_tokens"]


def _responses(r: httpx.Response, stream: bool) -> Reported:
    if stream:
        done = next(e for e in _sse_data(r.text) if e["type"] == "response.completed")
        usage = done["response"]["usage"]
    else:
        usage = r.json()["usage"]
    return usage["input_tokens"], usage["output_tokens"]


def _ollama(r: httpx.Response, stream: bool) -> Reported:
    last = json.loads(r.text.strip().splitlines()[-1]) if stream else r.json()
    assert last["done"], last
    return last["prompt_eval_count"], last["eval_count"]


#: (path, the request's body but for ``stream``, how its answer reports its usage)
CASES: list[tuple[str, dict[str, Any], Callable[[httpx.Response, bool], Reported]]] = [
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": ASK}], "max_tokens": 8},
        _chat,
    ),
    (
        "/v1/messages",
        {"messages": [{"role": "user", "content": ASK}], "max_tokens": 8},
        _messages,
    ),
    ("/v1/responses", {"input": ASK, "max_output_tokens": 8}, _responses),
    (
        "/api/chat",
        {"messages": [{"role": "user", "content": ASK}], "options": {"num_predict": 8}},
        _ollama,
    ),
    ("/api/generate", {"prompt": ASK, "options": {"num_predict": 8}}, _ollama),
]


def _options(tmp_path: Path) -> UpOptions:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("chat", "SmolLM2-135M-Instruct", 0.5, 18441)]
    )
    models: dict[str, dict[str, object]] = {
        "SmolLM2-135M-Instruct": {
            "path": str(SMOLLM2),
            "ctx_size": 1024,
            "extra_args": example_extra_args("SmolLM2-135M-Instruct"),
        }
    }
    return UpOptions(
        roster_path=roster,
        fleet_path=write_box_fleet(tmp_path / "fleet.yaml", models),
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
        api_keys=(KEY,),
    )


async def test_every_dialect_counts_the_tokens_its_answer_reported(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    async with (
        serving(_options(tmp_path)) as up,
        httpx.AsyncClient(base_url=up.url, headers=AUTH, timeout=120, trust_env=False) as http,
    ):

        async def counted() -> tuple[int, int, int]:
            rows = (await http.get("/rosterd/usage?since=1h")).json()["rows"]
            row = next((r for r in rows if r["role"] == "chat"), None)
            if row is None:
                return 0, 0, 0
            assert row["key"] == "--api-key"
            return row["requests"], row["prompt_tokens"], row["completion_tokens"]

        reported = [0, 0]
        for path, body, read_usage in CASES:
            for stream in (False, True):
                before = await counted()
                payload = {**body, "model": "chat", "stream": stream}
                if stream and path == "/v1/chat/completions":  # its usage only when asked
                    payload["stream_options"] = {"include_usage": True}
                r = await http.post(path, json=payload)
                assert r.status_code == 200, (path, stream, r.text)
                prompt, completion = read_usage(r, stream)
                assert prompt > 0, (path, stream, r.text)
                assert completion > 0, (path, stream, r.text)
                # Counted as the request ends, just after its last byte went out.
                after = await eventually(
                    functools.partial(_next_request, counted, before[0]),
                    what=f"{path} stream={stream} counted",
                    timeout_s=10,
                )
                assert after is not None
                assert (after[1] - before[1], after[2] - before[2]) == (prompt, completion), (
                    path,
                    stream,
                )
                reported[0] += prompt
                reported[1] += completion
        done = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "usage", "--json", "--url", up.url, "--api-key", KEY],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(done.stdout)["rows"]
        assert (row["requests"], row["errors"]) == (2 * len(CASES), 0)
        assert [row["prompt_tokens"], row["completion_tokens"]] == reported


async def _next_request(
    counted: Callable[[], Any], requests_before: int
) -> tuple[int, int, int] | None:
    now: tuple[int, int, int] = await counted()
    return now if now[0] > requests_before else None
