"""The fleet on Ray for one ``rosterd up --ray-address`` run (layer 8): which nodes run, the
plan of those that do, one node agent per connected node, and what a lost node changes.

:meth:`UpFleet.join` joins the cluster (``rosterd.ray_cluster.connect_fleet``)
and matches the fleet's nodes to Ray nodes. A node runs when a live Ray node
has its address (its node agent runs its backends there, the head's own node
included), or, without one, when its address is this machine (the local
supervisor runs it, exactly as without Ray). Any other node is *not
connected*: the roles are planned on the nodes that run (:meth:`UpFleet.plan`),
and each role that moved, or fits nowhere, gets its reason.

At run time :meth:`UpFleet.watch` reports a lost node (its Ray node or its
agent died) to :meth:`UpFleet.on_node_lost`, the one place a loss is answered:
it marks the node's roles ``lost`` (their requests wait), logs and prints it,
and re-plans (:meth:`UpFleet.replan_lost`): the fleet without the lost nodes
is planned again with the plan in force as ``previous`` (sticky roles stay),
each node that takes a role learns its spec (its agent, or this machine's
supervisor), and ``Scheduler.apply_plan`` serves the new plan; requests that
waited for a moved role are queued on its new node. A role that fits nowhere
stays ``lost`` on its node (its requests time out naming the loss). Each move
or unplaced role is a log line with its cause and a ``moved`` / ``unplaced``
event in ``/rosterd/events``. A node that comes back (a live Ray node at its
address again) is said, and ``up`` reloads (``on_back`` of :meth:`UpFleet.watch`):
the reload on Ray (``rosterd.up.ray_reload``) matches the fleet again
(:meth:`UpFleet.adopt`), takes the node back (:meth:`UpFleet.take_back`) and
starts the agents missing (:meth:`UpFleet.start_agents`).

:meth:`UpFleet.node_views` is what ``/status``, ``rosterd ps`` and ``/metrics``
show of every node, connected or not. It prints (the CLI layer), on the
console it is given; Ray itself is imported only through ``ray_cluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from rosterd.backends.local import SupervisorBackends
from rosterd.errors import NothingToServeError
from rosterd.fleet import Fleet, Node
from rosterd.memory.gathering import RosterMemory
from rosterd.metrics import RosterdMetrics
from rosterd.node_agent import AgentBackends
from rosterd.placement import Plan, plan
from rosterd.ray_cluster import RayFleet, connect_fleet, disconnect
from rosterd.ray_match import NodeLost
from rosterd.scheduler.fleet import NodeConfig, Scheduler
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeConcurrency
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent
from rosterd.up.plan_view import is_local_address, replanned_reasons, with_unplaced_reasons

if TYPE_CHECKING:
    from rosterd.up.runtime import UpOptions

log = logging.getLogger("rosterd.fleet")


@dataclasses.dataclass(frozen=True)
class ServedPlan:
    """The plan one run serves: ``plan`` (of the nodes that run), ``full`` (of the whole
    fleet), ``moved`` (role -> why it is not where ``full`` put it), ``where`` (node -> how
    it is run, in words, for the printed plan), ``specs`` (role -> its spec)."""

    plan: Plan
    full: Plan
    moved: Mapping[str, str]
    where: Mapping[str, str]
    specs: Mapping[str, InferenceSpec]


class UpFleet:
    """The Ray side of one run (see the module): build it with :meth:`join`.

    ``ray_fleet``: the joined cluster's fleet; ``address``: the Ray address;
    ``out``: the run's console.
    """

    def __init__(self, ray_fleet: RayFleet, address: str, out: Console) -> None:
        self.ray_fleet = ray_fleet
        self.fleet = ray_fleet.fleet
        self.address = address
        self.out = out
        self.agents: dict[str, AgentBackends] = {}
        self.scheduler: Scheduler | None = None
        self.served: ServedPlan | None = None
        self.lost: dict[str, str] = {}  # node -> why it is lost
        self.memory: RosterMemory | None = None  # the figures each role counts, per node
        self._local = {n.name for n in self.fleet.nodes if is_local_address(n.address)}
        self._watch: asyncio.Task[None] | None = None
        self._replans: set[asyncio.Task[None]] = set()
        #: Held by each re-plan after a loss, and by a reload on Ray: one at a time.
        self.replan_lock = asyncio.Lock()
        self._after_plan: Callable[[], None] = lambda: None
        #: Monotonic seconds at which each lost node's re-plan was applied (for the bench).
        self.replanned_at: dict[str, float] = {}

    @classmethod
    def join(cls, address: str, fleet: Fleet, out: Console) -> UpFleet:
        """Join the Ray cluster at ``address`` (blocking: before any signal handler is set).

        Raises:
            RayNotInstalledError: the ``ray`` extra is missing.
            ClusterConnectError: the cluster cannot be reached or refused us.
        """
        return cls(connect_fleet(address, fleet), address, out)

    # ---- which nodes run, and the plan ------------------------------------------------

    def adopt(self, fleet: Fleet) -> None:
        """Take ``fleet`` (reloaded, already matched: ``RayFleet.refit``) as the fleet."""
        self.fleet = fleet
        self._local = {n.name for n in fleet.nodes if is_local_address(n.address)}

    def agent_nodes(self) -> list[Node]:
        """The nodes run by a node agent: those a live Ray node matched."""
        return [n for n in self.fleet.nodes if self.ray_fleet.connection(n.name).connected]

    def local_nodes(self) -> list[Node]:
        """The nodes run by this machine's supervisor: on this machine, with no Ray node."""
        agents = {n.name for n in self.agent_nodes()}
        return [n for n in self.fleet.nodes if n.name in self._local and n.name not in agents]

    def not_connected(self) -> dict[str, str]:
        """Node -> why it does not run (no live Ray node there, and not this machine)."""
        running = {n.name for n in (*self.agent_nodes(), *self.local_nodes())}
        return {
            n.name: self.ray_fleet.connection(n.name).reason
            for n in self.fleet.nodes
            if n.name not in running
        }

    def plan(
        self,
        specs: Sequence[InferenceSpec],
        full: Plan,
        *,
        previous: Plan | None = None,
        memory_notes: Mapping[str, str] | None = None,
    ) -> ServedPlan:
        """The plan of the nodes that run: ``full`` itself when every node runs, else a plan
        of the fleet without the nodes not connected (or lost), whose moved and unplaced
        roles carry their reasons (:func:`~rosterd.up.plan_view.replanned_reasons`);
        ``previous`` (the plan in force, on a reload) and ``memory_notes`` as ``plan``'s.

        Raises:
            NothingToServeError: no node of the fleet runs.
        """
        absent = self.not_connected()
        running = [n for n in self.fleet.nodes if n.name not in absent and n.name not in self.lost]
        if not running:
            raise NothingToServeError(
                f"no node of the fleet is connected to the Ray cluster at {self.address} "
                "or is this machine; nothing to serve"
            )
        served = full
        moved: dict[str, str] = {}
        gone = {**absent, **self.lost}
        if gone:
            running_fleet = dataclasses.replace(self.fleet, nodes=tuple(running))
            served = plan(specs, running_fleet, previous, memory_notes=memory_notes)
            moved = replanned_reasons(full, served, gone)
            served = with_unplaced_reasons(served, moved)
        where: dict[str, str] = {}
        for node in self.fleet.nodes:
            conn = self.ray_fleet.connection(node.name)
            if conn.connected:
                where[node.name] = f"on Ray: {conn.reason}"
            elif node.name in absent:
                where[node.name] = f"not connected: {conn.reason}"
            else:
                where[node.name] = "this machine, no Ray node"
        by_role: dict[str, InferenceSpec] = {}
        for spec in specs:
            by_role.setdefault(spec.role, spec)
        self.served = ServedPlan(served, full, moved, where, by_role)
        return self.served

    def print_not_connected(self) -> None:
        """Say which nodes are not connected and where their roles went."""
        served = self.served
        for node, why in self.not_connected().items():
            self.out.print(
                Text(f"node {node} is not connected to the Ray cluster: {why}", style="yellow"),
                soft_wrap=True,
            )
            if served is None:
                continue
            for role, was in served.full.placements.items():
                if was == node and role in served.moved:
                    self.out.print(Text(f"  role {role}: {served.moved[role]}"), soft_wrap=True)

    # ---- agents and loss ---------------------------------------------------------------

    async def start_agents(
        self,
        specs_of: Mapping[str, Mapping[str, InferenceSpec]],
        *,
        repos: Mapping[str, str | None],
        on_event: Callable[[BackendEvent], None],
        state_root: str | None,
        auto_ports: bool,
        model_names: Mapping[str, str] | None = None,
        grace_s: float,
    ) -> dict[str, AgentBackends]:
        """Start the agent of every agent node that has none and is not lost (concurrently);
        node -> its backends boundary, for every agent running.

        ``specs_of``: node -> the roles planned on it; ``on_event`` hears the backend
        events of every node but those of a lost one (its loss reaches
        :meth:`on_node_lost` instead). Agents started before one failed are closed
        by :meth:`close`.

        Raises:
            NodeLostError, NodeAgentError, StateDirLockedError: as ``RayFleet.start_agent``.
        """

        def forward(node: str) -> Callable[[BackendEvent], None]:
            def heard(event: BackendEvent) -> None:
                agent = self.agents.get(node)
                if agent is not None and agent.lost_reason is not None:
                    # Its backends died with the node: the loss, not a crash, says so.
                    self.on_node_lost(node, agent.lost_reason)
                    return
                on_event(event)

            return heard

        async def start(node: str) -> None:
            self.agents[node] = await self.ray_fleet.start_agent(
                node,
                specs_of.get(node, {}),
                repos=repos,
                model_names=model_names,
                on_event=forward(node),
                state_root=state_root,
                auto_ports=auto_ports,
                grace_s=grace_s,
            )

        starting = [n.name for n in self.agent_nodes() if n.name not in {*self.agents, *self.lost}]
        # Every start runs to its end, so that none registers an agent after a failure
        # was reported (the caller closes the agents it did not want).
        results = await asyncio.gather(*(start(name) for name in starting), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return dict(self.agents)

    async def node_schedulers(
        self,
        specs: Mapping[str, InferenceSpec],
        *,
        repos: Mapping[str, str | None],
        on_event: Callable[[BackendEvent], None],
        options: UpOptions,
        metrics: RosterdMetrics,
        state_root: str | None,
        memory: RosterMemory | None = None,
        model_names: Mapping[str, str] | None = None,
    ) -> dict[str, NodeScheduler]:
        """Start the agents (:meth:`start_agents`) and give each agent node its scheduler,
        over that agent's backends boundary, for the roles the served plan puts there.

        ``specs``: role -> spec; ``options``: the run's limits, ports and grace;
        ``memory``: each role then counts its figure on its node
        (``RosterMemory.node_specs``), ``/status`` shows the figures, and the node's
        ``max_concurrency`` (default: its roles' slots) holds, as on this machine;
        ``model_names``: role -> the roster's ``name`` (``SupervisorBackends``).
        Weights are resolved on the node when a role starts (a missing file is that
        load's error): this machine's files say nothing of another machine's.
        """
        assert self.served is not None, "plan() first"
        specs_of: dict[str, dict[str, InferenceSpec]] = {}
        for role, name in self.served.plan.placements.items():
            specs_of.setdefault(name, {})[role] = specs[role]
        self.memory = memory
        if memory is not None:
            specs_of = {name: memory.node_specs(s, name) for name, s in specs_of.items()}
        agents = await self.start_agents(
            specs_of,
            repos=repos,
            model_names=model_names,
            on_event=on_event,
            state_root=state_root,
            auto_ports=options.auto_backend_ports,
            grace_s=options.grace_s,
        )
        slots = memory.slots() if memory is not None else {}
        return {
            name: NodeScheduler(
                name,
                self.fleet.node(name).capacity_bytes,
                specs_of.get(name, {}),
                backends,
                limits=options.limits,
                metrics=metrics,
                pids_are_local=False,
                concurrency=NodeConcurrency(self.fleet.node(name).max_concurrency, slots),
                memory={
                    role: memory.roles[role].as_json(name)
                    for role in specs_of.get(name, {})
                    if role in memory.roles
                }
                if memory is not None
                else None,
            )
            for name, backends in agents.items()
        }

    def watch(
        self,
        scheduler: Scheduler,
        *,
        after_plan: Callable[[], None] | None = None,
        on_back: Callable[[str], None] | None = None,
    ) -> None:
        """Report lost nodes to :meth:`on_node_lost` from now on (``RayFleet.watch``).

        ``after_plan`` runs after each re-plan's solver returned (``rosterd up`` puts
        its signal handlers back there, as after a reload's plan); ``on_back(node)``
        runs once when a lost node's address has a live Ray node again (``rosterd up``
        reloads then, which takes the node back: :meth:`take_back`).
        """
        self.scheduler = scheduler
        if after_plan is not None:
            self._after_plan = after_plan

        def back(node: str) -> None:
            log.warning("node %s is back on the Ray cluster", node)
            self.out.print(Text(f"node {node} is back on the Ray cluster", style="green"))
            if on_back is not None:
                on_back(node)

        if self._watch is None:
            self._watch = asyncio.create_task(
                self.ray_fleet.watch(self._on_lost, on_back=back), name="rosterd-ray-watch"
            )

    def take_back(self, node: str) -> Callable[[], None]:
        """Take lost ``node`` back (a reload found its Ray node live again): it is no longer
        lost, and its next agent may start (:meth:`start_agents`). Returns the undo, for a
        reload refused after this."""
        lost, agent = self.lost.pop(node, None), self.agents.pop(node, None)
        ray_lost, ray_agent = self.ray_fleet.lost.get(node), self.ray_fleet.agents.get(node)
        self.ray_fleet.forget_lost(node)

        def undo() -> None:
            if lost is not None:
                self.lost[node] = lost
            if agent is not None:
                self.agents[node] = agent
            self.ray_fleet.restore_lost(node, ray_lost, ray_agent)

        return undo

    def _on_lost(self, lost: NodeLost) -> None:
        self.on_node_lost(lost.node, lost.reason)

    def on_node_lost(self, node: str, reason: str) -> None:
        """What a run does when fleet node ``node`` is lost (``reason``: why); idempotent.

        The node's scheduler marks its roles ``lost`` (recorded in
        ``/rosterd/events`` with the reason; requests waiting for them, and new
        ones, wait up to their queue timeout), the loss is logged and printed,
        and :meth:`replan_lost` runs in the background (one re-plan at a time).
        """
        if node in self.lost:
            return
        self.lost[node] = reason
        roles = sorted(self.served.plan.placements) if self.served else []
        mine = [r for r in roles if self.served and self.served.plan.placements[r] == node]
        log.warning(
            "%s; its roles are lost: %s (waiting requests wait for the re-plan)",
            reason,
            ", ".join(mine) or "none",
        )
        self.out.print(
            Text(f"{reason}; its roles are lost: {', '.join(mine) or 'none'}", style="red"),
            soft_wrap=True,
        )
        scheduler = self.scheduler
        if scheduler is not None and node in scheduler.nodes:
            scheduler.nodes[node].node_lost(reason)
            task = asyncio.get_running_loop().create_task(
                self._replan_soon(node), name=f"rosterd-replan-{node}"
            )
            self._replans.add(task)
            task.add_done_callback(self._replans.discard)

    async def _replan_soon(self, node: str) -> None:
        async with self.replan_lock:
            try:
                await self.replan_lost(node)
            except Exception:  # the run goes on; the roles stay lost and their requests time out
                log.exception("re-planning after the loss of node %s failed", node)

    async def replan_lost(self, node: str) -> dict[str, tuple[str, str]]:
        """Serve lost node ``node``'s roles on the nodes that still run; role -> (from, to)
        of every role moved (``PlanChange.moved``).

        The fleet without the lost and not connected nodes is planned with the plan
        in force as ``previous`` (sticky roles stay where they are). Each node that
        takes a role learns its spec first (``AgentBackends.add_roles``, or
        ``SupervisorBackends.add_specs`` for this machine's nodes); then one
        ``Scheduler.apply_plan`` swaps the plan: requests waiting for a moved role
        are queued on its new node; a role that fits nowhere stays ``lost`` on
        ``node`` with its reason. Each is logged, printed and recorded (``moved``,
        ``unplaced``) in ``/rosterd/events``.

        Raises:
            NodeLostError, NodeAgentError: a node that takes a role failed to learn it.
        """
        served, scheduler = self.served, self.scheduler
        if served is None or scheduler is None or node not in scheduler.nodes:
            return {}  # (a reload left the node out meanwhile: nothing of it to move)
        absent = self.not_connected()
        running = [
            n
            for n in self.fleet.nodes
            if n.name not in absent and n.name not in self.lost and n.name in scheduler.nodes
        ]
        specs = list(served.specs.values())
        fleet = dataclasses.replace(self.fleet, nodes=tuple(running))
        try:
            # The solver runs up to its time limit: off the loop, which keeps serving.
            new = await asyncio.to_thread(plan, specs, fleet, served.plan)
        finally:
            self._after_plan()
        unplaced = dict(new.unplaced)
        why = self.lost[node]
        placements: dict[str, str] = {}
        for role, was in served.plan.placements.items():
            to = new.placements.get(role)
            if to is None and was not in self.lost:
                to = was  # not placed any more (a role of a node lost before): leave it
            placements[role] = to if to is not None else was  # unplaced: stays lost there
        memory = self.memory

        def node_specs(name: str, roles: Sequence[str]) -> dict[str, InferenceSpec]:
            specs = {r: served.specs[r] for r in roles}
            return memory.node_specs(specs, name) if memory is not None else specs

        wanted: dict[str, dict[str, InferenceSpec]] = {}
        for role, name in placements.items():
            if name in self.lost or scheduler.nodes[name].specs.get(role) is not None:
                continue
            wanted.setdefault(name, {}).update(node_specs(name, [role]))
        for name, added in wanted.items():
            backends = scheduler.nodes[name].backends
            if isinstance(backends, AgentBackends):
                await backends.add_roles(added)
            elif isinstance(backends, SupervisorBackends):
                backends.add_specs(added)
        configs: dict[str, NodeConfig] = {}
        for name, current in scheduler.nodes.items():
            roles = [r for r, n in placements.items() if n == name]
            configs[name] = NodeConfig(
                name,
                current.capacity_bytes,
                {r: current.specs.get(r) or spec for r, spec in node_specs(name, roles).items()},
                current.backends,
                current.unavailable,
                memory={r: memory.roles[r].as_json(name) for r in roles if r in memory.roles}
                if memory is not None
                else {},
            )
        change = scheduler.apply_plan(configs)  # one step: requests follow their roles
        self.replanned_at[node] = time.monotonic()
        lost_node = scheduler.nodes[node]
        for role, (old, to) in sorted(change.moved.items()):
            cause = f"moved to node {to}: " + self.lost.get(old, f"a re-plan after {why}")
            self._say("moved", lost_node if old == node else scheduler.nodes[to], role, cause)
        for role, was in sorted(served.plan.placements.items()):
            if was == node and placements[role] == node:
                cause = f"{why}, and it does not fit on the remaining nodes: " + unplaced.get(
                    role, "no remaining node runs it"
                )
                self._say("unplaced", lost_node, role, cause)
        moved = {r: f"{c}" for r, c in served.moved.items()}
        moved |= {
            r: f"planned on node {to}: node {old} is lost" for r, (old, to) in change.moved.items()
        }
        self.served = dataclasses.replace(
            served,
            plan=dataclasses.replace(new, placements=placements),
            moved=moved,
        )
        return dict(change.moved)

    def _say(self, kind: str, node: NodeScheduler, role: str, cause: str) -> None:
        log.warning("role %s: %s", role, cause)
        self.out.print(Text(f"role {role}: {cause}", style="yellow"), soft_wrap=True)
        node.record(kind, role, cause)

    # ---- views and the end -------------------------------------------------------------

    def node_views(self) -> dict[str, dict[str, object]]:
        """What ``/status``, ``rosterd ps`` and ``/metrics`` show of every fleet node,
        connected or not (:func:`rosterd.up.ray_views.node_views`)."""
        from rosterd.up.ray_views import node_views

        return node_views(self)

    async def close(self) -> None:
        """Stop watching and re-planning, end every agent (their backends stop), leave the
        cluster."""
        for task in list(self._replans):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        try:
            await self.ray_fleet.close()
        finally:
            disconnect()
