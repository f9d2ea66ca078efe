"""A bench for the fleet machine's tests: it plays every effect's part synchronously, with
no process, no Ray and no clock, and records what the machine asked for.

``Solve`` is answered by the greedy planner (the solver's own fallback: the same rules,
in milliseconds), ``StartAgents`` and ``Teach`` succeed unless a node is named in
``failing_agents`` / ``failing_nodes``, and ``ApplyPlan`` answers what
``NodeDirectory.apply_plan`` would say of it (roles added, retired, moved).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from rosterd.fleet import Fleet, Node, Platform
from rosterd.fleet_scheduler.effects import (
    Answer,
    ApplyPlan,
    FleetEffect,
    Solve,
    StartAgents,
    Teach,
)
from rosterd.fleet_scheduler.events import (
    AgentsStarted,
    ClusterSeen,
    FleetEvent,
    NodeLost,
    PlanApplied,
    PlanSolved,
    Reload,
    Taught,
)
from rosterd.fleet_scheduler.machine import FleetMachine
from rosterd.fleet_scheduler.values import Connection, NodeRun, ServedConfig
from rosterd.placement import greedy_plan
from rosterd.ray_match import RayNode
from rosterd.roster import ImportedRoster, ImportedSpec
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.tokens import GB

E = TypeVar("E")


@dataclass(frozen=True)
class FlatMemory:
    """Memory figures that are each spec's own (``MemoryFigures`` for tests)."""

    notes: tuple[str, ...] = ()
    said: tuple[str, ...] = ()

    def planning_specs(self, specs: Iterable[InferenceSpec]) -> list[InferenceSpec]:
        return list(specs)

    def node_specs(self, specs: Mapping[str, InferenceSpec], node: str) -> dict[str, InferenceSpec]:
        return dict(specs)

    def reason_notes(self) -> dict[str, str]:
        return {}

    def slots(self) -> dict[str, int]:
        return {}

    def warnings(self) -> list[str]:
        return list(self.said)

    def role_json(self, role: str, node: str | None) -> dict[str, object] | None:
        return None

    def fingerprints(self) -> dict[str, str]:
        return {}


def node(name: str, capacity_gb: float, address: str = "") -> Node:
    """A Linux node whose capacity is ``capacity_gb`` GiB, at ``address`` (default 10.0.0.x)."""
    return Node(
        name=name,
        memory_bytes=int(capacity_gb * GB) + GB,
        reserved_bytes=GB,
        platform=Platform.LINUX_X86_64,
        flavors=frozenset({InferFlavor.LLAMACPP}),
        address=address or f"10.0.0.{sum(map(ord, name)) % 200 + 10}",
    )


def config(
    specs: Sequence[InferenceSpec],
    nodes: Sequence[Node],
    *,
    warnings: Sequence[str] = (),
    unavailable: Mapping[str, str] | None = None,
    launch: Mapping[str, str] | None = None,
) -> ServedConfig:
    """A served configuration of ``specs`` on ``nodes`` (no ports, flat memory figures)."""
    roster = ImportedRoster(
        specs=tuple(ImportedSpec(s, "", "live", s.role, i + 1) for i, s in enumerate(specs)),
        warnings=tuple(warnings),
    )
    return ServedConfig(
        roster,
        Fleet(nodes=tuple(nodes)),
        FlatMemory(),
        launch=dict(launch or {}),
        unavailable_here=dict(unavailable or {}),
    )


def ray_id(name: str) -> str:
    """The Ray node id the bench gives fleet node ``name``."""
    return (name.encode().hex() * 8)[:28]


def on_ray(cfg: ServedConfig, *, absent: Iterable[str] = ()) -> dict[str, Connection]:
    """Every node of ``cfg`` on its own live Ray node, but those ``absent``."""
    out: dict[str, Connection] = {}
    for n in cfg.fleet.nodes:
        if n.name in set(absent):
            out[n.name] = Connection(n.name, n.address, NodeRun.ABSENT, "no live Ray node there")
        else:
            reason = f"Ray node {ray_id(n.name)[:12]} at {n.address}"
            out[n.name] = Connection(
                n.name, n.address, NodeRun.AGENT, reason, ray_id(n.name), (n.address,)
            )
    return out


