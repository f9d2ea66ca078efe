"""The fleet machine (DESIGN.md layer 6, pure): what to do about each fleet event.

:class:`FleetMachine` owns the fleet's state: the configuration served, how each
node is run (here, on Ray, not connected, lost), the agents, the plan in force,
the whole fleet's plan and what each node serves. ``handle(event)`` takes one
event and returns the effects to apply, in order; it reads no clock, does no I/O
and logs nothing (what the operator is told is a ``Say`` effect). Its tests drive
it synchronously and play the effects' part themselves (``tests/test_fleet_machine.py``).

A change is a short sequence that ends with the state committed, or left as it
was (nomad's plan applier is the model: a plan is made against a snapshot, then
checked against the state and applied, or refused):

- ``Reload`` (the start is the first, from an empty fleet): match the nodes,
  ``Solve``; on ``PlanSolved`` check ports, lost weights and an empty lab, then
  ``StartAgents`` on nodes that need one; on ``AgentsStarted`` ``Teach`` every
  running node; on ``Taught`` ``ApplyPlan``; on ``PlanApplied`` commit,
  ``Routes``, ``Warm``, ``Answer``. A refusal at any step drops the agents the
  change started and answers why; nothing else changed.
- ``NodeLost``, or a ``ClusterSeen`` whose Ray nodes of agents died: ``MarkLost``
  at once (their requests wait), then ``Solve`` without them: their roles move
  where they fit, the others stay lost there (``Record`` says each); sticky roles
  elsewhere stay where they are.
- a ``ClusterSeen`` with a live Ray node at a lost node's address (said once):
  ``StartAgents`` there, then the configuration in force is planned again with
  the node running, its scheduler made afresh (``replace``).

The loop takes the next event from outside only once the change it started is
over (:attr:`FleetMachine.busy` is false): one change at a time, no locks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from rosterd.fleet_scheduler import notices
from rosterd.fleet_scheduler.effects import (
    Answer,
    ApplyPlan,
    DropAgents,
    FleetEffect,
    Level,
    MarkLost,
    Routes,
    Say,
    Solve,
    StartAgents,
    Teach,
    Warm,
)
from rosterd.fleet_scheduler.events import (
    AgentsStarted,
    ClusterSeen,
    EffectFailed,
    FleetEvent,
    NodeLost,
    OuterEvent,
    PlanApplied,
    PlanSolved,
    Reload,
    Taught,
)
from rosterd.fleet_scheduler.served import (
    added_roles,
    change_summary,
    lost_weights,
    node_serving,
    placements_after_loss,
    replanned_reasons,
    restarted_roles,
    retired_reasons,
    unserved_reasons,
    warm_up_order,
    with_unplaced_reasons,
)
from rosterd.fleet_scheduler.values import (
    Connection,
    NodeRun,
    NodeServing,
    NodeStatus,
    ServedConfig,
)
from rosterd.placement.conflicts import without_port_conflicts
from rosterd.placement.problem import Plan
from rosterd.ray_match import lost_agents, nodes_back
from rosterd.spec import InferFlavor


@dataclass
class _Change:
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


class FleetMachine:
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
        self._change: _Change | None = None

    @property
    def busy(self) -> bool:
        """Whether a change is under way (its effects' answers are still to come)."""
        return self._change is not None

    def handle(self, event: FleetEvent) -> list[FleetEffect]:
        """The effects of ``event``, in the order they are to be applied.

        Raises:
            AssertionError: an event from outside (``Reload``, ``NodeLost``,
                ``ClusterSeen``) while :attr:`busy`, or an effect's answer while not.
        """
        if isinstance(event, OuterEvent):
            assert self._change is None, "one change at a time"
            if isinstance(event, Reload):
                return self._reload(event)
            if isinstance(event, NodeLost):
                return self._lose({event.node: event.reason})
            return self._seen(event)
        change = self._change
        assert change is not None, f"{type(event).__name__} answers no change under way"
        match event:
            case PlanSolved():
                if change.kind == "loss":
                    return self._loss_solved(change, event)
                return self._solved(change, event)
            case AgentsStarted():
                return self._agents_started(change, event)
            case Taught():
                if event.failed:
                    why = notices.failures("could not learn its roles", event.failed)
                    return self._refuse(change, why)
                return [self._apply(change)]
            case PlanApplied():
                return self._applied(change, event.change)
            case EffectFailed():
                if change.kind == "loss":  # its roles stay lost; their requests time out
                    self._change = None
                    return [Say(Level.ERROR, f"re-planning after a loss failed: {event.why}")]
                return self._refuse(change, event.why)
        raise AssertionError(f"unknown event {event!r}")

    # ---- reload (and the start) --------------------------------------------------------

    def _reload(self, event: Reload) -> list[FleetEffect]:
        config = event.config
        change = _Change(
            "reload", config, {}, ticket=event.ticket, start=event.start, force=event.force
        )
        self._change = change
        if event.start:  # the run said the import's warnings before it took the state folder
            self._said.update(f"reload: {w}" for w in config.roster.warnings)
        taken_back: list[str] = []
        for node in config.fleet.nodes:
            old = self.nodes.get(node.name)
            fresh = event.connections.get(node.name)
            if old is not None and old.run is NodeRun.AGENT and node.name in self.agents:
                if old.address != node.address:
                    return self._refuse(
                        change,
                        f"node {node.name} is on Ray at {old.address}; its new address "
                        f"{node.address} takes effect when rosterd up restarts",
                    )
                change.nodes[node.name] = old  # its agent goes on
            elif old is not None and old.run is NodeRun.LOST:
                if fresh is not None and fresh.run is NodeRun.AGENT:
                    change.nodes[node.name] = NodeStatus.of(fresh)  # taken back
                    taken_back.append(node.name)
                else:
                    change.nodes[node.name] = old
            elif fresh is not None:
                change.nodes[node.name] = NodeStatus.of(fresh)
            else:
                change.nodes[node.name] = NodeStatus(NodeRun.ABSENT, node.address, "not matched")
        change.replace = tuple(taken_back)
        if not any(s.run.running for s in change.nodes.values()):
            if self.ray_address is None:
                return self._refuse(
                    change, "no node of the fleet is this machine; nothing to serve"
                )
            return self._refuse(
                change,
                f"no node of the fleet is connected to the Ray cluster at {self.ray_address} "
                "or is this machine; nothing to serve",
            )
        memory = config.memory
        effects = self._say_new(Level.WARNING, [*memory.notes, *memory.warnings()], log_only=False)
        effects += self._say_new(Level.WARNING, [f"reload: {w}" for w in config.roster.warnings])
        effects.append(self._solve(config, change.nodes, whole=True))
        return effects

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
        )

    def _solved(self, change: _Change, solved: PlanSolved) -> list[FleetEffect]:
        config = change.config
        full, served = solved.full, solved.served
        if change.kind == "back":
            full = self.full or full
        elif self.router_port is not None:  # the roster's ports are used: may they be?
            same = served is full
            full = self._check_ports(full, change)
            served = full if same else self._check_ports(served, change)
        gone = {n: s.reason for n, s in change.nodes.items() if not s.run.running}
        moved = replanned_reasons(full, served, gone) if gone and self.ray_address else {}
        change.full, change.moved = full, moved
        change.plan = with_unplaced_reasons(served, moved)
        change.serving = {
            node.name: node_serving(config, change.plan.placements, node, status.run)
            for node in config.fleet.nodes
            if (status := change.nodes[node.name]).run.running
        }
        effects: list[FleetEffect] = []
        if change.start:
            effects += notices.start_notices(
                change.plan, full, config, change.nodes, moved, on_ray=self.ray_address is not None
            )
        else:
            lost = lost_weights(self.serving, change.serving)
            if lost:
                return self._refuse(change, notices.lost_weights_refusal(lost))
            if (
                change.kind == "reload"
                and not change.force
                and any(s.specs for s in self.serving.values())
                and not any(s.specs for s in change.serving.values())
            ):
                return self._refuse(change, notices.empty_lab_refusal(config))
        effects += notices.unavailable_notices(self.serving, change.serving)
        wanted = {
            name: serving
            for name, serving in change.serving.items()
            if change.nodes[name].run is NodeRun.AGENT
            and name not in change.started
            and (name not in self.agents or name in change.replace)
        }
        if wanted:
            ids = {n: change.nodes[n].ray_node_id or "" for n in wanted}
            return [*effects, StartAgents(wanted, config, ids)]
        return [*effects, self._teach(change)]

    def _check_ports(self, result: Plan, change: _Change) -> Plan:
        """``result`` with each role whose roster port collides unplaced, with why."""
        return without_port_conflicts(
            result,
            [s.spec for s in change.config.roster.specs],
            router_port=self.router_port,
            router_nodes=[n for n, s in change.nodes.items() if s.run is NodeRun.LOCAL],
            shared_flavors=self.shared_flavors,
        )

    def _teach(self, change: _Change) -> Teach:
        return Teach(dict(change.serving), change.config, new_config=change.kind == "reload")

    def _agents_started(self, change: _Change, started: AgentsStarted) -> list[FleetEffect]:
        change.started = tuple(started.started)
        if started.failed:
            why = notices.failures("could not start its agent", started.failed)
            if change.kind == "back":
                return self._refuse(change, f"{why}; `rosterd reload` tries again")
            return self._refuse(change, why)
        if change.kind == "back":  # the nodes run again: plan the configuration in force
            return [self._solve(change.config, change.nodes, whole=False)]
        return [self._teach(change)]

    def _apply(self, change: _Change) -> ApplyPlan:
        restart: tuple[str, ...] = ()
        if change.kind == "reload" and self.config is not None:
            restart = restarted_roles(self.config, change.config)
        return ApplyPlan(dict(change.serving), restart, change.replace)

    def _applied(self, change: _Change, applied: Mapping[str, object]) -> list[FleetEffect]:
        self._change = None
        before = self.serving
        self.config = change.config
        self.nodes = change.nodes
        self.agents |= set(change.started)
        self.plan = change.plan or self.plan
        self.full = change.full or self.full
        self.moved = change.moved
        self.serving = change.serving
        effects: list[FleetEffect] = [self._routes()]
        if change.kind == "loss":
            assert self.plan is not None
            moved = applied.get("moved")
            records = notices.loss_records(
                change.lost, self.plan, moved if isinstance(moved, dict) else {}
            )
            return [*records, *effects]
        answer = dict(applied)
        if change.kind == "reload" and not change.start:
            assert self.plan is not None
            why = retired_reasons(applied, self.config, self.plan)
            if why:
                answer["why"] = why
            effects += [
                Say(Level.WARNING, f"reload: role {role} is no longer served: {reason}", True)
                for role, reason in why.items()
            ]
            effects.append(Say(Level.INFO, f"reloaded: {change_summary(applied)}", True))
        elif change.kind == "back":
            summary = change_summary(applied)
            effects.append(
                Say(Level.INFO, f"{', '.join(change.replace)} taken back: {summary}", True)
            )
        answer["warnings"] = list(self.config.roster.warnings)
        warm = self._warm(before, change.start, applied) if self.warm_up else ()
        if warm:
            effects.append(Warm(warm))
        if change.ticket is not None:
            effects.append(Answer(change.ticket, change=answer))
        return effects

    def _warm(
        self, before: Mapping[str, NodeServing], start: bool, applied: Mapping[str, object]
    ) -> tuple[str, ...]:
        """What ``up`` loads after a change: at start, every node's interactive and sticky
        roles; after a reload, those it added and those it made servable again."""
        wanted = None if start else added_roles(applied)
        if wanted is not None:
            unavailable = {r for s in before.values() for r in s.unavailable}
            servable = {r for s in self.serving.values() for r in s.specs if r not in s.unavailable}
            wanted |= unavailable & servable
        roles: list[str] = []
        for serving in self.serving.values():
            for role in warm_up_order(serving.specs):
                if role in serving.unavailable or (wanted is not None and role not in wanted):
                    continue
                roles.append(role)
        return tuple(roles)

    def _routes(self) -> Routes:
        assert self.config is not None
        assert self.plan is not None
        running = {n for n, s in self.serving.items() if s.run.running}
        placements = {r: n for r, n in self.plan.placements.items() if n in running}
        return Routes(self.config, placements, unserved_reasons(self.plan, self.config, running))

    # ---- nodes lost, nodes back -------------------------------------------------------

    def _seen(self, event: ClusterSeen) -> list[FleetEffect]:
        """A look at the Ray cluster: the agents' nodes that died are lost; else the lost
        nodes a live Ray node has the address of again are taken back."""
        agents = {
            n: s.ray_node_id
            for n, s in self.nodes.items()
            if s.run is NodeRun.AGENT and s.ray_node_id is not None and n in self.agents
        }
        addresses = {n: self.nodes[n].address for n in agents}
        dead = lost_agents(agents, event.ray_nodes, addresses)
        if dead:
            return self._lose(dead)
        if self.config is None:
            return []
        lost = [n for n, s in self.nodes.items() if s.run is NodeRun.LOST]
        ips = {n: self.nodes[n].ips or (self.nodes[n].address,) for n in lost}
        back = nodes_back(self.config.fleet, lost, event.ray_nodes, ips)
        fresh = {n: c for n, c in back.items() if n not in self._back_said}
        if not fresh:
            return []
        return self._take_back(
            {
                n: Connection(n, c.address, NodeRun.AGENT, c.reason, c.ray_node_id, ips[n])
                for n, c in fresh.items()
            }
        )

    def _lose(self, lost: Mapping[str, str]) -> list[FleetEffect]:
        news = {
            n: why
            for n, why in lost.items()
            if n in self.nodes and self.nodes[n].run is not NodeRun.LOST
        }
        if not news or self.config is None:
            return []
        placements = self.plan.placements if self.plan is not None else {}
        effects: list[FleetEffect] = []
        for node, why in sorted(news.items()):
            self.nodes[node] = dataclasses.replace(self.nodes[node], run=NodeRun.LOST, reason=why)
            self.agents.discard(node)
            self._back_said.discard(node)
            mine = sorted(r for r, n in placements.items() if n == node)
            effects.append(
                Say(Level.ERROR, f"{why}; its roles are lost: {', '.join(mine) or 'none'}")
            )
            if node in self.serving:
                effects.append(MarkLost(node, why))
        if not any(n in self.serving for n in news):
            return effects
        change = _Change("loss", self.config, dict(self.nodes), lost=dict(news))
        self._change = change
        served = {n: s for n, s in self.nodes.items() if n in self.serving}
        effects.append(self._solve(self.config, served, whole=False))
        return effects

    def _loss_solved(self, change: _Change, solved: PlanSolved) -> list[FleetEffect]:
        assert self.plan is not None
        lost = {n for n, s in self.nodes.items() if s.run is NodeRun.LOST}
        placements = placements_after_loss(self.plan, solved.served, lost)
        change.plan = dataclasses.replace(solved.served, placements=placements)
        config = change.config
        in_fleet = {n.name for n in config.fleet.nodes}
        wanted: dict[str, NodeServing] = {}
        for name, current in self.serving.items():
            if name not in in_fleet:
                change.serving[name] = current
                continue
            fresh = node_serving(config, placements, config.fleet.node(name), self.nodes[name].run)
            # A node keeps the unavailable roles it had (its weights were checked then).
            kept = {r: w for r, w in current.unavailable.items() if r in fresh.specs}
            fresh = dataclasses.replace(fresh, unavailable=kept)
            change.serving[name] = fresh
            if fresh.run.running and set(fresh.specs) - set(current.specs):
                wanted[name] = fresh
        change.moved = dict(self.moved) | {
            role: f"planned on node {to}: node {was} is lost"
            for role, was in self.plan.placements.items()
            if was in lost and (to := placements[role]) != was
        }
        change.full = self.full
        if wanted:
            return [Teach(wanted, config, new_config=False)]
        return [self._apply(change)]

    def _take_back(self, back: Mapping[str, Connection]) -> list[FleetEffect]:
        assert self.config is not None
        self._back_said.update(back)
        nodes = dict(self.nodes) | {n: NodeStatus.of(c) for n, c in back.items()}
        change = _Change("back", self.config, nodes, replace=tuple(sorted(back)))
        change.plan, change.full = self.plan, self.full
        change.serving = {
            n: node_serving(self.config, {}, self.config.fleet.node(n), NodeRun.AGENT)
            for n in change.replace
        }
        self._change = change
        ids = {n: c.ray_node_id or "" for n, c in back.items()}
        says: list[FleetEffect] = [
            Say(Level.OK, f"node {n} is back on the Ray cluster") for n in change.replace
        ]
        return [*says, StartAgents(dict(change.serving), self.config, ids)]

    # ---- refusals and words -----------------------------------------------------------

    def _refuse(self, change: _Change, why: str) -> list[FleetEffect]:
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
            effects.append(Answer(change.ticket, error=why))
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
