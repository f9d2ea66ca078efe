"""A conversation's request goes past its copy while that copy's one slot is busy: a role
with ``replicas: 2`` on nodes ``a`` and ``b`` of one ``rosterd up`` (both at 127.0.0.1, no
Ray), each copy a real llama-server launched with rosterd's default of one parallel slot.

A long streamed request (``ignore_eos``) of one conversation runs on the conversation's copy
and is held open; the conversation's next, short request goes to the other, idle copy and
is answered at once, rather than queued behind the long one. Each node's copy is tried as
the busy one. The run is stopped by its handle.

The model is the tiny random GGUF with a context of ``CONTEXT_TOKENS``: the usual tiny one
trains on 512 tokens, which llama-server caps a slot's context to, and writes them in a
fraction of a second. Here the long answer can run for ``CONTEXT_TOKENS`` tokens, and its
client stops reading after the first chunk, so it holds its lease however fast the
machine is, until the test lets it go (the client leaves, rosterd cuts the backend's
request).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from rosterd.replica_choice import Copy, CopyState, choose_copy, prefix_key
from support.backends import pick_free_port
from support.copies import NODES, copies_options, write_copies_lab
from support.gguf import write_gguf
from support.polling import eventually
from support.up import console, serving

#: The model's trained context and each copy's ``ctx_size``, tokens.
CONTEXT_TOKENS = 16384


def opening(story: str) -> list[dict[str, str]]:
    """The first messages of a conversation: what its prefix key is made of."""
    return [
        {"role": "system", "content": "You tell stories."},
        {"role": "user", "content": f"{story}: tell me a very long story."},
    ]


def copy_of(story: str) -> str:
    """The node whose copy holds ``story``'s prefix while both copies are idle."""
    key = prefix_key({"messages": opening(story)})
    chosen = choose_copy([Copy(node, CopyState.READY) for node in NODES], key)
    assert chosen is not None
    return chosen


def story_on(node: str) -> str:
    """A conversation whose prefix's copy is ``node``'s."""
    return next(s for s in (f"Story {i}" for i in range(2, 100)) if copy_of(s) == node)


async def long_request(
    client: httpx.AsyncClient, story: str, started: asyncio.Future[str], let_go: asyncio.Event
) -> None:
    """A long streamed answer to ``story``'s opening (up to the context, ``ignore_eos``):
    ``started`` gets the node that serves it at its first chunk; the client then reads no
    more and keeps it open until ``let_go`` is set, then goes away."""
    body = {
        "model": "chat",
        "messages": opening(story),
        "max_tokens": CONTEXT_TOKENS - 100,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: "):
                started.set_result(reply.headers["x-rosterd-node"])
                await let_go.wait()
                return


async def test_a_conversation_goes_to_the_idle_copy_while_its_copys_one_slot_is_busy(
    llama_server_binary: Path, tmp_path: Path
) -> None:
    pytest.importorskip("gguf", reason="the gguf package (dev extra) writes the tiny model")
    (tmp_path / "models").mkdir()
    gguf = write_gguf(tmp_path / "models" / "long.gguf", context_length=CONTEXT_TOKENS)
    lab = write_copies_lab(tmp_path, gguf, pick_free_port(), ctx_size=CONTEXT_TOKENS)
    options = copies_options(tmp_path, lab)
    async with (
        serving(options, out=console(), err=console(), ready_timeout_s=90) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):

        async def chat_on(node: str) -> dict[str, object]:
            roles = (await client.get("/status")).json()["nodes"][node]["roles"]
            return dict(roles.get("chat", {}))

        async def both(field: str, value: object) -> bool:
            return all([(await chat_on(n)).get(field) == value for n in NODES])

        await eventually(lambda: both("phase", "ready"), what="chat ready on a and b", timeout_s=90)
        for node in NODES:  # rosterd's default launch: one parallel slot per copy
            props = await client.get(f"{(await chat_on(node))['base_url']}/props")
            assert props.json()["total_slots"] == 1

        for busy in NODES:
            story = story_on(busy)
            idle = "b" if busy == "a" else "a"
            started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            let_go = asyncio.Event()
            long = asyncio.create_task(long_request(client, story, started, let_go))
            assert await asyncio.wait_for(started, 60) == busy, "idle: the conversation's copy"
            held = await chat_on(busy)
            assert (held["running"], held["copy_requests"]) == (1, 1)
            assert (await chat_on(idle))["copy_requests"] == 0

            # The same conversation's next turn: its copy's one slot is busy, the other
            # copy is idle, so it goes there and is answered without waiting.
            turn = [
                *opening(story),
                {"role": "assistant", "content": "Once upon a time"},
                {"role": "user", "content": "Shorter, please."},
            ]
            asked = time.monotonic()
            try:
                short = await client.post(
                    "/v1/chat/completions",
                    json={"model": "chat", "messages": turn, "max_tokens": 2},
                    timeout=30,
                )
            except httpx.ReadTimeout:
                pytest.fail(f"the short request queued behind the long one on {busy}'s copy")
            took_s = time.monotonic() - asked
            assert short.status_code == 200, short.text
            assert short.headers["x-rosterd-node"] == idle
            assert float(short.headers["x-rosterd-queue-wait-s"]) < 1.0
            assert not long.done(), "the long request still held its copy's slot"
            assert took_s < 20.0, took_s

            let_go.set()
            await long
            await eventually(lambda: both("running", 0), what="both copies idle", timeout_s=30)
            assert await both("copy_requests", 0)
