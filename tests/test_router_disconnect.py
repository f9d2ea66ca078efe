"""A client that leaves mid-stream frees the backend for the next request at once.

Real Gemma 3 270M behind ``rosterd up``, with one llama-server slot
(``parallel: 1``) and one request at a time for the role: a long streamed
generation (1500 tokens, EOS ignored, about 15 s here) is dropped after a few
chunks. If the router kept the upstream request open, the slot would stay busy
and the next request would wait for the whole generation; instead the lease is
back within a second and the next request is answered promptly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from openai import OpenAI

from test_up_support import (
    GEMMA,
    llama_entry,
    prepare_example_models,
    start_up,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow


def test_disconnect_mid_stream_frees_the_backend_at_once(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("chat", "gemma-3-270m", 0.5, 18521)]
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"gemma-3-270m": {"path": str(GEMMA), "ctx_size": 2048, "parallel": 1}},
        flavors=["llamacpp"],
    )
    up = start_up(
        [str(roster), "--fleet", str(fleet), "--max-concurrency", "1"], tmp_path, free_port
    )
    client = OpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        stream = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Tell me a very long story."}],
            max_tokens=1500,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        received = 0
        asked = time.monotonic()
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += 1
            if received >= 5:
                break
        assert received >= 5
        # Chunk by chunk, not buffered: the whole generation would take ~15 s.
        assert time.monotonic() - asked < 5.0
        stream.close()  # the client leaves mid-stream
        left = time.monotonic()

        # The lease comes back at once ...
        deadline = left + 2.0
        while time.monotonic() < deadline:
            role = up.get("/status")["nodes"]["box"]["roles"]["chat"]
            if role["in_flight"] == 0:
                break
            time.sleep(0.02)
        assert role["in_flight"] == 0, role
        freed_s = time.monotonic() - left

        # ... and the single backend slot serves the next request promptly.
        asked = time.monotonic()
        answer = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        answered_s = time.monotonic() - asked
        assert answer.choices[0].message.content is not None
        print(f"lease back in {freed_s:.3f} s; next answer in {answered_s:.2f} s")
        assert answered_s < 8.0, f"next request waited {answered_s:.1f} s for the slot"
        assert freed_s < 1.0
        metrics = json.dumps(up.get("/status"))
        assert '"in_flight": 0' in metrics
    finally:
        client.close()
        code = up.stop()
    assert code == 0, up.output()
