"""The fleet machine's state and the steps its rules share (DESIGN.md layer 6, pure).

:class:`FleetState` holds what the fleet machine owns (the configuration served, every
node's status, the agents, the plan in force, the whole fleet's plan, what each node
serves) and the change under way (:class:`Change`); the rules that extend it
(:mod:`~rosterd.fleet_scheduler.losses`, :mod:`~rosterd.fleet_scheduler.machine`)
read and write it only from ``FleetMachine.handle``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from rosterd.fleet_scheduler.effects import (
    Answer,
    ApplyPlan,
    DropAgents,
    FleetEffect,
    Level,
    Routes,
    Say,
    Solve,
)
from rosterd.fleet_scheduler.served import restarted_roles, unserved_reasons
from rosterd.fleet_scheduler.values import NodeServing, NodeStatus, ServedConfig
from rosterd.placement.problem import Plan
from rosterd.spec import InferFlavor


@dataclass
class Change:
    """A change under way: what it would commit, and what it started so far."""

    kind: str  # "reload", "loss" or "back"
    config: ServedConfig
    nodes: dict[str, NodeStatus]
    ticket: int | None = None
    start: bool = False
    force: bool = False
    replace: tuple[str, ...] = ()
    lost: dict[str, str] = field(default_factory=dict)  # a loss: node -> why
    plan: Plan | None = None
    full: Plan | None = None
    moved: dict[str, str] = field(default_factory=dict)
    serving: dict[str, NodeServing] = field(default_factory=dict)
    started: tuple[str, ...] = ()
    nothing_to_serve: str | None = None  # the start's refusal, said after its plan


class FleetState:
    """The fleet's state and its decisions (see the module).

    ``ray_address``: the Ray cluster the fleet runs on (``None``: this machine's
    nodes only; the others are planned and left to whoever runs them);
    ``router_port``: the router's port, which a role's roster port must not take on
    this machine's nodes (``None``: backend ports are picked freely, no check);
    ``shared_flavors``: flavors whose roles share one server per node (and its
    port); ``warm_up``: load interactive and sticky roles that fit at start, and
    what a change adds or makes servable again.
    """

    def __init__(
        self,
        *,
        ray_address: str | None = None,
        router_port: int | None = None,
        shared_flavors: Collection[InferFlavor] = (),
        warm_up: bool = True,
    ) -> None:
        self.ray_address = ray_address
        self.router_port = router_port
        self.shared_flavors = tuple(shared_flavors)
        self.warm_up = warm_up
        #: The configuration in force (``None`` before the start's change is applied).
        self.config: ServedConfig | None = None
        #: Every fleet node -> how it is run now.
        self.nodes: dict[str, NodeStatus] = {}
        #: The nodes whose agent was started (a node left out of the fleet keeps its
        #: agent while it drains; it ends with the run).
        self.agents: set[str] = set()
        #: The plan in force: placements on the nodes that run (without Ray: every
        #: node), and on a lost node the roles no other node could take.
        self.plan: Plan | None = None
        #: The whole fleet's plan (every node running), for the views.
        self.full: Plan | None = None
        #: Role -> why it is not where the whole fleet's plan put it.
        self.moved: dict[str, str] = {}
        #: Node -> what it serves now (every node that has a scheduler).
        self.serving: dict[str, NodeServing] = {}
        self._said: set[str] = set()
        self._back_said: set[str] = set()
        self._change: Change | None = None

    @property
    def busy(self) -> bool:
        """Whether a change is under way (its effects' answers are still to come)."""
        return self._change is not None

    def _solve(
        self, config: ServedConfig, nodes: Mapping[str, NodeStatus], *, whole: bool
    ) -> Solve:
        """The plan of ``config`` on the nodes that run (without Ray, every node: the ones
        of other machines are planned for whoever runs them), keeping the plan in force."""
        planned = tuple(
            n.name
            for n in config.fleet.nodes
            if (n.name in nodes and nodes[n.name].run.running) or self.ray_address is None
        )
        return Solve(
            config.memory.planning_specs(s.spec for s in config.roster.specs),
            config.fleet,
            planned,
            self.plan,
            config.memory.reason_notes(),
            whole=whole,
            config=config,
        )

    def _apply(self, change: Change) -> ApplyPlan:
        restart: tuple[str, ...] = ()
        if change.kind == "reload" and self.config is not None:
            restart = restarted_roles(self.config, change.config)
        return ApplyPlan(dict(change.serving), restart, change.replace)

    def _routes(self) -> Routes:
        assert self.config is not None
        assert self.plan is not None
        served = set(self.serving)  # a lost node's roles stay routable: requests wait for them
        placements = {r: n for r, n in self.plan.placements.items() if n in served}
        return Routes(self.config, placements, unserved_reasons(self.plan, self.config, served))

    def _refuse(
        self, change: Change, why: str, *, nothing_to_serve: bool = False
    ) -> list[FleetEffect]:
        """End ``change`` with nothing committed: its agents end, its caller hears ``why``."""
        self._change = None
        effects: list[FleetEffect] = []
        if change.started:
            effects.append(DropAgents(change.started))
        if change.kind == "back":
            effects.append(Say(Level.WARNING, why, True))
        elif not change.start:
            said = f"reload refused, the running configuration stays: {why}"
            effects.append(Say(Level.ERROR, said, True))
        if change.ticket is not None:
            effects.append(Answer(change.ticket, error=why, nothing_to_serve=nothing_to_serve))
        return effects

    def _say_new(
        self, level: Level, lines: Sequence[str], *, log_only: bool = True
    ) -> list[FleetEffect]:
        """``Say`` each line not said before in this run (warnings are said once)."""
        out: list[FleetEffect] = []
        for line in lines:
            if line not in self._said:
                self._said.add(line)
                out.append(Say(level, line, log_only))
        return out
