"""Plan time and quality for a big lab: 256 roles on 64 nodes, solver next to greedy.

Usage: ``python bench/plan_bench.py [--seed N] [--roles 256] [--nodes 64]
[--time-limit 1.5] [--interactive 0.2 0.4 0.6]``

One run per share of interactive roles (more interactive roles make the packing
harder). Prints, for :func:`rosterd.placement.plan` (CP-SAT with greedy fallback) and
:func:`rosterd.placement.greedy_plan`: wall time, roles placed (interactive
placed), batch bytes resident together, and the solver/greedy ratios. The target
is a plan in under 2 s on a 2-core machine; the exit status is 1 if a run missed it.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from rosterd.fleet import Fleet, Node, Platform
from rosterd.placement import Plan, greedy_plan, plan, score, violations
from rosterd.spec import InferenceSpec, InferFlavor, LatencyClass, MemorySpec
from rosterd.tokens import GB


def make_fleet(rng: random.Random, n_nodes: int) -> Fleet:
    """A mixed lab: Mac Studios, MacBooks, Linux boxes of typical sizes."""
    kinds = [
        (Platform.MACOS_ARM64, [64, 96, 128, 192]),
        (Platform.LINUX_X86_64, [32, 64, 128, 256]),
        (Platform.LINUX_ARM64, [16, 32, 64]),
    ]
    nodes = []
    for i in range(n_nodes):
        platform, sizes = rng.choice(kinds)
        memory = rng.choice(sizes) * GB
        nodes.append(
            Node(
                name=f"node{i:02d}",
                memory_bytes=memory,
                reserved_bytes=max(memory // 10, 2 * GB),
                platform=platform,
                flavors=platform.supported_flavors(),
            )
        )
    return Fleet(nodes=tuple(nodes))


def make_specs(
    rng: random.Random, n_roles: int, interactive_share: float = 0.2
) -> list[InferenceSpec]:
    """Roles of typical sizes (0.5-120 GiB), ``interactive_share`` of them interactive,
    a tenth excluding an earlier role."""
    sizes = [0.5, 1, 2, 4, 5, 8, 9, 16, 20, 35, 40, 48, 70, 120]
    specs = []
    for i in range(n_roles):
        excludes: tuple[str, ...] = ()
        if i and rng.random() < 0.1:
            excludes = (f"role{rng.randrange(i):03d}",)
        specs.append(
            InferenceSpec(
                role=f"role{i:03d}",
                flavor=rng.choice(list(InferFlavor)),
                memory=MemorySpec(weights_bytes=int(rng.choice(sizes) * GB)),
                sticky=rng.random() < 0.7,
                latency_class=(
                    LatencyClass.INTERACTIVE
                    if rng.random() < interactive_share
                    else LatencyClass.BATCH
                ),
                excludes=excludes,
            )
        )
    return specs


def run_case(
    seed: int, n_roles: int, n_nodes: int, interactive_share: float, time_limit: float
) -> bool:
    """Plan one random lab with the solver and with greedy; print the table. True when
    the plan took under 2 s."""
    rng = random.Random(seed)
    fleet = make_fleet(rng, n_nodes)
    specs = make_specs(rng, n_roles, interactive_share)

    def timed(fn: Callable[[], Plan]) -> tuple[Plan, float]:
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start

    solved, t_solver = timed(lambda: plan(specs, fleet, time_limit_s=time_limit))
    greedy, t_greedy = timed(lambda: greedy_plan(specs, fleet))
    for name, result in (("solver", solved), ("greedy", greedy)):
        bad = violations(specs, fleet, result)
        if bad:
            raise SystemExit(f"{name} plan breaks constraints: {bad[:3]}")
    s, g = score(specs, fleet, solved), score(specs, fleet, greedy)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}" if b else "n/a"

    print(
        f"{n_roles} roles ({interactive_share:.0%} interactive) on {n_nodes} nodes, "
        f"seed {seed}; plan by {solved.solver}"
    )
    print(f"{'':24}{'solver':>14}{'greedy':>14}{'ratio':>10}")
    rows = [
        ("time (s)", t_solver, t_greedy),
        ("roles placed", s.placed, g.placed),
        ("interactive placed", s.interactive_placed, g.interactive_placed),
        ("resident batch (GiB)", s.resident_batch_bytes / GB, g.resident_batch_bytes / GB),
        ("min free (permille)", s.min_free_permille, g.min_free_permille),
    ]
    for label, a, b in rows:
        print(f"{label:24}{a:>14.3f}{b:>14.3f}{ratio(a, b):>10}")
    verdict = "OK" if t_solver < 2.0 else "SLOW"
    print(f"target: plan under 2 s -> {verdict} ({t_solver:.2f} s)\n")
    return t_solver < 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--roles", type=int, default=256)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=1.5)
    parser.add_argument(
        "--interactive",
        type=float,
        nargs="+",
        default=[0.2, 0.4, 0.6],
        help="shares of interactive roles (0-1), one run each",
    )
    args = parser.parse_args()
    fast = [
        run_case(args.seed, args.roles, args.nodes, share, args.time_limit)
        for share in args.interactive
    ]
    raise SystemExit(0 if all(fast) else 1)


if __name__ == "__main__":
    main()
