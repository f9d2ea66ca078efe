"""The node loop's stand-ins: ``GatedBackends`` (starts that finish when the test opens their
gate), a clock that moves when the test says, and a started ``NodeScheduler`` over them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import support.specs as spec_helpers
from rosterd.backends.values import Endpoint
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec
from support.backends import NoLiveness

MIB = 2**20


LIMITS = SchedulerLimits(
    idle_ttl_s=float("inf"), min_busy_residency_s=0.0, drain_s=0.3, tick_s=0.01
)


def spec(role: str, mib: int, **options: object) -> InferenceSpec:
    return spec_helpers.spec(role, mib, unit=MIB, model=role, **options)  # type: ignore[arg-type]


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def move_to_soon(self, now: float) -> None:
        """Move to ``now`` once the tasks already scheduled took their first step."""
        asyncio.get_running_loop().call_soon(setattr, self, "now", now)


class GatedBackends(NoLiveness):
    """Starts that finish when the test opens the role's gate (all open unless ``gated``)."""

    def __init__(self, gated: Sequence[str] = ()) -> None:
        self.gates = {role: asyncio.Event() for role in gated}
        self.starting: dict[str, asyncio.Event] = {}
        self.starts: list[str] = []
        self.stops: list[str] = []
        self.aborted: set[str] = set()

    def started(self, role: str) -> asyncio.Event:
        return self.starting.setdefault(role, asyncio.Event())

    async def start(self, role: str) -> Endpoint:
        self.starts.append(role)
        self.started(role).set()
        gate = self.gates.get(role)
        if gate is not None:
            await gate.wait()
        if role in self.aborted:
            self.aborted.discard(role)
            raise RuntimeError(f"{role} was stopped before it was ready")
        return Endpoint(f"http://127.0.0.1:1/{role}", role, None)

    async def stop(self, role: str) -> None:
        self.stops.append(role)
        gate = self.gates.get(role)
        if gate is not None and not gate.is_set():
            self.aborted.add(role)
            gate.set()  # a stop makes a start under way fail promptly


def make_node(
    specs: list[InferenceSpec],
    capacity_mib: int = 1000,
    backends: object | None = None,
    **options: object,
) -> tuple[NodeScheduler, GatedBackends]:
    fake = backends if backends is not None else GatedBackends()
    by_role = {s.role: s for s in specs}
    options.setdefault("limits", LIMITS)
    node = NodeScheduler("n1", capacity_mib * MIB, by_role, fake, **options)  # type: ignore[arg-type]
    node.start()
    return node, fake  # type: ignore[return-value]


async def use(node: NodeScheduler, role: str) -> str:
    lease = await node.acquire(role)
    try:
        return lease.endpoint.served_model
    finally:
        node.release(lease)
