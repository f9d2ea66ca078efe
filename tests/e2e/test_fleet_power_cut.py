"""A power cut on the second host: every process there SIGKILLed at once, no request lost.

Two hosts made of network namespaces (``netns_lab``): the Ray head and ``rosterd up``
on the first, a Ray worker on the second serving one role. While a client on the
first host keeps two requests in flight for that role, every process of the second
host is sent SIGKILL in one sweep, in no order (its raylet, its node agent, the
llama-server): what a power cut leaves. The requests whose backend vanished wait for
Ray's verdict on the node (it is lost) and are then served from the first host; none
fails, and none is taken for a backend crash restarted through the gone agent. The
time from the kill to the first request served on the first host is printed.
Skipped, with the reason, where ``ip netns`` does not work or Ray is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.netns_lab import FIRST_IP, Lab, env, ip, lab, running_fleet, write_lab
from support.polling import eventually_sync
from support.ray_nodes import needs_ray
from support.up import rosterd_argv

__all__ = ["lab"]  # the fixture, used by name

#: Keeps ``concurrency`` completions of ``role`` in flight until the file ``stop`` exists;
#: one JSON line per request: {"sent", "done" (epoch s), "status", "body"}.
LOADER = """
import json, os, sys, threading, time, httpx
url, role, out, stop, concurrency = sys.argv[1:6]
lock = threading.Lock()
def worker():
    with httpx.Client(timeout=300, trust_env=False) as client, open(out, "a") as sink:
        while not os.path.exists(stop):
            sent = time.time()
            try:
                r = client.post(url + "/v1/completions",
                                json={"model": role, "prompt": "Hi", "max_tokens": 8})
                status, body = r.status_code, r.text[:300]
            except httpx.HTTPError as exc:
                status, body = 0, repr(exc)
            line = {"sent": sent, "done": time.time(), "status": status, "body": body}
            with lock:
                sink.write(json.dumps(line) + "\\n")
                sink.flush()
threads = [threading.Thread(target=worker) for _ in range(int(concurrency))]
for t in threads: t.start()
for t in threads: t.join()
"""


def _answers(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _power_cut(lab: Lab, ns: str, *, unplug: bool) -> int:
    """SIGKILL every process of namespace ``ns`` in one sweep (and what it forked meanwhile),
    until none is left; how many were killed. ``unplug``: first take the second host's
    link down, so that no RST or FIN of its dying sockets reaches the first host (what a
    power cut is on a real network: its connections are left open, unanswered)."""
    if unplug:
        done = ip("-n", ns, "link", "set", lab.second_link, "down")
        assert done.returncode == 0, done.stderr
    killed: set[int] = set()
    deadline = time.monotonic() + 30
    while (pids := lab.pids(ns)) and time.monotonic() < deadline:
        for pid in pids - killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.05)
    assert not lab.pids(ns), "processes survived the power cut"
    return len(killed)


@pytest.mark.slow
@needs_ray
@pytest.mark.parametrize("unplug", [False, True], ids=["killed", "killed-unplugged"])
def test_a_power_cut_on_the_second_host_loses_no_request(
    lab: Lab, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path, unplug: bool
) -> None:
    files = write_lab(tmp_path, tiny_gguf)
    with running_fleet(lab, tmp_path, files, rosterd_argv(), "--queue-timeout", "120") as fleet:
        url = fleet.url
        status = lab.http("GET", f"{url}/status")["body"]
        role = next(iter(status["nodes"]["far"]["roles"]))  # the role planned on the second host
        warm = lab.http(
            "POST", f"{url}/v1/completions", {"model": role, "prompt": "Hi", "max_tokens": 4}
        )
        assert warm["status"] == 200, warm
        answers, stop = tmp_path / "answers.jsonl", tmp_path / "stop"
        loader = lab.run_in(
            lab.first,
            [sys.executable, "-c", LOADER, url, role, str(answers), str(stop), "2"],
            env=env(),
            stdout=subprocess.DEVNULL,
        )
        try:
            eventually_sync(
                lambda: len(_answers(answers)) >= 6,
                what="requests served from the second host",
                timeout_s=60,
                interval_s=0.5,
            )
            killed = _power_cut(lab, lab.second, unplug=unplug)
            # From the end of the sweep (milliseconds long): nothing sent after it can have
            # been served by the second host.
            killed_at = time.time()

            def served_after_the_cut() -> bool:
                assert fleet.up.poll() is None, fleet.said()
                return any(
                    a["status"] == 200 and float(str(a["sent"])) >= killed_at
                    for a in _answers(answers)
                )

            eventually_sync(
                served_after_the_cut,
                what="a request sent after the cut to be served",
                timeout_s=150,
                interval_s=0.5,
            )
            time.sleep(3)  # and a few more after it
        finally:
            stop.touch()
            loader.wait(timeout=330)
        got = _answers(answers)
        failed = [a for a in got if a["status"] != 200]
        assert not failed, failed
        after = [a for a in got if float(str(a["sent"])) >= killed_at]
        during = [a for a in got if float(str(a["sent"])) < killed_at < float(str(a["done"])) - 0.5]
        first_served_s = min(float(str(a["done"])) for a in after) - killed_at
        events = lab.http("GET", f"{url}/rosterd/events")["body"]["events"]
        lost_s = min(e["at"] for e in events if e["kind"] == "lost") - killed_at
        print(
            f"\npower cut ({'link down, then ' if unplug else ''}SIGKILL): "
            f"{killed} processes of the second host SIGKILLed; {len(got)} requests, "
            f"{len(during)} waiting across the cut, {len(after)} sent after it, 0 failed; "
            f"node lost (Ray's verdict) {lost_s:.1f} s after the kill, first request served "
            f"on the first host {first_served_s:.1f} s after it"
        )
        status = lab.http("GET", f"{url}/status")["body"]
        assert status["nodes"]["far"]["connected"] is False, status
        near = status["nodes"]["near"]["roles"]
        assert near[role]["phase"] == "ready", status
        assert near[role]["base_url"].startswith(f"http://{FIRST_IP}:"), status
        kinds = {e["kind"] for e in events if e["role"] == role}
        # The sweep kills in no order: the agent may see its llama-server die and report
        # it (`crashed` on far) in the instant before its own SIGKILL lands. What must not
        # happen is a restart through the gone agent, a probe's verdict, or a crash on near.
        assert not kinds & {"restart_failed", "unhealthy"}, events
        assert not [e for e in events if e["kind"] == "crashed" and e["node"] != "far"], events
        assert {"lost", "moved"} <= kinds, events
        said = " ".join(fleet.said().split())
        assert "could not be restarted" not in said, said
        assert f"role {role}: moved to node near: node far is lost" in said, said
