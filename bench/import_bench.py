"""Import rate of a 256-entry roster, next to plain ``yaml.safe_load`` of the same file.

Run: ``.venv/bin/python bench/import_bench.py [--seconds S]``. Both sides use
the same libyaml (PyYAML's C loader when available), so the ratio shows what
rosterd's own reading (serde_yaml's rules, validation, located errors) costs
on top of parsing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import yaml

from rosterd.roster.entries import MAX_ENTRIES
from rosterd.roster.importer import import_roster

SAFE_LOADER = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


def make_roster(entries: int = MAX_ENTRIES) -> bytes:
    """A realistic roster of ``entries`` entries (mixed backends, ``~`` sizes, extra keys)."""
    backends = ["mlx_lm", "llama.cpp (llama-server)", "ollama", "mlx-vlm", "mlx-audio"]
    lines = ["# benchmark roster", "roster:"]
    for i in range(entries):
        lines += [
            f"  - id: role-{i}",
            f"    role: {'voice assistant' if i % 7 == 0 else 'chat and planning'}",
            f"    name: Model-{i % 40}-Instruct",
            f"    repo: org/model-{i}-4bit",
            f"    ram_gb: {'~' if i % 3 == 0 else ''}{(i % 50) + 0.5}",
            f"    backend: {backends[i % len(backends)]}",
            f"    port: {8000 + i}",
            "    status: live",
            f"    notes: entry {i} of the benchmark",
            "    ctx: 32768",
        ]
    return ("\n".join(lines) + "\n").encode()


def rate(action: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``action`` over about ``seconds`` (after one warm-up call)."""
    action()
    calls = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        action()
        calls += 1
        elapsed = time.perf_counter() - started
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per side (s)")
    args = parser.parse_args()
    data = make_roster()
    text = data.decode()
    result = import_roster(data)
    assert len(result.specs) + len(result.skipped) == MAX_ENTRIES
    ours = rate(lambda: import_roster(data), args.seconds)
    plain = rate(lambda: yaml.load(text, Loader=SAFE_LOADER), args.seconds)
    print(f"roster: {MAX_ENTRIES} entries, {len(data)} bytes, loader {SAFE_LOADER.__name__}")
    print(f"rosterd import_roster : {ours:8.1f} imports/s ({1000 / ours:6.2f} ms each)")
    print(f"yaml safe load        : {plain:8.1f} loads/s   ({1000 / plain:6.2f} ms each)")
    print(f"ratio: import_roster takes {plain / ours:.2f}x the time of safe_load")


if __name__ == "__main__":
    main()
