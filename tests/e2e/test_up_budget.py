"""``rosterd up`` under memory pressure and exclusions, with real llama-server backends.

Two tiny-GGUF roles on a node whose budget fits only one of them (and, in the
second test, two roles that exclude each other): concurrent requests to both
all complete, whole, through the official ``openai`` client; the scheduler's
event log (``/rosterd/events``, one entry per step with the resident set after
it) shows that swaps never overlapped and that the resident set never exceeded
the budget nor held both excluded roles; a thread sampling the backend
processes themselves confirms that the two never ran at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from support.up import (
    MODELS,
    StartUp,
    Up,
    all_gone,
    llama_entry,
    prepare_example_models,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

GIB = 2**30


def write_fleet(path: Path, memory_gb: float, reserved_gb: float) -> Path:
    return write_box_fleet(
        path,
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256, "parallel": 2},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 256, "parallel": 2},
        },
        memory_gb=memory_gb,
        reserved_gb=reserved_gb,
        flavors=["llamacpp"],
        address="127.0.0.1",
    )


async def ask(client: AsyncOpenAI, model: str, stream: bool) -> str:
    """One chat request; returns how it finished (raises if it errors or is cut off)."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"hello {model}"}]
    if not stream:
        done = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=8, temperature=0.0
        )
        assert done.usage is not None
        assert done.usage.completion_tokens > 0
        return str(done.choices[0].finish_reason)
    chunks = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0.0, stream=True
    )
    finish: str | None = None
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish is not None, "stream ended without a finish_reason (cut off)"
    return finish


async def hammer(up: Up, models: list[str], per_model: int) -> list[str]:
    client = AsyncOpenAI(base_url=up.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    jobs = [ask(client, model, stream=i % 2 == 1) for i in range(per_model) for model in models]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        await client.close()


def check_events(up: Up, capacity: int, never_together: set[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = up.get("/rosterd/events")["events"]
    open_steps: set[str] = set()
    for event in events:
        resident = set(event["resident"])
        assert event["resident_bytes"] <= capacity, event
        assert not never_together <= resident, event
        kind, role = event["kind"], str(event["role"])
        if kind in ("loading", "stopping"):
            assert not open_steps, f"{kind} {role} overlaps {open_steps}"
            open_steps.add(role)
        elif kind in ("loaded", "load_failed", "stopped"):
            open_steps.discard(role)
    return events


class ProcessWatch:
    """Samples the backend processes rosterd up really runs (every 20 ms, in a thread).

    An independent check of the event log: which model files have a live
    (not zombie) process under rosterd up at each moment.
    """

    def __init__(self, up: Up) -> None:
        self.up = up
        self.seen: list[frozenset[str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            models: set[str] = set()
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(self.up.proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if child.status() == psutil.STATUS_ZOMBIE:
                            continue
                        models |= {Path(a).name for a in child.cmdline() if a.endswith(".gguf")}
            self.seen.append(frozenset(models))
            time.sleep(0.02)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_budget_for_one_of_two_roles(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("x", "tiny-a", 0.1, 18501), llama_entry("y", "tiny-b", 0.1, 18502)],
    )
    fleet = write_fleet(tmp_path / "fleet.yaml", memory_gb=0.65, reserved_gb=0.5)
    up = rosterd_up(
        [str(roster), "--fleet", str(fleet), "--min-busy-residency", "0", "--max-concurrency", "2"]
    )
    try:
        with ProcessWatch(up) as watch:
            finishes = asyncio.run(hammer(up, ["x", "y"], per_model=6))
        both = {"tiny-a.gguf", "tiny-b.gguf"}
        assert {"tiny-a.gguf"} in watch.seen
        assert {"tiny-b.gguf"} in watch.seen
        assert not [s for s in watch.seen if both <= s], "both backends alive at once"
        assert len(finishes) == 12
        assert set(finishes) <= {"length", "stop"}
        capacity = int(0.15 * GIB)
        events = check_events(up, capacity, {"x", "y"})
        loads = [e["role"] for e in events if e["kind"] == "loaded"]
        assert {"x", "y"} <= set(loads)
        assert any(e["kind"] == "stopped" for e in events), "no swap happened"
        pids = up.backend_pids()
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert all_gone(pids) == set()


def test_excluded_roles_are_never_resident_together(
    tmp_path: Path, llama_server_binary: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("a", "tiny-a", 0.1, 18511), llama_entry("b", "tiny-b", 0.1, 18512)],
    )
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("excludes:\n  a: [b]\nsticky:\n  a: false\n  b: false\n")
    fleet = write_fleet(tmp_path / "fleet.yaml", memory_gb=4, reserved_gb=1)
    up = rosterd_up(
        [
            str(roster),
            "--overlay",
            str(overlay),
            "--fleet",
            str(fleet),
            "--min-busy-residency",
            "0",
        ]
    )
    try:
        finishes = asyncio.run(hammer(up, ["a", "b"], per_model=4))
        assert len(finishes) == 8
        check_events(up, 3 * GIB, {"a", "b"})
        pids = up.backend_pids()
    finally:
        code = up.stop(signal.SIGTERM)  # SIGTERM drains and stops like Ctrl-C
    assert code == 0, up.output()
    assert all_gone(pids) == set()
