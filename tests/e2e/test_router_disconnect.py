"""A client that leaves mid-stream frees the backend for the next request at once.

Real Gemma 3 270M behind ``rosterd up``, with one llama-server slot
(``parallel: 1``) and one request at a time for the role: a long streamed
generation (1500 tokens, EOS ignored, about 15 s here) is dropped after a few
chunks. If the router kept the upstream request open, the slot would stay busy
and the next request would wait for the whole generation; instead the lease is
back and the backend stops generating a few tokens after the client left, and
the next request is answered promptly.

The backend runs with ``--metrics``, so the test reads what it did (is it
generating, how many tokens it made, at what speed) instead of assuming how fast
this machine is: the assertions hold on a loaded machine as on an idle one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from support.up import (
    GEMMA,
    StartUp,
    Up,
    llama_entry,
    prepare_example_models,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

#: Tokens the dropped stream asks for (EOS ignored): about 15 s of generation here.
MAX_TOKENS = 1500
#: Tokens the backend may still make after the client left (a few here: the router
#: notices the drop at its next chunk and closes the upstream); about 1 s of generation
#: on an idle machine here.
AFTER_LEAVING_MAX = 100


def backend_metrics(base_url: str) -> dict[str, float]:
    """llama-server's own Prometheus figures (``llamacpp:NAME`` -> value)."""
    text = httpx.get(base_url + "/metrics", timeout=30, trust_env=False).text
    pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in pairs}


def decoded_now(base_url: str) -> int:
    """Tokens the backend's one slot has generated for its current request (0 when idle)."""
    slot = httpx.get(base_url + "/slots", timeout=30, trust_env=False).json()[0]
    if not slot["is_processing"]:
        return 0
    return int(slot["next_token"][0]["n_decoded"])


def chat_role(up: Up) -> dict[str, object]:
    role: dict[str, object] = up.get("/status")["nodes"]["box"]["roles"]["chat"]
    return role


def test_disconnect_mid_stream_frees_the_backend_at_once(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("chat", "gemma-3-270m", 0.5, 18521)]
    )
    gemma = {"path": str(GEMMA), "ctx_size": 2048, "parallel": 1, "extra_args": ["--metrics"]}
    fleet = write_box_fleet(tmp_path / "fleet.yaml", {"gemma-3-270m": gemma}, flavors=["llamacpp"])
    up = rosterd_up([str(roster), "--fleet", str(fleet), "--max-concurrency", "1"])
    client = OpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        stream = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Tell me a very long story."}],
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        # Chunks 1-5 may wait for the role's load; 5-45 show this machine's speed now.
        arrived: list[float] = []  # when each content chunk arrived (monotonic seconds)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrived.append(time.monotonic())
            if len(arrived) >= 45:
                break
        assert len(arrived) >= 45
        token_s = (arrived[44] - arrived[4]) / 40  # seconds per token, streamed
        backend = chat_role(up)["base_url"]
        assert isinstance(backend, str)
        # Chunk by chunk, not buffered: the backend is still generating the rest.
        generating = backend_metrics(backend)["llamacpp:requests_processing"]
        assert generating == 1, "the first chunks came only after the generation ended"
        decoded = decoded_now(backend)
        assert 0 < decoded < MAX_TOKENS
        stream.close()  # the client leaves mid-stream
        left = time.monotonic()

        # The lease comes back, and the backend's slot is free ... (the deadline is only
        # how long to look: a lease held to the generation's end fails below)
        deadline = left + 60.0
        while True:
            role = chat_role(up)
            processing = backend_metrics(backend)["llamacpp:requests_processing"]
            if (role["running"], processing) == (0, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert role["running"] == 0, role
        assert processing == 0, "the backend still generates for the client that left"
        freed_s = time.monotonic() - left
        # ... at once: the dropped generation was cut a few tokens after the client left,
        # not run to its end (which is when a held lease would come back), and the lease
        # was back within 1 s, or the time of that many tokens on a slower machine.
        made = int(backend_metrics(backend)["llamacpp:tokens_predicted_total"])
        assert made < decoded + AFTER_LEAVING_MAX, f"{made} tokens made, {decoded} when it left"
        assert freed_s < max(1.0, AFTER_LEAVING_MAX * token_s), f"lease back in {freed_s:.1f} s"
        held_s = (MAX_TOKENS - made) * token_s  # the rest of it, at this machine's speed now

        # ... and the single backend slot serves the next request promptly: within 8 s,
        # or half the time the rest of the dropped generation would take on a slower machine.
        asked = time.monotonic()
        answer = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        answered_s = time.monotonic() - asked
        assert answer.choices[0].message.content is not None
        print(
            f"{token_s * 1000:.0f} ms a token; lease back in {freed_s:.3f} s with "
            f"{made - decoded} token(s) made after leaving; next answer in {answered_s:.2f} s "
            f"(the rest of the dropped one: {held_s:.1f} s)"
        )
        assert answered_s < max(8.0, held_s / 2), (
            f"next request waited {answered_s:.1f} s for the slot"
        )
        metrics = json.dumps(up.get("/status"))
        assert '"running": 0' in metrics
    finally:
        client.close()
        code = up.stop()
    assert code == 0, up.output()
