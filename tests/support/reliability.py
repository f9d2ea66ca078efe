"""Helpers for the reliability suite (no tests here): how long each part runs (CI's bounded
run or the long one), the fast stand-in backend as ``rosterd up`` launches it, rosterd's
RSS and open file descriptors, and the figures each test prints.

The long versions run with ``pytest --long-reliability`` (tests/conftest.py), or with
``ROSTERD_SOAK_S`` / ``ROSTERD_CHAOS_S`` / ``ROSTERD_FUZZ_INPUTS`` set to override
one part's size.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from rosterd.error_table import ERROR_KINDS
from support.backends import pick_free_port
from support.up import Up, llama_entry, start_up, write_roster

HERE = Path(__file__).resolve().parent
FAKE_LLAMA_SERVER = HERE / "fake_llama_server.py"


@dataclass(frozen=True)
class Budget:
    """How much one reliability run does: seconds of soak and chaos, fuzz inputs per target."""

    soak_s: float
    chaos_s: float
    fuzz_inputs: int
    idle_connections: int


def budget(long: bool) -> Budget:
    """CI's bounded sizes, or the long ones (``--long-reliability``); env overrides either."""
    base = Budget(soak_s=1800.0, chaos_s=900.0, fuzz_inputs=1_000_000, idle_connections=5000)
    if not long:
        base = Budget(soak_s=90.0, chaos_s=80.0, fuzz_inputs=30_000, idle_connections=5000)
    env = os.environ
    return Budget(
        soak_s=float(env.get("ROSTERD_SOAK_S", base.soak_s)),
        chaos_s=float(env.get("ROSTERD_CHAOS_S", base.chaos_s)),
        fuzz_inputs=int(env.get("ROSTERD_FUZZ_INPUTS", base.fuzz_inputs)),
        idle_connections=base.idle_connections,
    )


def fake_llama_server_wrapper(folder: Path) -> Path:
    """An executable that runs the fast stand-in (``ROSTERD_LLAMA_SERVER`` wants one file)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "llama-server"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_LLAMA_SERVER}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def raise_nofile(wanted: int) -> int:
    """Raise this process's RLIMIT_NOFILE to at least ``wanted`` (the hard limit too, where
    allowed: importing mlx lowers both to 4,096 in the test process); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):  # raising the hard limit needs root
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_and_fds(pid: int) -> tuple[int, int]:
    """The process's own RSS (bytes, without its children) and its open file descriptors."""
    proc = psutil.Process(pid)
    return int(proc.memory_info().rss), int(proc.num_fds())


def documented_error(body: str) -> str | None:
    """The error code of an OpenAI-shaped error body whose code is in ``ERROR_KINDS``, or
    ``None`` when ``body`` is not one (an SSE error event's ``data:`` line counts)."""
    text = body.strip()
    if text.startswith("data: "):
        text = text[len("data: ") :]
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        return None
    err = data["error"]
    if not isinstance(err.get("message"), str) or not isinstance(err.get("type"), str):
        return None
    code = err.get("code")
    return code if isinstance(code, str) and code in ERROR_KINDS else None


def print_figures(title: str, figures: dict[str, object]) -> None:
    """Print one test's figures (``pytest -s`` shows them; ``-rA`` keeps them in the summary)."""
    line = ", ".join(f"{k}={v}" for k, v in figures.items())
    print(f"\nRELIABILITY {title}: {line}", flush=True)


def start_fake_up(
    tmp: Path, gguf: Path, *, extra: list[str] | None = None, nofile_soft: int | None = None
) -> Up:
    """``rosterd up`` over one role ``chat`` served by the fast stand-in, made resident;
    started with a soft open-files limit of ``nofile_soft`` when given (it inherits it)."""
    wrapper = fake_llama_server_wrapper(tmp / "bin")
    roster = write_roster(tmp / "roster.yaml", [llama_entry("chat", "fake-a", 0.1, 18640)])
    fleet = tmp / "fleet.yaml"
    # The stand-in generates any number of answers at once, so the node-wide limit (by
    # default the roles' slots) is lifted as an operator would for such a backend.
    node = {
        "name": "box",
        "memory_gb": 4,
        "reserved_gb": 1,
        "platform": "linux-x86_64",
        "max_concurrency": 100_000,
    }
    # Its slots too: rosterd sends a llama.cpp role no more requests than its slots.
    models = {"fake-a": {"path": str(gguf), "parallel": 2048}}
    fleet.write_text(
        json.dumps({"nodes": [node], "models": models, "model_roots": [str(gguf.parent)]})
    )
    os.environ["ROSTERD_LLAMA_SERVER"] = str(wrapper)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if nofile_soft is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(nofile_soft, hard), hard))
    try:
        up = start_up([str(roster), "--fleet", str(fleet), *(extra or [])], tmp, pick_free_port())
    finally:
        del os.environ["ROSTERD_LLAMA_SERVER"]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    reply = httpx.post(up.url + "/rosterd/load/chat", timeout=60, trust_env=False)
    assert reply.status_code == 200, reply.text
    return up
