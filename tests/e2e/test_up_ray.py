"""``rosterd up --ray-address``: the whole fleet served from one endpoint, its nodes on Ray.

``UpRun`` runs in this process (as ``rosterd up`` does) against the test
cluster of ``conftest.py`` (Ray nodes on loopback addresses, each standing for
a machine): a fleet node per Ray node, each role served by a real llama-server
on the tiny GGUF that its own node's agent started, listening on that node's
address; a fleet node with no Ray node is reported not connected and its role
planned on another node; a node removed from the cluster has its roles marked
lost, and a request for them waits up to its queue timeout instead of failing
at once. Every Ray process a test starts is stopped by its own handle.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from rich.console import Console

from rosterd.memory.peaks import MeasuredPeaks
from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.runtime import UpOptions
from support.backends import gone, pick_free_port
from support.polling import eventually
from support.ray_nodes import HEAD_IP, SPARE_IP, WORKER_IP, needs_ray
from support.up import console, listener_of, rosterd_argv, serving

#: TEST-NET-1, never this machine (its eth0 may sit in 192.0.2.0/24, not at .77).
ABSENT_REMOTE_IP = "192.0.2.77"
QUEUE_TIMEOUT_S = 12.0


def write_lab(tmp: Path, gguf: Path, nodes: dict[str, str]) -> tuple[Path, Path, Path]:
    """Roster, overlay and fleet of a lab with ``nodes`` (name -> address), each with a
    1 GiB budget: ``chat`` and ``code`` (interactive, 0.6 GiB) need a node each; ``extra``
    (batch, 0.3 GiB) fits beside either."""
    entries = [
        {"id": role, "role": "test", "name": role, "repo": f"local/{role}", "ram_gb": gb}
        | {"backend": "llama.cpp", "status": "live"}
        for role, gb in (("chat", 0.6), ("code", 0.6), ("extra", 0.3))
    ]
    roster = tmp / "roster.yaml"
    roster.write_text(json.dumps({"roster": entries}))
    overlay = tmp / "overlay.yaml"
    interactive = {"chat": "interactive", "code": "interactive"}
    overlay.write_text(json.dumps({"latency_class": interactive}))
    source = {"path": str(gguf), "ctx_size": 256, "extra_args": ["-t", "1"]}
    fleet = tmp / "fleet.yaml"
    fleet.write_text(
        json.dumps(
            {
                "nodes": [
                    {"name": name, "memory_gb": 2, "reserved_gb": 1, "platform": "linux-x86_64"}
                    | {"flavors": ["llamacpp"], "address": address}
                    for name, address in nodes.items()
                ],
                "models": {role: source for role in ("chat", "code", "extra")},
                "model_roots": [str(gguf.parent)],
            }
        )
    )
    return roster, overlay, fleet


def printed(c: Console) -> str:
    stream = c.file
    assert isinstance(stream, io.StringIO)
    return " ".join(stream.getvalue().split())


@pytest.mark.slow
@needs_ray
async def test_up_serves_each_node_through_its_agent_and_plans_around_a_missing_node(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    spare = cluster.add_node(num_cpus=1, node_ip_address=SPARE_IP)
    cluster.wait_for_nodes()
    removed = False
    roster, overlay, fleet = write_lab(
        tmp_path, tiny_gguf, {"head": HEAD_IP, "spare": SPARE_IP, "absent": ABSENT_REMOTE_IP}
    )
    out = console()
    options = UpOptions(
        roster_path=roster,
        overlay_path=overlay,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        limits=SchedulerLimits(queue_timeout_s=QUEUE_TIMEOUT_S),
        auto_backend_ports=True,
        warm_up=False,
        grace_s=5.0,
        ray_address=cluster.address,
    )
    servers: list[tuple[str, psutil.Process]] = []  # (node, its llama-server)
    try:
        async with (
            serving(options, out=out, err=console(), ready_timeout_s=120, stop_timeout_s=120) as up,
            httpx.AsyncClient(base_url=up.url, timeout=60, trust_env=False) as client,
        ):
            for role in ("chat", "code", "extra"):
                answer = await client.post(
                    "/v1/completions", json={"model": role, "prompt": "Hi", "max_tokens": 4}
                )
                assert answer.status_code == 200, answer.text
            status = (await client.get("/status")).json()
            nodes = status["nodes"]
            assert list(nodes) == ["head", "spare", "absent"]  # every node, in fleet order
            absent = nodes["absent"]
            assert absent["connected"] is False
            assert absent["connection"].startswith(
                f"not connected: no live Ray node has address {ABSENT_REMOTE_IP}"
            )
            assert absent["capacity_bytes"] == 2**30
            # The whole fleet's plan put one role there; it fits beside the others.
            ((moved_role, moved),) = absent["roles"].items()
            assert moved["phase"] == "moved"
            assert moved["moved_to"] in ("head", "spare")
            assert moved["reason"].startswith(
                f"planned on node {moved['moved_to']}: node absent is not connected"
            )
            assert status["moved"][moved_role] == moved["reason"]  # others may move too, said so
            served_on = {r: n for n in ("head", "spare") for r in nodes[n]["roles"]}
            assert served_on["chat"] != served_on["code"]  # one interactive role per node
            agents: dict[str, int] = {}
            for name, address in (("head", HEAD_IP), ("spare", SPARE_IP)):
                node = nodes[name]
                assert node["connected"] is True
                assert node["connection"].startswith("on Ray: Ray node ")
                # One roles' slot each, as on this machine (no max_concurrency set).
                assert node["max_concurrency"] == len(node["roles"])
                for info in node["roles"].values():
                    assert info["phase"] == "ready"
                    # Its figures, counted on its node, as for a role on this machine.
                    assert info["memory"]["counted_bytes"] == info["resident_bytes"]
                    assert info["base_url"].startswith(f"http://{address}:")
                    assert info["pid"] is None  # a process of the node, not of this machine
                    server = listener_of(info["base_url"])
                    assert Path(server.exe()).name == "llama-server"
                    agent = server.parent()
                    assert agent is not None
                    assert "RayNodeAgent" in " ".join(agent.cmdline())
                    agents.setdefault(name, server.ppid())
                    assert server.ppid() == agents[name]  # its own node's agent started it
                    assert info["measured_rss_bytes"] > 0  # measured by that agent
                    servers.append((name, server))
            assert agents["head"] != agents["spare"]
            metrics = (await client.get("/metrics")).text
            assert 'rosterd_node_connected{node="absent"} 0.0' in metrics
            assert 'rosterd_node_connected{node="spare"} 1.0' in metrics
            phase = f'rosterd_role_phase{{node="absent",phase="moved",role="{moved_role}"}} 1.0'
            assert phase in metrics
            chat_on = served_on["chat"]
            ready = f'rosterd_role_phase{{node="{chat_on}",phase="ready",role="chat"}} 1.0'
            assert ready in metrics
            assert 'rosterd_measured_rss_bytes{node="spare"' in metrics

            # The spare machine goes: its roles are lost, and a request for one waits.
            lost_roles = sorted(r for r, n in served_on.items() if n == "spare")
            cluster.remove_node(spare)
            removed = True

            async def lost() -> list[dict[str, Any]]:
                events = (await client.get("/rosterd/events")).json()["events"]
                return [e for e in events if e["kind"] == "lost"]

            losses: list[dict[str, Any]] = await eventually(
                lost, what="the spare node's roles lost", timeout_s=60.0, interval_s=0.2
            )
            assert sorted(e["role"] for e in losses) == lost_roles
            assert all(e["node"] == "spare" and "node spare is lost" in e["cause"] for e in losses)
            for name, server in servers:
                if name == "spare":  # it died with its node's agent
                    await eventually(
                        functools.partial(gone, server.pid),
                        what=f"backend {server.pid} to end",
                        timeout_s=30.0,
                        interval_s=0.2,
                    )
            asked = time.monotonic()
            waiting = asyncio.create_task(
                client.post(
                    "/v1/completions",
                    json={"model": lost_roles[0], "prompt": "Hi", "max_tokens": 4},
                )
            )
            await asyncio.sleep(2.0)
            assert not waiting.done()  # not failed at once: it waits for its role
            status = (await client.get("/status")).json()
            spare_view = status["nodes"]["spare"]
            assert spare_view["connected"] is False
            assert spare_view["connection"].startswith("node spare is lost")
            assert spare_view["resident_bytes"] == 0
            assert {i["phase"] for i in spare_view["roles"].values()} == {"lost"}
            assert spare_view["roles"][lost_roles[0]]["queued"] == 1
            ps = await asyncio.to_thread(
                subprocess.run,
                [*rosterd_argv(), "ps", "--url", up.url],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "COLUMNS": "200"},
            )
            assert ps.returncode == 0, ps.stderr
            shown = " ".join(ps.stdout.split())
            assert "node spare (127.0.0.4, node spare is lost" in shown
            assert f"node absent ({ABSENT_REMOTE_IP}, not connected: no live Ray node" in shown
            assert f"{moved_role} │ moved to {moved['moved_to']} │" in shown
            answer = await waiting
            assert answer.status_code == 503, answer.text
            assert time.monotonic() - asked >= QUEUE_TIMEOUT_S - 1.0
            assert "node spare is lost" in answer.json()["error"]["message"]
    finally:
        if not removed:
            cluster.remove_node(spare)
    for _, server in servers:
        await eventually(
            functools.partial(gone, server.pid),
            what=f"backend {server.pid} to end",
            timeout_s=30.0,
            interval_s=0.2,
        )
    # The head node's agent measured its roles' peaks there; they are kept here, for
    # the next up and plan to count.
    kept = MeasuredPeaks(tmp_path / "state")
    for role in (r for r, n in served_on.items() if n == "head"):
        assert (kept.peak_bytes("head", role) or 0) > 10 * 2**20
    said = printed(out)
    assert (
        "node absent is not connected to the Ray cluster: "
        f"no live Ray node has address {ABSENT_REMOTE_IP}"
    ) in said
    assert f"role {moved_role}: planned on node" in said
    assert "node spare is lost" in said
    assert said.endswith("rosterd stopped; no backend left running")


def write_small_lab(tmp: Path, gguf: Path, nodes: dict[str, str]) -> tuple[Path, Path, Path]:
    """The lab of :func:`write_lab` with ``chat`` and ``code`` only, 0.3 GiB each: planned
    one per node, and both fit on one node once the other is lost."""
    roster, overlay, fleet = write_lab(tmp, gguf, nodes)
    entries = [e | {"ram_gb": 0.3} for e in json.loads(roster.read_text())["roster"]]
    roster.write_text(json.dumps({"roster": [e for e in entries if e["id"] != "extra"]}))
    return roster, overlay, fleet


@pytest.mark.slow
@needs_ray
async def test_a_lost_nodes_role_moves_to_the_remaining_node_and_its_request_is_served(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    spare = cluster.add_node(num_cpus=1, node_ip_address=SPARE_IP)
    cluster.wait_for_nodes()
    removed = False
    roster, overlay, fleet = write_small_lab(
        tmp_path, tiny_gguf, {"head": HEAD_IP, "spare": SPARE_IP}
    )
    out = console()
    options = UpOptions(
        roster_path=roster,
        overlay_path=overlay,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        limits=SchedulerLimits(queue_timeout_s=60.0),
        auto_backend_ports=True,
        warm_up=False,
        grace_s=5.0,
        ray_address=cluster.address,
    )
    try:
        async with (
            serving(options, out=out, err=console(), ready_timeout_s=120, stop_timeout_s=120) as up,
            httpx.AsyncClient(base_url=up.url, timeout=90, trust_env=False) as client,
        ):
            body = {"model": "code", "prompt": "Hi", "max_tokens": 4}
            assert (await client.post("/v1/completions", json=body)).status_code == 200
            status = (await client.get("/status")).json()
            assert list(status["nodes"]["spare"]["roles"]) == ["code"]
            assert list(status["nodes"]["head"]["roles"]) == ["chat"]

            cluster.remove_node(spare)
            removed = True
            lost_at = time.monotonic()

            async def kinds() -> set[str]:
                events = (await client.get("/rosterd/events")).json()["events"]
                return {e["kind"] for e in events if e["role"] == "code"}

            await eventually(
                lambda: _has(kinds, "lost"), what="code lost", timeout_s=60.0, interval_s=0.2
            )
            # Asked while the role is lost (or already moved): served on the remaining node.
            answer = await client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert time.monotonic() - lost_at < 60.0
            events = (await client.get("/rosterd/events")).json()["events"]
            moved = [e for e in events if e["kind"] == "moved"]
            assert [(e["role"], e["node"]) for e in moved] == [("code", "spare")]
            assert moved[0]["cause"].startswith("moved to node head: node spare is lost")
            status = (await client.get("/status")).json()
            head = status["nodes"]["head"]
            assert sorted(head["roles"]) == ["chat", "code"]
            assert head["roles"]["code"]["phase"] == "ready"
            assert head["roles"]["code"]["base_url"].startswith(f"http://{HEAD_IP}:")
            assert head["roles"]["code"]["memory"] is not None  # its figures moved with it
            assert status["nodes"]["spare"]["roles"] == {}

            # The machine comes back: rosterd takes it back by itself (a reload), with a
            # new agent; code stays where it moved (the plan in force is kept), and a
            # role added that only fits there is served by that agent.
            spare = cluster.add_node(num_cpus=1, node_ip_address=SPARE_IP)
            removed = False

            async def spare_back() -> bool:
                view = (await client.get("/status")).json()["nodes"]["spare"]
                return bool(view["connected"])

            await eventually(
                spare_back, what="node spare connected again", timeout_s=60.0, interval_s=0.2
            )
            entries = json.loads(roster.read_text())["roster"]
            big = {**entries[0], "id": "big", "name": "big", "repo": "local/big", "ram_gb": 0.9}
            roster.write_text(json.dumps({"roster": [*entries, big]}))
            lab = json.loads(fleet.read_text())
            lab["models"]["big"] = lab["models"]["chat"]
            fleet.write_text(json.dumps(lab))
            reloaded = await client.post("/rosterd/reload")
            assert reloaded.status_code == 200, reloaded.text
            answer = await client.post(
                "/v1/completions", json={"model": "big", "prompt": "Hi", "max_tokens": 4}
            )
            assert answer.status_code == 200, answer.text
            nodes = (await client.get("/status")).json()["nodes"]
            assert sorted(nodes["head"]["roles"]) == ["chat", "code"]
            assert nodes["spare"]["roles"]["big"]["base_url"].startswith(f"http://{SPARE_IP}:")
            assert nodes["spare"]["connection"].startswith("on Ray: Ray node ")
    finally:
        if not removed:
            cluster.remove_node(spare)
    said = printed(out)
    assert "role code: moved to node head: node spare is lost" in said
    assert "node spare is back on the Ray cluster" in said
    assert said.endswith("rosterd stopped; no backend left running")


async def _has(kinds: Any, kind: str) -> set[str]:
    got: set[str] = await kinds()
    return got if kind in got else set()


@pytest.mark.slow
@needs_ray
async def test_a_reload_on_ray_adds_a_node_and_serves_a_new_role_through_its_agent(
    cluster: Any, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    # At start the fleet has the head alone, and the roster chat alone.
    roster, overlay, fleet = write_lab(tmp_path, tiny_gguf, {"head": HEAD_IP})
    entries = json.loads(roster.read_text())["roster"]
    roster.write_text(json.dumps({"roster": [e for e in entries if e["id"] == "chat"]}))
    out = console()
    options = UpOptions(
        roster_path=roster,
        overlay_path=overlay,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        limits=SchedulerLimits(queue_timeout_s=60.0),
        auto_backend_ports=True,
        warm_up=False,
        grace_s=5.0,
        ray_address=cluster.address,
    )
    async with (
        serving(options, out=out, err=console(), ready_timeout_s=120, stop_timeout_s=120) as up,
        httpx.AsyncClient(base_url=up.url, timeout=90, trust_env=False) as client,
    ):
        chat = {"model": "chat", "prompt": "Hi", "max_tokens": 4}
        assert (await client.post("/v1/completions", json=chat)).status_code == 200
        before = (await client.get("/status")).json()["nodes"]
        assert list(before) == ["head"]
        chat_url = before["head"]["roles"]["chat"]["base_url"]

        # The fleet gains the worker machine (a live Ray node) and the roster gains code,
        # interactive like chat, so it needs a node of its own: the worker.
        write_lab(tmp_path, tiny_gguf, {"head": HEAD_IP, "worker": WORKER_IP})
        roster.write_text(json.dumps({"roster": [e for e in entries if e["id"] != "extra"]}))
        reloaded = await client.post("/rosterd/reload")
        assert reloaded.status_code == 200, reloaded.text
        code = {"model": "code", "prompt": "Hi", "max_tokens": 4}
        answer = await client.post("/v1/completions", json=code)
        assert answer.status_code == 200, answer.text
        nodes = (await client.get("/status")).json()["nodes"]
        assert list(nodes) == ["head", "worker"]
        worker = nodes["worker"]
        assert worker["connected"] is True
        assert worker["connection"].startswith("on Ray: Ray node ")
        info = worker["roles"]["code"]
        assert info["phase"] == "ready"
        assert info["base_url"].startswith(f"http://{WORKER_IP}:")
        assert info["memory"]["counted_bytes"] == info["resident_bytes"]
        server = listener_of(info["base_url"])
        agent = server.parent()
        assert agent is not None
        assert "RayNodeAgent" in " ".join(agent.cmdline())  # the worker's agent started it
        # chat was not touched by the reload: the same backend still serves it.
        assert nodes["head"]["roles"]["chat"]["base_url"] == chat_url
        assert (await client.post("/v1/completions", json=chat)).status_code == 200

        # A node on Ray given a new address is refused (its agent runs at the old one),
        # and nothing changes.
        write_lab(tmp_path, tiny_gguf, {"head": "127.0.0.5", "worker": WORKER_IP})
        refused = await client.post("/rosterd/reload")
        assert refused.status_code != 200
        assert "takes effect when rosterd up restarts" in refused.text
        status = (await client.get("/status")).json()
        assert status["config"]["last_error"]["message"].startswith("node head is on Ray at")
        assert status["nodes"]["head"]["roles"]["chat"]["base_url"] == chat_url
        assert (await client.post("/v1/completions", json=code)).status_code == 200
    await eventually(
        lambda: gone(server.pid),
        what=f"backend {server.pid} to end",
        timeout_s=30.0,
        interval_s=0.2,
    )
    assert printed(out).endswith("rosterd stopped; no backend left running")