def local(cfg: ServedConfig, *, remote: Iterable[str] = ()) -> dict[str, Connection]:
    """Every node of ``cfg`` this machine, but those ``remote`` (no Ray)."""
    out: dict[str, Connection] = {}
    for n in cfg.fleet.nodes:
        run = NodeRun.ABSENT if n.name in set(remote) else NodeRun.LOCAL
        out[n.name] = Connection(n.name, n.address, run, "this machine")
    return out


def cluster(cfg: ServedConfig, alive: Iterable[str]) -> ClusterSeen:
    """A look at the cluster: a Ray node per fleet node, alive for those named."""
    names = set(alive)
    return ClusterSeen(
        tuple(RayNode(ray_id(n.name), n.address, n.name in names) for n in cfg.fleet.nodes)
    )


@dataclass
class FleetBench:
    """The fleet machine and everything its effects did (see the module)."""

    machine: FleetMachine
    effects: list[FleetEffect] = field(default_factory=list)
    answers: dict[int, Answer] = field(default_factory=dict)
    failing_agents: set[str] = field(default_factory=set)
    failing_nodes: set[str] = field(default_factory=set)
    agents_started: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # what the schedulers serve: role -> node
    served_nodes: set[str] = field(default_factory=set)
    _tickets: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def reload(
        self,
        cfg: ServedConfig,
        connections: Mapping[str, Connection],
        *,
        force: bool = False,
        start: bool = False,
    ) -> Answer:
        """Post a ``Reload`` and play its change to the end; its answer."""
        ticket = next(self._tickets)
        self.run(Reload(ticket, cfg, dict(connections), force, start))
        return self.answers[ticket]

    def run(self, event: FleetEvent) -> list[FleetEffect]:
        """Hand ``event`` to the machine, play every effect; the effects of this event."""
        done: list[FleetEffect] = []
        pending: list[FleetEvent] = [event]
        while pending:
            for effect in self.machine.handle(pending.pop(0)):
                done.append(effect)
                answer = self._play(effect)
                if answer is not None:
                    pending.append(answer)
        assert not self.machine.busy
        self.effects += done
        return done

    def lose(self, name: str, reason: str = "") -> list[FleetEffect]:
        """An agent found dead: ``NodeLost``."""
        return self.run(NodeLost(name, reason or f"node {name} is lost: its agent died"))

    def _play(self, effect: FleetEffect) -> FleetEvent | None:
        match effect:
            case Solve():
                running = dataclasses.replace(
                    effect.fleet,
                    nodes=tuple(n for n in effect.fleet.nodes if n.name in effect.running),
                )
                served = greedy_plan(effect.specs, running, effect.previous)
                whole = effect.whole and len(effect.running) < len(effect.fleet.nodes)
                full = greedy_plan(effect.specs, effect.fleet, effect.previous) if whole else served
                return PlanSolved(full, served)
            case StartAgents():
                ok = tuple(n for n in effect.nodes if n not in self.failing_agents)
                self.agents_started += ok
                failed = {n: "the agent died" for n in effect.nodes if n in self.failing_agents}
                return AgentsStarted(ok, failed)
            case Teach():
                return Taught({n: "unreachable" for n in effect.nodes if n in self.failing_nodes})
            case ApplyPlan():
                return PlanApplied(self._apply(effect))
            case Answer():
                self.answers[effect.ticket] = effect
        return None

    def _apply(self, effect: ApplyPlan) -> dict[str, object]:
        before = dict(self.placed)
        after = {r: n for n, s in effect.nodes.items() for r in s.specs}
        nodes: dict[str, object] = {}
        for name in sorted(effect.nodes):
            mine = {r for r, n in after.items() if n == name}
            had = {r for r, n in before.items() if n == name}
            nodes[name] = {"added": sorted(mine - had), "retired": sorted(had - mine)}
        moved = {r: [before[r], n] for r, n in after.items() if r in before and before[r] != n}
        drained = sorted(self.served_nodes - set(effect.nodes))
        added_nodes = sorted(set(effect.nodes) - self.served_nodes)
        self.placed, self.served_nodes = after, set(effect.nodes)
        changed = any(v["added"] or v["retired"] for v in nodes.values())  # type: ignore[index]
        return {
            "changed": changed or bool(drained or added_nodes),
            "nodes": nodes,
            "added_nodes": added_nodes,
            "drained_nodes": drained,
            "moved": moved,
        }

    def of(self, kind: type[E]) -> list[E]:
        """Every effect of type ``kind`` recorded so far."""
        return [e for e in self.effects if isinstance(e, kind)]
