"""A role with two replicas on a Ray test cluster (``ray.cluster_utils``, nodes on 127.0.0.x,
each standing for a machine), served by ``rosterd up --ray-address`` in this process: a
copy on each node, each a real llama-server on the tiny GGUF started by its node's agent.

Balanced: 400 short requests at 8 connections, each copy serves at least 30 %. Failover:
one copy's backend killed with SIGKILL while requests run, none fails (a request that got
no byte from it goes once to the other copy). Prefix routing: eight conversations of six
turns, interleaved; at least 90 % of the turns after the first reuse their copy's KV cache
(llama-server's ``timings.prompt_n``, the prompt tokens it evaluated, at most 10 % of the
prompt). Every Ray process is the ``cluster`` fixture's, stopped by its handle.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import signal
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.polling import eventually
from support.ray_nodes import HEAD_IP, WORKER_IP, needs_ray
from support.up import console, listener_of, serving

#: Slots per copy: each copy keeps the KV cache of up to this many conversations.
SLOTS = 8
#: The conversations' system prompt is long, so that a cache hit evaluates a small share.
#: Each conversation's starts with its own words: llama-server gives a request the slot
#: whose cache shares the most of its prompt, so conversations that begin alike would all
#: take one slot and evict each other (seen with eight conversations on eight slots).
SYSTEM = "You answer in one short word. " * 30


def long_context_gguf(path: Path) -> Path:
    """The tiny GGUF with an 8192-token training context (the default's 512 caps each slot's
    context, too short for six turns with a long system prompt)."""
    pytest.importorskip("gguf", reason="the gguf package (dev extra) writes the tiny model")
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_gguf.py"
    spec = importlib.util.spec_from_file_location("make_tiny_gguf", script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.parent.mkdir(parents=True, exist_ok=True)
    return cast(Path, module.write_tiny_gguf(path, 0, context_length=8192))


def write_replicas_lab(tmp: Path, gguf: Path) -> tuple[Path, Path, Path]:
    """Roster, overlay and fleet: one interactive role ``chat`` (0.3 GiB) with
    ``replicas: 2`` on two nodes of 1 GiB, ``head`` and ``worker``."""
    roster = tmp / "roster.yaml"
    entry = {"id": "chat", "role": "test", "name": "chat", "repo": "local/chat", "ram_gb": 0.3}
    roster.write_text(json.dumps({"roster": [entry | {"backend": "llama.cpp", "status": "live"}]}))
    overlay = tmp / "overlay.yaml"
    overlay.write_text(json.dumps({"latency_class": {"chat": "interactive"}}))
    fleet = tmp / "fleet.yaml"
    source = {"path": str(gguf), "ctx_size": 4096 * SLOTS, "parallel": SLOTS, "replicas": 2}
    nodes = [
        {"name": name, "memory_gb": 2, "reserved_gb": 1, "platform": "linux-x86_64"}
        | {"flavors": ["llamacpp"], "address": address}
        for name, address in (("head", HEAD_IP), ("worker", WORKER_IP))
    ]
    lab = {"nodes": nodes, "models": {"chat": source | {"extra_args": ["-t", "1"]}}}
    fleet.write_text(json.dumps(lab | {"model_roots": [str(gguf.parent)]}))
    return roster, overlay, fleet


async def copy_requests(client: httpx.AsyncClient) -> dict[str, float]:
    """Node -> requests sent to its copy of ``chat`` (``rosterd_copy_requests_total``)."""
    text = (await client.get("/metrics")).text
    found = re.findall(r'rosterd_copy_requests_total\{node="(\w+)",role="chat"\} (\S+)', text)
    return {node: float(value) for node, value in found}


async def completions(
    client: httpx.AsyncClient, total: int, connections: int, *, at: int = -1, then: Any = None
) -> list[int]:
    """``total`` short completions over ``connections`` at once; the status of each. Once
    ``at`` have answered, ``then()`` runs (once)."""
    statuses: list[int] = []
    next_index = iter(range(total))

    async def worker() -> None:
        for i in next_index:
            body = {"model": "chat", "prompt": f"Say {i}", "max_tokens": 2}
            statuses.append((await client.post("/v1/completions", json=body)).status_code)
            if len(statuses) == at and then is not None:
                then()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return statuses


@pytest.mark.slow
@needs_ray
async def test_two_replicas_share_the_load_survive_a_kill_and_keep_conversations_cached(
    cluster: Any, llama_server_binary: Path, tmp_path: Path
) -> None:
    gguf = long_context_gguf(tmp_path / "models" / "long.gguf")
    roster, overlay, fleet = write_replicas_lab(tmp_path, gguf)
    options = UpOptions(
        roster_path=roster,
        overlay_path=overlay,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        limits=SchedulerLimits(queue_timeout_s=60.0, max_concurrency=SLOTS),
        auto_backend_ports=True,
        warm_up=True,
        grace_s=5.0,
        ray_address=cluster.address,
    )
    async with (
        serving(
            options, out=console(), err=console(), ready_timeout_s=120, stop_timeout_s=120
        ) as up,
        httpx.AsyncClient(base_url=up.url, timeout=90, trust_env=False) as client,
    ):

        async def both_ready() -> bool:
            nodes = (await client.get("/status")).json()["nodes"]
            return all(nodes[n]["roles"].get("chat", {}).get("phase") == "ready" for n in nodes)

        await eventually(
            both_ready, what="chat ready on both nodes", timeout_s=90.0, interval_s=0.2
        )
        status = (await client.get("/status")).json()
        assert status["replicas"] == {"chat": ["head", "worker"]}
        for name, ip in (("head", HEAD_IP), ("worker", WORKER_IP)):
            chat = status["nodes"][name]["roles"]["chat"]
            assert chat["copies"] == ["head", "worker"]
            assert chat["base_url"].startswith(f"http://{ip}:")

        # Balanced: each copy serves at least 30 % of 400 short requests at 8 connections.
        statuses = await completions(client, 400, 8)
        assert statuses == [200] * 400
        shares = await copy_requests(client)
        assert sum(shares.values()) == 400
        print(f"requests per copy of 400 at 8 connections: {shares}")
        assert min(shares.get("head", 0), shares.get("worker", 0)) >= 0.3 * 400, shares

        # Failover: the worker's backend is killed (SIGKILL) mid-run; no request fails.
        worker_backend = listener_of(status["nodes"]["worker"]["roles"]["chat"]["base_url"])
        statuses = await completions(
            client, 200, 8, at=40, then=lambda: worker_backend.send_signal(signal.SIGKILL)
        )
        assert not worker_backend.is_running()
        failed = [s for s in statuses if s != 200]
        assert failed == [], f"{len(failed)} of 200 failed: {failed[:5]}"
        # its supervisor started it again
        await eventually(
            both_ready, what="chat ready on both nodes", timeout_s=60.0, interval_s=0.2
        )

        # Prefix routing: eight conversations of six turns, interleaved turn by turn.
        conversations: list[list[dict[str, str]]] = [
            [
                {"role": "system", "content": f"{i} " * 8 + SYSTEM},
                {"role": "user", "content": f"Topic {i}?"},
            ]
            for i in range(8)
        ]
        reused, later_turns = 0, 0
        seen: list[tuple[int, int, int, int]] = []  # (turn, conversation, evaluated, prompt)
        for turn in range(6):
            for i, messages in enumerate(conversations):
                body = {"model": "chat", "messages": messages, "max_tokens": 4}
                answer = await client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                data = answer.json()
                if turn > 0:
                    later_turns += 1
                    prompt = data["usage"]["prompt_tokens"]
                    reused += data["timings"]["prompt_n"] <= 0.1 * prompt
                    seen.append((turn, i, data["timings"]["prompt_n"], prompt))
                reply = data["choices"][0]["message"]["content"]
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"And {turn} {i}?"},
                ]
        print(f"prefix routing: {reused} of {later_turns} later turns reused the cache")
        assert reused >= 0.9 * later_turns, (
            f"{reused} of {later_turns} turns reused the cache: {seen}"
        )
