"""Usage per key and role, kept: the store (hourly buckets in SQLite, WAL, written in
batches off the event loop), ``GET /rosterd/usage`` and ``rosterd usage`` against what the
backend reported in each answer, Prometheus counters by key name, and the counts after a
kill -9 of ``rosterd up`` and a restart (real llama-server roles)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from rosterd.keys import ApiKey, Scope, key_digest, render_keys
from rosterd.usage import UsageStore, parse_since
from support.backends import pick_free_port
from support.keys_lab import KEYS, MASTER, lab
from support.up import (
    MODELS,
    all_gone,
    llama_entry,
    prepare_example_models,
    rosterd_argv,
    start_up,
    write_box_fleet,
    write_roster,
)

FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens")


def test_the_store_sums_hourly_buckets_and_survives_a_reopen(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    store = UsageStore(tmp_path, flush_interval_s=3600, clock=lambda: now[0])
    store.open()
    store.record(
        "a",
        "chat",
        error=False,
        prompt_tokens=3,
        completion_tokens=2,
        queue_wait_s=0.5,
        served_s=1.0,
    )
    store.record(
        "a",
        "chat",
        error=True,
        prompt_tokens=0,
        completion_tokens=0,
        queue_wait_s=0.0,
        served_s=0.25,
    )
    now[0] += 3600  # the next hour's bucket
    store.record(
        "b",
        "chat",
        error=False,
        prompt_tokens=7,
        completion_tokens=1,
        queue_wait_s=0.0,
        served_s=2.0,
    )
    # Counted but not yet written: read all the same.
    assert store.totals(0, ["key"]) == [
        {
            "key": "a",
            "requests": 2,
            "errors": 1,
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "queue_wait_s": 0.5,
            "served_s": 1.25,
        },
        {
            "key": "b",
            "requests": 1,
            "errors": 0,
            "prompt_tokens": 7,
            "completion_tokens": 1,
            "queue_wait_s": 0.0,
            "served_s": 2.0,
        },
    ]
    assert store.totals(now[0], ["key"]) == [store.totals(0, ["key"])[1]]  # this hour only
    store.close()
    with sqlite3.connect(tmp_path / "usage.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        hours = [h for (h,) in db.execute("SELECT hour FROM usage ORDER BY hour")]
        assert hours == [1_699_999_200, 1_700_002_800]  # the hours' starts
        names = {k for (k,) in db.execute("SELECT key FROM usage")}
        assert names == {"a", "b"}
    again = UsageStore(tmp_path)
    again.open()
    assert again.totals(0, []) == [
        {
            "requests": 3,
            "errors": 1,
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "queue_wait_s": 0.5,
            "served_s": 3.25,
        }
    ]
    again.close()


def test_since_takes_a_duration() -> None:
    assert parse_since("7d") == 7 * 86400
    assert parse_since("90m") == 5400
    assert parse_since("1.5h") == 5400
    with pytest.raises(ValueError, match="not a duration"):
        parse_since("last week")


async def test_usage_per_key_equals_what_the_backend_reported(tmp_path: Path) -> None:
    store = UsageStore(tmp_path / "state")
    try:
        async with (
            lab(tmp_path, usage=store) as up,
            httpx.AsyncClient(base_url=up.url, timeout=30) as client,
        ):
            reported: Counter[tuple[str, str, str]] = Counter()
            for name, token in (("user", KEYS["user"][0]), ("--api-key", MASTER)):
                for role in ("chat", "secret") if name == "--api-key" else ("chat",):
                    for _ in range(3):
                        body = {"model": role, "messages": [{"role": "user", "content": "hi"}]}
                        r = await client.post(
                            "/v1/chat/completions",
                            json=body,
                            headers={"Authorization": f"Bearer {token}"},
                        )
                        assert r.status_code == 200
                        for kind in ("prompt_tokens", "completion_tokens"):
                            reported[(name, role, kind)] += r.json()["usage"][kind]
                        reported[(name, role, "requests")] += 1
            watcher = {"Authorization": f"Bearer {KEYS['watcher'][0]}"}
            answer = await client.get("/rosterd/usage", params={"since": "1h"}, headers=watcher)
            assert answer.status_code == 200, answer.text
            rows = answer.json()["rows"]
            got = Counter(
                {
                    (row["key"], row["role"], kind): row[kind]
                    for row in rows
                    for kind in ("requests", "prompt_tokens", "completion_tokens")
                }
            )
            assert +got == +reported
            assert all(row["errors"] == 0 for row in rows)
            by_key = (await client.get("/rosterd/usage?by=key", headers=watcher)).json()["rows"]
            assert [(r["key"], r["requests"]) for r in by_key] == [("--api-key", 6), ("user", 3)]
            user = {"Authorization": f"Bearer {KEYS['user'][0]}"}
            assert (await client.get("/rosterd/usage", headers=user)).status_code == 403
            bad = await client.get("/rosterd/usage?since=yesterday", headers=watcher)
            assert bad.status_code == 400
            metrics = (await client.get("/metrics", headers=watcher)).text
            assert 'rosterd_key_requests_total{code="200",key="user",role="chat"} 3.0' in metrics
            assert 'rosterd_key_tokens_total{key="user",kind="prompt",role="chat"} 9.0' in metrics
            for token, _, _ in KEYS.values():
                assert token not in metrics
            done = await asyncio.to_thread(
                subprocess.run,
                [
                    *rosterd_argv(),
                    "usage",
                    "--json",
                    "--url",
                    up.url,
                    "--api-key",
                    KEYS["watcher"][0],
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["rows"] == rows
            table = await asyncio.to_thread(
                subprocess.run,
                [
                    *rosterd_argv(),
                    "usage",
                    "--csv",
                    "--by",
                    "role",
                    "--url",
                    up.url,
                    "--api-key",
                    MASTER,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert table.returncode == 0, table.stderr
            lines = table.stdout.splitlines()
            assert (
                lines[0]
                == "role,requests,errors,prompt_tokens,completion_tokens,queue_wait_s,served_s"
            )
            assert lines[1].startswith("chat,6,0,18,12,")
    finally:
        store.close()


def _usage(url: str, token: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [*rosterd_argv(), "usage", "--json", "--url", url, "--api-key", token],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)["rows"]
    return rows


def test_usage_through_real_llama_servers_survives_kill_9(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    """Two keys, two real llama-server roles; ``rosterd usage --json`` equals the usage in
    the answers, token for token; after a kill -9 of ``up`` (one flush interval, 1 s, after
    the last answer) and a restart on the same state folder, every count is still there.
    What a kill -9 may lose is at most the requests that ended in the last second."""
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("tiny-a", "tiny-a", 0.1, 18761), llama_entry("tiny-b", "tiny-b", 0.1, 18762)],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf")},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf")},
        },
    )
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        render_keys(
            (
                ApiKey("alice", key_digest("rk-alice")),
                ApiKey("bench", key_digest("rk-bench"), models=("tiny-b",)),
                ApiKey("ops", key_digest("rk-ops"), frozenset({Scope.WATCH})),
            )
        )
    )
    args = [str(roster), "--fleet", str(fleet), "--keys", str(keys), "--no-warm-up"]
    port = pick_free_port()
    up = start_up(args, tmp_path, port)
    reported: Counter[tuple[str, str, str]] = Counter()
    try:
        with httpx.Client(base_url=up.url, timeout=120, trust_env=False) as client:
            for name, token, role in (
                ("alice", "rk-alice", "tiny-a"),
                ("alice", "rk-alice", "tiny-b"),
                ("bench", "rk-bench", "tiny-b"),
                ("alice", "rk-alice", "tiny-a"),
            ):
                for stream in (False, True):
                    body: dict[str, Any] = {
                        "model": role,
                        "max_tokens": 5,
                        "stream": stream,
                        "messages": [{"role": "user", "content": f"count for {name}"}],
                    }
                    if stream:
                        body["stream_options"] = {"include_usage": True}
                    r = client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    assert r.status_code == 200, r.text
                    if stream:
                        events = [
                            json.loads(line[6:])
                            for line in r.text.splitlines()
                            if line.startswith("data: {")
                        ]
                        usage = [e["usage"] for e in events if e.get("usage")][-1]
                    else:
                        usage = r.json()["usage"]
                    reported[(name, role, "prompt_tokens")] += usage["prompt_tokens"]
                    reported[(name, role, "completion_tokens")] += usage["completion_tokens"]
                    reported[(name, role, "requests")] += 1
        assert reported[("alice", "tiny-a", "completion_tokens")] > 0

        def counted(rows: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
            return Counter(
                {
                    (r["key"], r["role"], f): r[f]
                    for r in rows
                    for f in ("requests", "prompt_tokens", "completion_tokens")
                }
            )

        before = _usage(up.url, "rk-ops")
        assert +counted(before) == +reported
        time.sleep(1.5)  # one flush interval (1 s) and a margin: the counts are written
        pids = {p.pid for p in psutil.Process(up.proc.pid).children(recursive=True)}
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait(timeout=30)
    finally:
        if up.proc.poll() is None:
            up.stop()
    again = start_up(args, tmp_path, port)
    try:
        after = _usage(again.url, "rk-ops")
        assert after == before  # nothing lost: the last write came after the last answer
    finally:
        assert again.stop(signal.SIGINT) == 0
    assert not all_gone(pids)
