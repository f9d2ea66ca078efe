"""A reload of ``rosterd up --ray-address`` (layer 8): the fleet on Ray serves the newly read
roster, overlay and fleet files without a restart.

:func:`serve_fleet_config` is ``serve_config`` of :class:`~rosterd.up.reload.ConfigReloader`
when the fleet runs on Ray. It matches the reloaded fleet to the cluster again
(``RayFleet.refit``: a node with an agent keeps it; a node the reload added, or
one not connected before, runs once its Ray node is live), plans the whole
fleet with the plan in force as ``previous``, then the nodes that run
(``UpFleet.plan``: a role of a node not connected moves, with its reason),
starts an agent on each node connected now that has none, tells every agent
the roles, weights and model names it serves from now on
(``AgentBackends.reconfigure``) and builds this machine's nodes as without Ray
(:func:`~rosterd.up.reload.served_config`). Nothing is applied here: the
reloader applies the result in one step, and a refusal (a node on Ray given a
new address, an agent that cannot start) leaves the running configuration as
it is.

A node lost whose address has a live Ray node again is taken back: it gets a
new agent and a fresh scheduler (``Served.replaced_nodes``), and the plan may put
roles there again (the sticky roles moved at its loss stay where they are:
the plan in force is kept). A node left out of the fleet file drains and stops
its backends, and its agent ends with the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable

from rich.console import Console

from rosterd.fleet import Fleet
from rosterd.memory.gathering import RosterMemory
from rosterd.placement import Plan
from rosterd.roster import ImportedRoster
from rosterd.scheduler.fleet import NodeConfig
from rosterd.scheduler.values import NodeConcurrency
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent, Supervisor
from rosterd.up.options import UpOptions
from rosterd.up.plan_view import first_by_role
from rosterd.up.ray_fleet import UpFleet
from rosterd.up.reload import Served, plan_config, served_config


async def serve_fleet_config(
    ray: UpFleet,
    roster: ImportedRoster,
    fleet: Fleet,
    previous: Plan,
    memory: RosterMemory,
    *,
    options: UpOptions,
    supervisor: Supervisor,
    on_event: Callable[[BackendEvent], None],
    state_root: str | None,
    out: Console,
    after_plan: Callable[[], None] = lambda: None,
) -> Served:
    """What the reloaded files give this run on Ray (see the module): every node that
    runs gets its :class:`~rosterd.scheduler.NodeConfig` (agent nodes over their
    agents, this machine's over ``supervisor``), with each role's figure from
    ``memory``; ``previous`` is the plan in force; ``on_event`` hears the backend
    events of an agent started now; ``after_plan()`` runs after each solver run.

    Raises:
        ClusterError: a node on Ray has a new address, or the cluster cannot be listed.
        NodeLostError, NodeAgentError, StateDirLockedError: an agent could not start,
            or could not learn its roles.
        NothingToServeError: no node of the fleet runs.
    """
    async with ray.replan_lock:  # not beside a re-plan after a node's loss
        if ray.served is not None:  # the plan in force: a node's loss may have moved roles since
            previous = ray.served.plan
        # What the reload changes of the run's view of the cluster, put back if refused.
        kept = (ray.ray_fleet.fleet, ray.ray_fleet.connections, ray.fleet, ray.served, ray.memory)
        agents_before = dict(ray.agents)
        undo: list[Callable[[], None]] = []
        try:
            await asyncio.to_thread(ray.ray_fleet.refit, fleet)
            ray.adopt(fleet)
            # A lost node whose Ray node is live again is taken back, with a fresh scheduler.
            in_fleet = {n.name for n in fleet.nodes}
            back = [n for n in ray.lost if n in in_fleet and ray.ray_fleet.connection(n).connected]
            undo = [ray.take_back(node) for node in back]
            full = await plan_config(
                roster, fleet, previous, options, memory, after_plan=after_plan
            )
            specs = memory.planning_specs(s.spec for s in roster.specs)
            try:
                served_plan = await asyncio.to_thread(
                    ray.plan, specs, full, previous=previous, memory_notes=memory.reason_notes()
                )
            finally:
                after_plan()
            served = await _served(
                ray,
                roster,
                fleet,
                served_plan.plan,
                memory,
                options,
                supervisor,
                on_event=on_event,
                state_root=state_root,
                out=out,
            )
            ray.memory = memory  # a later loss moves roles with these figures
            return dataclasses.replace(served, replaced_nodes=tuple(back))
        except BaseException:
            started = [n for n, a in ray.agents.items() if agents_before.get(n) is not a]
            for node in started:  # agents this reload started (a node taken back's too)
                ray.agents.pop(node, None)
                with contextlib.suppress(Exception):
                    await ray.ray_fleet.drop_agent(node)
            for step in undo:
                step()
            ray.ray_fleet.fleet, ray.ray_fleet.connections = kept[0], kept[1]
            ray.adopt(kept[2])
            ray.served, ray.memory = kept[3], kept[4]
            raise


async def _served(
    ray: UpFleet,
    roster: ImportedRoster,
    fleet: Fleet,
    result: Plan,
    memory: RosterMemory,
    options: UpOptions,
    supervisor: Supervisor,
    *,
    on_event: Callable[[BackendEvent], None],
    state_root: str | None,
    out: Console,
) -> Served:
    """The :class:`Served` of ``result`` (the plan of the nodes that run): agents started
    where missing and told their roles, this machine's nodes built as without Ray."""
    by_role = first_by_role(roster)
    repos = {role: s.repo or None for role, s in by_role.items()}
    names = {role: s.name for role, s in by_role.items()}
    agents = await ray.start_agents(
        {},
        repos=repos,
        on_event=on_event,
        state_root=state_root,
        auto_ports=options.auto_backend_ports,
        grace_s=options.grace_s,
        model_names=names,
    )
    nodes: dict[str, NodeConfig] = {}
    in_fleet = {n.name for n in fleet.nodes}
    for name, agent in agents.items():
        if name in ray.lost or name not in in_fleet:
            continue  # a lost node not back stays lost; one left out of the fleet drains
        placed: dict[str, InferenceSpec] = {
            role: by_role[role].spec for role, node in result.placements.items() if node == name
        }
        node_specs = memory.node_specs(placed, name)
        await agent.reconfigure(node_specs, fleet=fleet, repos=repos, model_names=names)
        node = fleet.node(name)
        nodes[name] = NodeConfig(
            name,
            node.capacity_bytes,
            node_specs,
            agent,
            memory={r: memory.roles[r].as_json(name) for r in node_specs if r in memory.roles},
            concurrency=NodeConcurrency(node.max_concurrency, memory.slots()),
        )
    local = served_config(
        roster,
        fleet,
        result,
        supervisor,
        auto_ports=options.auto_backend_ports,
        out=out,
        local_nodes=ray.local_nodes(),
        memory=memory,
    )
    return Served(
        roster,
        fleet,
        result,
        local.local_nodes,
        {**local.nodes, **nodes},
        local.weights,
        memory,
    )
