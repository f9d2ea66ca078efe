"""The fleet machine (DESIGN.md layer 6, pure): what to do about each fleet event.

:class:`FleetMachine` owns the fleet's state: the configuration served, how each
node is run (here, on Ray, not connected, lost), the agents, the plan in force,
the whole fleet's plan and what each node serves. ``handle(event)`` takes one
event and returns the effects to apply, in order; it reads no clock, does no I/O
and logs nothing (what the operator is told is a ``Say`` effect). Its tests drive
it synchronously and play the effects' part themselves
(``tests/fleet_scheduler/test_fleet_machine.py``).

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

from collections.abc import Mapping

from rosterd.backends.copy_names import role_of_copy
from rosterd.fleet_scheduler import notices
from rosterd.fleet_scheduler.effects import (
    Answer,
    FleetEffect,
    Level,
    Say,
    StartAgents,
    Teach,
    Warm,
)
from rosterd.fleet_scheduler.events import (
    AgentsStarted,
    EffectFailed,
    FleetEvent,
    NodeLost,
    OuterEvent,
    PlanApplied,
    PlanSolved,
    Reload,
    Taught,
)
from rosterd.fleet_scheduler.losses import LossRules
from rosterd.fleet_scheduler.served import (
    added_roles,
    change_summary,
    lost_weights,
    node_serving,
    replanned_reasons,
    retired_reasons,
    warm_up_order,
    with_unplaced_reasons,
)
from rosterd.fleet_scheduler.state import Change
from rosterd.fleet_scheduler.values import (
    NodeRun,
    NodeServing,
    NodeStatus,
)
from rosterd.placement.conflicts import without_port_conflicts
from rosterd.placement.problem import Plan


class FleetMachine(LossRules):
    """The fleet's state and its decisions (see the module and :class:`FleetState`)."""

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
        change = Change(
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
            why = "no node of the fleet is this machine; nothing to serve"
            if self.ray_address is not None:
                why = (
                    f"no node of the fleet is connected to the Ray cluster at {self.ray_address} "
                    "or is this machine; nothing to serve"
                )
            if not (event.start and self.ray_address is None):
                return self._refuse(change, why, nothing_to_serve=True)
            change.nothing_to_serve = why  # the plan is shown first: where would it go?
        memory = config.memory
        effects = self._say_new(Level.WARNING, [*memory.notes, *memory.warnings()], log_only=False)
        effects += self._say_new(Level.WARNING, [f"reload: {w}" for w in config.roster.warnings])
        effects.append(self._solve(config, change.nodes, whole=True))
        return effects

    def _solved(self, change: Change, solved: PlanSolved) -> list[FleetEffect]:
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
            node.name: node_serving(
                config, change.plan.placements, node, status.run, change.plan.copies
            )
            for node in config.fleet.nodes
            if (status := change.nodes[node.name]).run.running
        }
        effects: list[FleetEffect] = []
        if change.start:
            effects += notices.start_notices(
                change.plan, full, config, change.nodes, moved, on_ray=self.ray_address is not None
            )
            if change.nothing_to_serve is not None:
                refusal = self._refuse(change, change.nothing_to_serve, nothing_to_serve=True)
                return [*effects, *refusal]
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
                unplaced = change.plan.unplaced if change.plan is not None else ()
                return self._refuse(change, notices.empty_lab_refusal(config, unplaced))
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

    def _check_ports(self, result: Plan, change: Change) -> Plan:
        """``result`` with each role whose roster port collides unplaced, with why."""
        return without_port_conflicts(
            result,
            [s.spec for s in change.config.roster.specs],
            router_port=self.router_port,
            router_nodes=[n for n, s in change.nodes.items() if s.run is NodeRun.LOCAL],
            shared_flavors=self.shared_flavors,
        )

    def _teach(self, change: Change) -> Teach:
        return Teach(dict(change.serving), change.config, new_config=change.kind == "reload")

    def _agents_started(self, change: Change, started: AgentsStarted) -> list[FleetEffect]:
        change.started = tuple(started.started)
        if started.failed:
            why = notices.failures("could not start its agent", started.failed)
            if change.kind == "back":
                return self._refuse(change, f"{why}; `rosterd reload` tries again")
            return self._refuse(change, why)
        if change.kind == "back":  # the nodes run again: plan the configuration in force
            return [self._solve(change.config, change.nodes, whole=False)]
        return [self._teach(change)]

    def _applied(self, change: Change, applied: Mapping[str, object]) -> list[FleetEffect]:
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
        roles; after a reload, those it added and those it made servable again. A further
        copy (``chat~2``) is warmed as its role, whose load loads every copy (a load of the
        unit itself is refused: clients never name it)."""
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
                if role_of_copy(role) not in roles:
                    roles.append(role_of_copy(role))
        return tuple(roles)
