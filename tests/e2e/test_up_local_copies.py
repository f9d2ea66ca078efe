"""Two copies of a role on two nodes that one ``rosterd up`` runs itself, without Ray: a role
with ``replicas: 2`` on nodes ``a`` and ``b``, both at 127.0.0.1, each copy a real
llama-server on the tiny GGUF under this run's one supervisor.

Both copies load as two processes, named ``chat@a`` and ``chat@b`` (their logs, their
ports: the roster's port for one, a free one for the other on the same address);
completions of different prompts go to both; one copy killed with SIGKILL by its pid
fails no request (the other serves them) and only its own node restarts it. The run is
stopped by its handle.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx

from support.backends import pick_free_port
from support.copies import NODES, copies_options, write_copies_lab
from support.polling import eventually
from support.up import console, serving


async def copy_requests(client: httpx.AsyncClient) -> dict[str, float]:
    """Node -> requests sent to its copy of ``chat`` (``rosterd_copy_requests_total``)."""
    text = (await client.get("/metrics")).text
    found = re.findall(r'rosterd_copy_requests_total\{node="(\w+)",role="chat"\} (\S+)', text)
    return {node: float(value) for node, value in found}


async def complete(client: httpx.AsyncClient, prompts: list[str], connections: int) -> list[int]:
    """A short completion of each prompt, over ``connections`` at once; their statuses."""
    statuses: list[int] = []
    left = iter(prompts)

    async def worker() -> None:
        for prompt in left:
            body = {"model": "chat", "prompt": prompt, "max_tokens": 2}
            statuses.append((await client.post("/v1/completions", json=body)).status_code)

    await asyncio.gather(*(worker() for _ in range(connections)))
    return statuses


async def test_two_copies_on_two_nodes_of_this_machine_serve_and_fail_over(
    tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    roster_port = pick_free_port()
    options = copies_options(tmp_path, write_copies_lab(tmp_path, tiny_gguf, roster_port))
    state = tmp_path / "state"  # copies_options' state folder
    async with (
        serving(options, out=console(), err=console(), ready_timeout_s=90) as up,
        httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
    ):

        async def chat_on(node: str) -> dict[str, Any]:
            roles = (await client.get("/status")).json()["nodes"][node]["roles"]
            return dict(roles.get("chat", {}))

        async def both_ready() -> bool:
            phases = [(await chat_on(n)).get("phase") for n in NODES]
            return phases == ["ready", "ready"]

        await eventually(both_ready, what="chat ready on a and b", timeout_s=90, interval_s=0.2)
        status = (await client.get("/status")).json()
        assert status["replicas"] == {"chat": ["a", "b"]}
        a, b = await chat_on("a"), await chat_on("b")
        assert a["copies"] == b["copies"] == ["a", "b"]
        assert a["pid"] != b["pid"], "two copies, two llama-server processes"
        ports = {int(c["base_url"].rsplit(":", 1)[1]) for c in (a, b)}
        assert len(ports) == 2, "two copies on one address listen on two ports"
        assert roster_port in ports, "one copy keeps the roster's port, the other a free one"

        # Each copy's backend has its own name, so its own log (and run record).
        assert (state / "logs" / "chat@a.log").is_file()
        assert (state / "logs" / "chat@b.log").is_file()
        assert not (state / "logs" / "chat.log").exists()
        # ... and keeps its own KV cache: one copy's slots are never restored into another.
        assert (state / "kv" / "chat@a").is_dir()
        assert (state / "kv" / "chat@b").is_dir()
        assert not (state / "kv" / "chat").exists()
        one = await client.get("/rosterd/logs/chat", params={"node": "b", "lines": 1000})
        assert one.status_code == 200
        assert "starting chat@b" in one.text
        assert "starting chat@a" not in one.text
        both = (await client.get("/rosterd/logs/chat", params={"lines": 1000})).text
        assert "==> chat@a.log <==" in both
        assert "==> chat@b.log <==" in both
        follow = await client.get("/rosterd/logs/chat", params={"follow": "1"})
        assert follow.status_code == 400
        assert "--node" in follow.text
        nowhere = await client.get("/rosterd/logs/chat", params={"node": "c"})
        assert nowhere.status_code == 404

        # Different prompts (conversations) go to both copies.
        prompts = [f"Conversation {i} begins with its own words." for i in range(24)]
        assert await complete(client, prompts, 1) == [200] * 24
        shares = await copy_requests(client)
        assert sum(shares.values()) == 24
        assert min(shares.get("a", 0), shares.get("b", 0)) > 0, shares

        # b's copy killed by its pid (SIGKILL): no request fails, a's copy serves them,
        # and only b's node sees its crash and restarts it.
        os.kill(b["pid"], signal.SIGKILL)
        statuses = await complete(client, [f"After the kill {i}" for i in range(24)], 4)
        assert statuses == [200] * 24, statuses

        async def b_back() -> bool:
            now = await chat_on("b")
            return now.get("phase") == "ready" and now.get("pid") not in (None, b["pid"])

        await eventually(b_back, what="b's copy restarted", timeout_s=60, interval_s=0.2)
        assert (await chat_on("a"))["pid"] == a["pid"], "a's copy ran on untouched"
        events = (await client.get("/rosterd/events")).json()["events"]
        crashed = {e["node"] for e in events if e["role"] == "chat" and e["kind"] == "crashed"}
        assert crashed == {"b"}, events
