"""What the fleet machine does when nodes are lost and come back (DESIGN.md layer 6, pure).

:class:`LossRules` extends :class:`~rosterd.fleet_scheduler.state.FleetState` with the
answers to a ``NodeLost`` and a ``ClusterSeen``: the nodes lost are marked at once and
one re-plan moves their roles where they fit (the others stay lost there); a lost node
with a live Ray node at its address again gets a new agent and a fresh scheduler.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rosterd.fleet_scheduler.effects import (
    FleetEffect,
    Level,
    MarkLost,
    Say,
    StartAgents,
    Teach,
)
from rosterd.fleet_scheduler.events import ClusterSeen, PlanSolved
from rosterd.fleet_scheduler.served import (
    copies_after_loss,
    node_serving,
    placements_after_loss,
)
from rosterd.fleet_scheduler.state import Change, FleetState
from rosterd.fleet_scheduler.values import Connection, NodeRun, NodeServing, NodeStatus
from rosterd.ray_match import lost_agents, nodes_back


class LossRules(FleetState):
    """Nodes lost and back (see the module)."""

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
        pairs = self.plan.copy_pairs() if self.plan is not None else []
        effects: list[FleetEffect] = []
        for node, why in sorted(news.items()):
            self.nodes[node] = dataclasses.replace(self.nodes[node], run=NodeRun.LOST, reason=why)
            self.agents.discard(node)
            self._back_said.discard(node)
            mine = sorted(r for r, n in pairs if n == node)
            effects.append(
                Say(Level.ERROR, f"{why}; its roles are lost: {', '.join(mine) or 'none'}")
            )
            if node in self.serving:
                effects.append(MarkLost(node, why))
        if not any(n in self.serving for n in news):
            return effects
        change = Change("loss", self.config, dict(self.nodes), lost=dict(news))
        self._change = change
        served = {n: s for n, s in self.nodes.items() if n in self.serving}
        effects.append(self._solve(self.config, served, whole=False))
        return effects

    def _loss_solved(self, change: Change, solved: PlanSolved) -> list[FleetEffect]:
        assert self.plan is not None
        lost = {n for n, s in self.nodes.items() if s.run is NodeRun.LOST}
        placements = placements_after_loss(self.plan, solved.served, lost)
        copies = copies_after_loss(solved.served, placements)
        change.plan = dataclasses.replace(solved.served, placements=placements, copies=copies)
        config = change.config
        in_fleet = {n.name for n in config.fleet.nodes}
        wanted: dict[str, NodeServing] = {}
        for name, current in self.serving.items():
            if name not in in_fleet:
                change.serving[name] = current
                continue
            fresh = node_serving(
                config, placements, config.fleet.node(name), self.nodes[name].run, copies
            )
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
        change = Change("back", self.config, nodes, replace=tuple(sorted(back)))
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
