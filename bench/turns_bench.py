"""Two roles that cannot be resident together, both under steady load: swaps and waits.

    .venv/bin/python bench/turns_bench.py [--seconds S] [--clients N] [--max-tokens T]

It writes two tiny random GGUFs and, for each policy below in turn, starts
``rosterd up`` on a one-node fleet whose budget holds one of the two roles at a
time, then runs ``--clients`` closed-loop clients per role (each sends its next
short completion as soon as the last one answered) for ``--seconds``:

- **turns**: the default flags (``--max-wait 30``, ``--min-busy-residency 10``);
- **min-busy-residency only**: no turns (``--max-wait 0.001``), the hold of a
  just-loaded busy role still on;
- **plain FIFO**: neither (``--max-wait 0.001 --min-busy-residency 0``): a busy
  role drains for the oldest request of the other at once.

It prints per policy the swaps per minute (evictions counted by
``rosterd_evictions_total``), the requests answered, and the p50, p95 and max of
the time each request took as its client saw it (its wait for a turn, a swap,
and its one short generation). Everything it starts is stopped by its own handle.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from swap_bench import start_rosterd, write_tiny_gguf

ROLES = ("turn-x", "turn-y")
POLICIES: tuple[tuple[str, list[str]], ...] = (
    ("turns (default flags)", []),
    ("min-busy-residency only", ["--max-wait", "0.001"]),
    ("plain FIFO", ["--max-wait", "0.001", "--min-busy-residency", "0"]),
)


def evictions(client: httpx.Client, url: str) -> float:
    """The sum of ``rosterd_evictions_total`` over its labels."""
    text = client.get(url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rosterd_evictions_total{")
    )


def run_policy(
    work: Path, name: str, flags: list[str], args: argparse.Namespace
) -> tuple[float, list[float], int]:
    """Run the load against ``rosterd up`` with ``flags``; (swaps per minute, each
    answered request's seconds, requests that failed)."""
    folder = name.split(" ")[0].replace("-", "_")
    proc, url = start_rosterd(work, folder, ROLES, 0.6, flags)
    took: list[float] = []
    failed = [0]
    lock = threading.Lock()
    try:
        with httpx.Client(timeout=300, trust_env=False) as client:
            for role in ROLES:  # both loaded once before the clock starts
                client.post(url + "/v1/completions", json={"model": role, "prompt": "Hi"})
            before = evictions(client, url)
            end = time.monotonic() + args.seconds

            def loop(role: str) -> None:
                body = {"model": role, "prompt": "Hi", "max_tokens": args.max_tokens}
                with httpx.Client(timeout=300, trust_env=False) as own:
                    while time.monotonic() < end:
                        began = time.perf_counter()
                        response = own.post(url + "/v1/completions", json=body)
                        with lock:
                            if response.status_code == 200:
                                took.append(time.perf_counter() - began)
                            else:
                                failed[0] += 1

            threads = [
                threading.Thread(target=loop, args=(role,))
                for role in ROLES
                for _ in range(args.clients)
            ]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            minutes = (time.monotonic() - began) / 60
            swaps = evictions(client, url) - before
    finally:
        proc.send_signal(2)  # SIGINT: rosterd stops its backends and exits
        proc.wait(60)
    return swaps / minutes, took, failed[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="load per policy")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop clients per role")
    parser.add_argument("--max-tokens", type=int, default=4, help="tokens per request")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rosterd-turns-bench-") as tmp:
        work = Path(tmp)
        (work / "models").mkdir()
        for seed, role in enumerate(ROLES):
            write_tiny_gguf(work / "models" / f"{role}.gguf", seed + 21)
        for name, flags in POLICIES:
            per_min, took, failed = run_policy(work, name, flags, args)
            ms = sorted(t * 1000 for t in took)
            p95 = ms[int(0.95 * (len(ms) - 1))]
            rows.append((name, per_min, len(ms), statistics.median(ms), p95, ms[-1], failed))
            print(f"  {name}: done", flush=True)
    print(
        f"{args.clients} clients per role, {args.max_tokens} tokens a request, "
        f"{args.seconds:g} s per policy:"
    )
    print("| policy | swaps/min | answered | p50 ms | p95 ms | max ms | failed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, per_min, n, p50, p95, top, failed in rows:
        print(f"| {name} | {per_min:.1f} | {n} | {p50:.0f} | {p95:.0f} | {top:.0f} | {failed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
