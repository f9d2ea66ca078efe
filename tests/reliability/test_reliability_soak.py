"""Soak and chaos: ``rosterd up`` over three real llama-server roles on tiny GGUFs that must
swap (the budget holds two, and ``a`` excludes ``b``), under mixed traffic for a bounded
time (``Budget.soak_s`` / ``Budget.chaos_s``; longer with ``--long-reliability``).

Traffic: plain and streamed chat requests to random roles (seeded), clients that
give up part-way, and ``rosterd load`` / ``rosterd unload`` in between. Every
request must end with 200 and a whole answer, or an OpenAI-shaped error whose
code is in ``ERROR_KINDS`` (a streamed one may end with such an SSE error event):
anything else is a lost request. ``/status`` is sampled every second: the
resident bytes never exceed the budget and ``a`` and ``b`` are never resident
together. rosterd's RSS and open file descriptors, measured with no request in
flight after the warm-up and at the end, stay within 10 %. No process is left.

Chaos adds faults at seeded random moments: backends killed with SIGKILL,
backends stopped with SIGSTOP and resumed with SIGCONT, and once rosterd itself
killed with SIGKILL and started again on the same state folder, which must reap
what the first left and serve again. A SIGSTOPped backend is not detected by
rosterd (nothing probes a resident backend's liveness yet): requests to it wait
until it resumes or until their client's timeout, counted apart as "timed out
waiting", so the other counts stay honest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from support.reliability import budget, documented_error, print_figures, rss_and_fds
from support.up import (
    MODELS,
    Up,
    all_gone,
    llama_entry,
    prepare_example_models,
    rosterd_argv,
    start_up,
    write_box_fleet,
    write_roster,
)

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

ROLES = ("a", "b", "c")
MODEL_FILES = {"a": "tiny-a", "b": "tiny-b", "c": "tiny-voice"}
#: The client's own timeout in chaos: longer than a load, shorter than any hang.
CHAOS_CLIENT_TIMEOUT_S = 20.0


def _lab(tmp: Path) -> list[str]:
    """Roster, overlay and fleet: three 1 GiB roles on a node with 2.5 GiB to give."""
    prepare_example_models()
    roster = write_roster(
        tmp / "roster.yaml",
        [llama_entry(role, MODEL_FILES[role], 1.0, 18700 + i) for i, role in enumerate(ROLES)],
    )
    overlay = tmp / "overlay.yaml"
    overlay.write_text(
        json.dumps({"excludes": {"a": ["b"]}, "sticky": dict.fromkeys(ROLES, False)})
    )
    fleet = write_box_fleet(
        tmp / "fleet.yaml",
        {
            MODEL_FILES[role]: {"path": str(MODELS / f"{MODEL_FILES[role]}.gguf"), "ctx_size": 256}
            for role in ROLES
        },
        memory_gb=3.5,
        reserved_gb=1.0,
        flavors=["llamacpp"],
        address="127.0.0.1",
    )
    return [str(roster), "--overlay", str(overlay), "--fleet", str(fleet), "--min-residency", "1"]


@dataclass
class Tally:
    """What happened to every request, and what the samples saw."""

    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    samples: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    admin: Counter[str] = field(default_factory=Counter)


def _judge(tally: Tally, status: int, text: str, stream: bool) -> None:
    if status == 200:
        if stream:
            events = [ln for ln in text.splitlines() if ln.startswith("data: ")]
            if events and events[-1] == "data: [DONE]":
                tally.outcomes["200"] += 1
            elif events and documented_error(events[-1]):
                tally.outcomes[f"stream cut: {documented_error(events[-1])}"] += 1
            else:
                tally.lost.append(f"stream ended without [DONE] or an error: {text[-200:]}")
        elif '"choices"' in text:
            tally.outcomes["200"] += 1
        else:
            tally.lost.append(f"200 without choices: {text[-200:]}")
        return
    code = documented_error(text)
    if code is None:
        tally.lost.append(f"{status} not an OpenAI-shaped error: {text[:200]}")
    else:
        tally.outcomes[f"{status} {code}"] += 1


async def _client(url: str, rng: random.Random, tally: Tally, until: float, chaos: bool) -> None:
    """One client sending requests back to back until ``until``."""
    async with httpx.AsyncClient(timeout=CHAOS_CLIENT_TIMEOUT_S, trust_env=False) as client:
        while time.monotonic() < until:
            role, stream = rng.choice(ROLES), rng.random() < 0.5
            give_up_s = rng.uniform(0.05, 0.5) if rng.random() < 0.15 else None
            body = {
                "model": role,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": rng.randint(1, 12),
                "stream": stream,
            }
            try:
                async with asyncio.timeout(give_up_s):
                    reply = await client.post(url + "/v1/chat/completions", json=body)
                _judge(tally, reply.status_code, reply.text, stream)
            except TimeoutError:
                tally.outcomes["client gave up"] += 1
            except httpx.TimeoutException:
                tally.outcomes["timed out waiting"] += 1  # a SIGSTOPped backend (see module)
            except httpx.TransportError as exc:
                if chaos and tally.faults["rosterd killed"] and not tally.faults["rosterd back"]:
                    tally.outcomes["rosterd down (killed on purpose)"] += 1
                    await asyncio.sleep(0.2)
                else:
                    tally.lost.append(f"{type(exc).__name__}: {exc}")


def _check_status(status: dict[str, object], tally: Tally) -> None:
    nodes = status["nodes"]
    assert isinstance(nodes, dict)
    for name, node in nodes.items():
        if node["resident_bytes"] > node["capacity_bytes"]:
            tally.violations.append(f"{name}: {node['resident_bytes']} > budget")
        if {"a", "b"} <= set(node["resident"]):
            tally.violations.append(f"{name}: a and b resident together")
    tally.samples += 1


async def _sampler(url: str, tally: Tally, until: float) -> None:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        while time.monotonic() < until:
            with contextlib.suppress(httpx.HTTPError):
                _check_status((await client.get(url + "/status")).json(), tally)
            await asyncio.sleep(1.0)


async def _admin(url: str, rng: random.Random, tally: Tally, until: float) -> None:
    """``rosterd load`` / ``unload`` of a random role every few seconds, as an operator does."""
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(3, 8))
        action, role = rng.choice(("load", "unload")), rng.choice(ROLES)
        proc = await asyncio.create_subprocess_exec(
            *rosterd_argv(),
            action,
            role,
            "--url",
            url,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            code = await asyncio.wait_for(proc.wait(), timeout=60)
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
            tally.lost.append(f"rosterd {action} {role} hung")
        tally.admin[f"{action} exit {code}"] += 1


def _backend_pids(url: str) -> list[int]:
    status = httpx.get(url + "/status", timeout=10, trust_env=False).json()
    return [
        info["pid"]
        for node in status["nodes"].values()
        for info in node["roles"].values()
        if info["pid"] is not None
    ]


async def _traffic(
    url: str, seed: int, tally: Tally, run_s: float, *, clients: int = 6, chaos: bool = False
) -> None:
    rng = random.Random(seed)
    until = time.monotonic() + run_s
    jobs = [_client(url, random.Random(rng.random()), tally, until, chaos) for _ in range(clients)]
    jobs += [_sampler(url, tally, until), _admin(url, random.Random(rng.random()), tally, until)]
    await asyncio.gather(*jobs)


def _quiet_figures(up: Up) -> tuple[int, int]:
    """rosterd's RSS and fds with nothing in flight and no backend resident (each resident
    backend holds a few descriptors: its log, its pooled connections)."""
    for role in ROLES:
        reply = httpx.post(up.url + f"/rosterd/unload/{role}", timeout=60, trust_env=False)
        assert reply.status_code == 200, reply.text
    time.sleep(3.0)  # pooled upstream connections expire after 2 s
    return rss_and_fds(up.proc.pid)


def _owned_pids(up: Up) -> set[int]:
    return up.backend_pids() | {up.proc.pid}


def test_soak_loses_no_request_and_stays_flat(
    tmp_path: Path, llama_server_binary: Path, free_port: int, long_reliability: bool
) -> None:
    run_s = budget(long_reliability).soak_s
    up = start_up(_lab(tmp_path), tmp_path, free_port)
    tally = Tally()
    seen: set[int] = set()
    try:
        warm_s = max(30.0, run_s * 0.2)
        asyncio.run(_traffic(up.url, 14, tally, warm_s))
        seen |= _owned_pids(up)
        rss0, fds0 = _quiet_figures(up)
        asyncio.run(_traffic(up.url, 15, tally, run_s - warm_s))
        seen |= _owned_pids(up)
        rss1, fds1 = _quiet_figures(up)
    finally:
        up.stop()
    requests = sum(tally.outcomes.values()) + len(tally.lost)
    print_figures(
        "soak",
        {
            "run_s": run_s,
            "requests": requests,
            "lost": len(tally.lost),
            "outcomes": dict(tally.outcomes),
            "admin": dict(tally.admin),
            "status_samples": tally.samples,
            "violations": len(tally.violations),
            "rss_MiB_start_end": f"{rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f}",
            "fds_start_end": f"{fds0} -> {fds1}",
        },
    )
    assert not tally.lost, tally.lost[:10]
    assert not tally.violations, tally.violations[:10]
    assert tally.samples >= run_s / 3
    assert tally.outcomes["200"] > requests / 2
    assert rss1 <= rss0 * 1.10, (rss0, rss1)
    assert fds1 <= fds0 * 1.10 + 2, (fds0, fds1)
    assert not all_gone(seen)


async def _faults(url_box: list[str], rng: random.Random, tally: Tally, until: float) -> None:
    """Kill -9 or SIGSTOP (then SIGCONT after 1-4 s) a random backend every 4-10 s."""
    while time.monotonic() < until - 5:
        await asyncio.sleep(rng.uniform(4, 10))
        try:
            pids = _backend_pids(url_box[0])
        except httpx.HTTPError:
            continue
        if not pids:
            continue
        pid = rng.choice(sorted(pids))
        if rng.random() < 0.5:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                tally.faults["backend SIGKILL"] += 1
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                tally.faults["backend SIGSTOP/SIGCONT"] += 1
                await asyncio.sleep(rng.uniform(1, 4))
                os.kill(pid, signal.SIGCONT)


def test_chaos_every_request_ends_and_a_restarted_up_starts_clean(
    tmp_path: Path, llama_server_binary: Path, free_port: int, long_reliability: bool
) -> None:
    run_s = budget(long_reliability).chaos_s
    lab = _lab(tmp_path)
    up = start_up(lab, tmp_path, free_port)
    tally = Tally()
    url_box = [up.url]
    second: Up | None = None
    leftovers: set[int] = set()
    try:

        async def run_first_half() -> None:
            until = time.monotonic() + run_s / 2
            await asyncio.gather(
                _traffic(up.url, 21, tally, run_s / 2, chaos=True),
                _faults(url_box, random.Random(22), tally, until),
            )

        asyncio.run(run_first_half())
        httpx.post(up.url + "/rosterd/load/c", timeout=60, trust_env=False)
        leftovers = up.backend_pids()
        up.proc.send_signal(signal.SIGKILL)  # rosterd itself, mid-traffic
        up.proc.wait(timeout=30)
        tally.faults["rosterd killed"] += 1
        second = start_up(lab, tmp_path, free_port)
        tally.faults["rosterd back"] += 1
        url_box[0] = second.url

        async def run_second_half() -> None:
            until = time.monotonic() + run_s / 2
            await asyncio.gather(
                _traffic(second.url, 23, tally, run_s / 2, chaos=True),
                _faults(url_box, random.Random(24), tally, until),
            )

        assert not all_gone(leftovers - {up.proc.pid}), "the new up left the old backends"
        asyncio.run(run_second_half())
        # The roles come back: each one answers once the faults have stopped.
        for role in ROLES:
            reply = httpx.post(
                second.url + "/v1/chat/completions",
                json={"model": role, "messages": [{"role": "user", "content": "hi"}]},
                timeout=120,
                trust_env=False,
            )
            assert reply.status_code == 200, reply.text
        leftovers |= second.backend_pids()
    finally:
        if second is not None:
            second.stop()
        elif up.proc.poll() is None:
            up.stop()
    injected = sum(n for fault, n in tally.faults.items() if fault != "rosterd back")
    print_figures(
        "chaos",
        {
            "run_s": run_s,
            "faults_injected": dict(tally.faults),
            "faults_injected_total": injected,
            # Reached only when every request ended and every role came back.
            "faults_survived": injected,
            "requests": sum(tally.outcomes.values()) + len(tally.lost),
            "lost": len(tally.lost),
            "outcomes": dict(tally.outcomes),
            "status_samples": tally.samples,
            "violations": len(tally.violations),
        },
    )
    assert not tally.lost, tally.lost[:10]
    assert not tally.violations, tally.violations[:10]
    assert tally.faults["backend SIGKILL"] + tally.faults["backend SIGSTOP/SIGCONT"] >= 4
    assert not all_gone(leftovers)
