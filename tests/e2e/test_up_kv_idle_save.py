"""The KV cache is saved while the role is idle, not while it is evicted (issue 31).

Real llama-server processes behind ``rosterd up``: Gemma 3 270M at ctx 8192 (role
``chat``) holds a conversation of about 3,700 tokens and sits idle a few seconds; a
request for a tiny GGUF (role ``other``) on a node that holds one of them at a time
evicts it. With the KV kept, the idle save has written the slot already: each answer's
save is counted before the eviction that follows it and none during it (the eviction only
stops the process), and the conversation's prefill after the swap is still a few tokens
(llama-server's ``timings.prompt_n``, at most 5 % of the prompt). What the eviction costs
in time, against ``keep_kv: false``, is a figure for ``bench/swap_bench.py``, not for a
timed test on a shared machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.up import (
    GEMMA,
    MODELS,
    Up,
    llama_entry,
    prepare_example_models,
    start_up,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

#: Seconds ``chat`` stays idle before the request that evicts it: past the idle save's
#: 1.5 s quiet time, with room for the save itself on a loaded machine.
IDLE_S = 4.0
#: Evictions per run.
SWAPS = 4


def conversation(notes: int = 245) -> list[dict[str, str]]:
    """One user turn of about 15 tokens per note (245 notes: about 3,700 tokens)."""
    colours = ["red", "green", "blue", "amber", "violet", "grey", "white", "black"]
    things = ["lamp", "river", "stone", "window", "garden", "engine", "letter", "bridge"]
    text = " ".join(
        f"Note {i}: the {colours[i % 8]} {things[(i // 8) % 8]} is number {i}."
        for i in range(notes)
    )
    return [{"role": "user", "content": f"Read these notes.\n{text}\nWhich note is first?"}]


def chat(up: Up, model: str, messages: list[dict[str, str]]) -> tuple[dict[str, Any], float]:
    """One chat completion; its answer and the seconds it took as the client saw them."""
    began = time.perf_counter()
    reply = httpx.post(
        up.url + "/v1/chat/completions",
        json={"model": model, "messages": messages, "max_tokens": 4, "temperature": 0.0},
        timeout=300,
        trust_env=False,
    )
    took = time.perf_counter() - began
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body, took


def start_lab(tmp_path: Path, port: int) -> Up:
    """``rosterd up`` on a node that holds gemma (ctx 8192) or the tiny model, not both."""
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("chat", "gemma-3-270m", 0.5, 18571),
            llama_entry("other", "tiny-a", 1.0, 18572),
        ],
    )
    gemma: dict[str, object] = {"path": str(GEMMA), "ctx_size": 8192, "parallel": 1}
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"gemma-3-270m": gemma, "tiny-a": {"path": str(MODELS / "tiny-a.gguf")}},
        memory_gb=2.4,
        reserved_gb=1,
        flavors=["llamacpp"],
    )
    args = [str(roster), "--fleet", str(fleet), "--min-residency", "0", "--drain", "1"]
    return start_up(args, tmp_path, port)


def saves_of_chat(up: Up) -> int:
    """How many times ``chat``'s KV cache was saved in this run (``/status``)."""
    saves: int = up.get("/status")["nodes"]["box"]["roles"]["chat"]["kv"]["saves"]
    return saves


def test_an_idle_role_is_saved_before_its_eviction_and_not_during_it(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    messages = conversation()
    up = start_lab(tmp_path, free_port)
    prefills: list[int] = []
    prompts: list[int] = []
    before: list[int] = []
    after: list[int] = []
    try:
        for _ in range(SWAPS):
            answer, _ = chat(up, "chat", messages)
            prompts.append(answer["usage"]["prompt_tokens"])
            prefills.append(answer["timings"]["prompt_n"])
            time.sleep(IDLE_S)
            before.append(saves_of_chat(up))
            chat(up, "other", [{"role": "user", "content": "hi"}])
            resident = up.get("/status")["nodes"]["box"]["resident"]
            assert "chat" not in resident, resident  # it was evicted: no room for both
            after.append(saves_of_chat(up))
        kv = up.get("/status")["nodes"]["box"]["roles"]["chat"]["kv"]
    finally:
        code = up.stop()
    assert code == 0, up.output()
    shown = f"prefills {prefills} of {prompts} tokens, saves {before} then {after}"
    prompt_tokens = prompts[0]
    assert 3300 <= prompt_tokens <= 4200, shown
    assert prefills[0] >= prompt_tokens - 2, shown  # the first one is cold
    # After each swap the conversation came back from the kept file.
    assert all(p <= 0.05 * prompt_tokens for p in prefills[1:]), shown
    assert kv["last_restore"] == "restored", kv
    # Saved while idle: each answer's save was counted before the eviction that followed,
    # and the eviction saved nothing more (it only stopped the process).
    assert before == list(range(1, SWAPS + 1)), shown
    assert after == before, shown
