"""The fleet's syscall table for one ``rosterd up`` (layer 8): the fleet scheduler's effects
applied to this run's world (``rosterd.fleet_scheduler.loop.FleetEffects``).

:class:`UpFleetEffects` holds what the effects act on and nothing they decide on:
the node schedulers (:class:`~rosterd.scheduler.directory.NodeDirectory`), the routes, each node's
backends (this machine's ``SupervisorBackends`` over one
:class:`~rosterd.backends.node_host.NodeHost`, or a node agent's ``AgentBackends``
over Ray), the peak recorders and the warm-up. Which node runs what, which is lost
and which agents should run is the fleet machine's to know; this class is told.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rosterd.adapters import adapter_for
from rosterd.backends.copy_names import role_of_backend
from rosterd.backends.interface import NodeBackends, PeakSource, RoleBackends
from rosterd.backends.local import SupervisorBackends
from rosterd.backends.node_host import NodeHost
from rosterd.errors import RosterdError, SchedulerError
from rosterd.flavors import WeightsKind
from rosterd.fleet.model import ModelSource
from rosterd.fleet_scheduler.effects import (
    ApplyPlan,
    DropAgents,
    Level,
    MarkLost,
    Record,
    Routes,
    Say,
    ShowPlan,
    Solve,
    StartAgents,
    Teach,
    Warm,
)
from rosterd.fleet_scheduler.events import AgentsStarted, Taught
from rosterd.fleet_scheduler.values import NodeRun, NodeServing, ServedConfig
from rosterd.memory.gathering import serving_settings
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.memory.watch import PeakRecorder, follow_peaks
from rosterd.metrics import RosterdMetrics
from rosterd.node_agent import AgentBackends, AgentConfig
from rosterd.placement import Plan, plan
from rosterd.ray_cluster import RayCluster
from rosterd.ray_match import RayNode
from rosterd.router import RoleRoute, RouteTable
from rosterd.router.routing import LoadProgressMode
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeConcurrency
from rosterd.spec import InferenceSpec
from rosterd.supervisor import BackendEvent
from rosterd.up.config import serving_facts
from rosterd.up.devices import RunDevices
from rosterd.up.options import UpOptions
from rosterd.up.report import Reporter, backend_event_text, plan_table

log = logging.getLogger("rosterd.fleet")

_LOG_LEVELS = {
    Level.INFO: logging.INFO,
    Level.OK: logging.INFO,
    Level.NOTICE: logging.WARNING,
    Level.WARNING: logging.WARNING,
    Level.ERROR: logging.ERROR,
}


def role_routes(placements: Mapping[str, str], config: ServedConfig) -> dict[str, RoleRoute]:
    """Role -> its route, for each role ``placements`` (role -> node) serves: the names a
    request may give it (model name, aliases), the flavor's request rewrite, the dialects
    its backend answers (``config.dialects``: rerank for a reranker only), and what
    ``/v1/models`` says of it."""
    by_role = config.first_by_role()
    aliases: dict[str, list[str]] = {}
    for alias, role in config.roster.aliases.items():
        aliases.setdefault(role, []).append(alias)
    routes: dict[str, RoleRoute] = {}
    for role, node in sorted(placements.items()):
        s = by_role[role]
        names = [n for n in (s.spec.model, s.name) if n and n != role]
        names += aliases.get(role, [])
        adapter = adapter_for(s.spec.flavor)
        models = config.fleet.models
        source = models.get(role) or models.get(s.spec.model or "")  # as resolve_weights
        routes[role] = RoleRoute(
            role=role,
            names=tuple(dict.fromkeys(names)),
            rewrite=adapter.rewrite_request,
            flavor=s.spec.flavor.value,
            native=config.dialects.get(role, adapter.dialects_for(None)),
            flavor_dialects=adapter.native_dialects,
            ollama_api=adapter.serves_ollama_api,
            progress=adapter.progress_probe,
            load_progress=(
                LoadProgressMode(source.load_progress)
                if source is not None and source.load_progress is not None
                else None
            ),
            ctx_size=launched_ctx_size(s.spec, config.fleet.entry_of(role, s.spec.model)),
            info={
                "node": node,
                "latency_class": s.spec.latency_class.value,
                "sticky": s.spec.sticky,
                "resident_bytes": s.spec.memory.resident_bytes,
            },
        )
    return routes


def launched_ctx_size(spec: InferenceSpec, entry: ModelSource | None) -> int | None:
    """The context ``spec``'s backend is launched with, tokens: its fleet ``models:`` entry's
    ``ctx_size``, else, for a flavor launched on a GGUF file (llama-server's ``--ctx-size``),
    the adapter's default; ``None`` where the backend sizes it itself (mlx_lm, ollama)."""
    if entry is not None and entry.ctx_size is not None:
        return entry.ctx_size
    if spec.flavor.facts.weights is WeightsKind.GGUF_FILE:
        return serving_settings(None)[0]
    return None


class UpFleetEffects:
    """The fleet scheduler's effects on one run (see the module).

    ``options``: the run's; ``reporter``: where it says things; ``metrics``: the
    run's Prometheus metrics; ``host``: this machine's nodes' backends; ``cluster``:
    the joined Ray cluster (``None``: no Ray); ``state_dir``: the run's state folder
    (peaks are kept there, agents' too); ``after_plan()`` runs after every solve
    (``rosterd up`` sets its signal handlers again there); ``on_lost(node, why)``
    hears a node agent found dead by a call to it.
    """

    def __init__(
        self,
        options: UpOptions,
        *,
        reporter: Reporter,
        metrics: RosterdMetrics,
        host: NodeHost,
        cluster: RayCluster | None,
        state_dir: Path,
        after_plan: Callable[[], None] = lambda: None,
        on_lost: Callable[[str, str], None] = lambda node, why: None,
    ) -> None:
        self.options = options
        self.reporter = reporter
        self.metrics = metrics
        self.host = host
        self.cluster = cluster
        self.state_dir = state_dir
        self.after_plan = after_plan
        self.on_lost = on_lost
        self.scheduler = NodeDirectory({}, new_node=self._new_node)
        self.routes = RouteTable({}, {})
        self._local: dict[str, SupervisorBackends] = {}
        self._agents: dict[str, AgentBackends] = {}
        self._devices_said: set[str] = set()  # the devices' warnings, each said once a run
        self._taught: dict[str, SupervisorBackends] = {}  # a change's, until it is applied
        self._config: ServedConfig | None = None
        self._taught_config: ServedConfig | None = None
        self._recorders: list[PeakRecorder] = []
        self._peaks = MeasuredPeaks(state_dir)
        self._background: set[asyncio.Task[None]] = set()
        self._applying: dict[str, NodeBackends] = {}  # each node's backends, as a plan is applied
        self._serving = False
        self._warm_later: list[str] = []
        self.devices = RunDevices()  # the nodes' pools, found at the first plan

    # ---- backends events --------------------------------------------------------------

    def backend_event(self, event: BackendEvent, *, node: str | None = None) -> None:
        """A backend event of this machine's supervisor, or of a live node agent's: say it,
        and tell the node schedulers (crashes and restarts change what they serve); a
        copy's (``<role>@<node>``) only its node's, as an event of the role. ``node``: the
        node whose agent sent it (an agent's backends are its node's alone, so a copy of the
        same role on another node is not told of this one's crash)."""
        text = backend_event_text(event)
        if text is not None:
            self.reporter.say(Level.INFO, text)
        role, copy_node = role_of_backend(event.name)
        if copy_node is not None:
            event = dataclasses.replace(event, name=role)
        self.scheduler.backend_event(event, node=copy_node or node)

    def copy_logs(self, role: str) -> dict[str, Path]:
        """Node -> the log file of ``role``'s copy there, for each node of this machine
        whose copy runs under its copy's name (``<role>@<node>``); empty for a role with one
        copy (its log is ``logs/<role>.log``, as ever)."""
        paths: dict[str, Path] = {}
        for node in self.scheduler.nodes_of(role):
            backends = self._local.get(node.name)
            if backends is not None and (name := backends.backend_name(role)) != role:
                paths[node.name] = self.host.supervisor.log_path(name)
        return paths

    def _agent_event(self, node: str) -> Callable[[BackendEvent], None]:
        def heard(event: BackendEvent) -> None:
            agent = self._agents.get(node)
            if agent is not None and agent.lost_reason is not None:
                return  # its backends died with the node: the loss says so, not a crash
            self.backend_event(event, node=node)

        return heard

    def _backends_of(self, node: str, run: NodeRun) -> NodeBackends:
        if run is NodeRun.LOCAL:
            return self._local[node]
        return self._agents[node]

    def _new_node(self, serving: NodeServing, backends: RoleBackends) -> NodeScheduler:
        node = self._config.fleet.node(serving.name) if self._config is not None else None
        return NodeScheduler(
            serving.name,
            serving.capacity_bytes,
            serving.specs,
            backends,
            limits=self.options.limits,
            metrics=self.metrics,
            unavailable=serving.unavailable,
            # a node agent's pids are processes of its node, not of this machine
            pids_are_local=self._applying[serving.name].pids_are_local,
            concurrency=serving.concurrency
            or NodeConcurrency(node.max_concurrency if node is not None else None, {}),
            memory=serving.memory,
            devices=serving.devices,
        )

    # ---- the effects ------------------------------------------------------------------

    async def solve(self, effect: Solve) -> tuple[Plan, Plan]:
        """The plans of ``effect``, the solver run off the loop (up to its time limit); each
        node's pools found first (a joined agent's probed on its node)."""
        said = list(await self.devices.probe_agents(effect.fleet, self._agents))
        # A re-probe on a reload must not count this run's own backends as others' memory.
        own_pids = frozenset(
            role.pid
            for name, entry in self.scheduler.snapshot().items()
            if name in self._local
            for role in entry.node.roles.values()
            if role.pid is not None
        )
        said += await asyncio.to_thread(self.devices.find_pools, effect.fleet, own_pids)
        for warning in dict.fromkeys(said):
            if warning not in self._devices_said:  # a node probed here, then by its agent
                self._devices_said.add(warning)
                self.reporter.say(Level.WARNING, warning)
        fleet = self.devices.counted(effect.fleet)
        running = dataclasses.replace(
            fleet, nodes=tuple(n for n in fleet.nodes if n.name in effect.running)
        )
        notes = dict(effect.memory_notes)
        needs = (
            self.devices.needs(effect.config.memory, fleet, effect.specs) if effect.config else None
        )
        try:
            served = await asyncio.to_thread(
                plan, effect.specs, running, effect.previous, memory_notes=notes, device_needs=needs
            )
            served = self.devices.place(effect.specs, running, served, needs)
            full = served
            if effect.whole and len(running.nodes) < len(fleet.nodes):
                full = await asyncio.to_thread(
                    plan,
                    effect.specs,
                    fleet,
                    effect.previous,
                    memory_notes=notes,
                    device_needs=needs,
                )
        finally:
            self.after_plan()
        return full, served

    async def start_agents(
        self, effect: StartAgents
    ) -> tuple[AgentsStarted, Sequence[BaseException]]:
        """Start the agents of ``effect`` concurrently, each to its end."""
        cluster = self.cluster
        facts = serving_facts(effect.config)
        state_root = str(self.state_dir) if self.options.state_dir is not None else None

        async def start(name: str) -> None:
            assert cluster is not None, "agents need a Ray cluster"
            serving = effect.nodes[name]
            config = AgentConfig(
                node=name,
                host=effect.config.fleet.node(name).address,
                specs=dict(serving.specs),
                facts=facts,
                state_root=state_root,
                auto_ports=self.options.auto_backend_ports,
                grace_s=self.options.grace_s,
                kv_disk_bytes=self.options.kv_disk_bytes,
            )
            self._agents[name] = await cluster.start_agent(
                config,
                effect.ray_node_ids[name],
                on_event=self._agent_event(name),
                on_lost=self.on_lost,
            )

        names = sorted(effect.nodes)
        results = await asyncio.gather(*(start(n) for n in names), return_exceptions=True)
        failed: dict[str, str] = {}
        errors: list[BaseException] = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # a cancellation, not a failed start
                failed[name], errors = str(result), [*errors, result]
        started = tuple(n for n in names if n not in failed)
        return AgentsStarted(started, failed), errors

    async def drop_agents(self, effect: DropAgents) -> None:
        """End the agents of ``effect``'s nodes (their backends stop)."""
        agents = [a for n in effect.nodes if (a := self._agents.pop(n, None)) is not None]
        await asyncio.gather(*(a.close() for a in agents), return_exceptions=True)

    async def teach(self, effect: Teach) -> tuple[Taught, Sequence[BaseException]]:
        """Each node learns what it serves: this machine's nodes get backends of their own
        for a new configuration (or learn the roles moved to them); agents reconfigure."""
        facts = serving_facts(effect.config)
        self._taught, self._taught_config = {}, effect.config
        agents: list[tuple[str, AgentBackends]] = []
        for name, serving in effect.nodes.items():
            if serving.run is NodeRun.LOCAL:
                if effect.new_config or name not in self._local:
                    address = effect.config.fleet.node(name).address
                    self._taught[name] = self.host.backends(name, address, serving.specs, facts)
                else:
                    self._local[name].add_specs(serving.specs)
            elif serving.run is NodeRun.AGENT and name in self._agents:
                agents.append((name, self._agents[name]))
        # An agent's launches are pinned to their devices as this machine's are.
        results = await asyncio.gather(
            *(
                a.reconfigure(effect.nodes[n].specs, facts, self.devices.pins(effect.nodes[n]))
                for n, a in agents
            ),
            return_exceptions=True,
        )
        failed: dict[str, str] = {}
        errors: list[BaseException] = []
        for (name, _), result in zip(agents, results, strict=True):
            if isinstance(result, RosterdError):
                failed[name], errors = str(result), [*errors, result]
            elif isinstance(result, BaseException):
                raise result
        return Taught(failed), errors

    def apply_plan(self, effect: ApplyPlan) -> Mapping[str, object]:
        """Serve ``effect``'s nodes from now on, in one step; what changed."""
        self._local.update(self._taught)
        self._taught = {}
        if self._taught_config is not None:
            self._config = self._taught_config
        nodes = {n: self.devices.serving(s) for n, s in effect.nodes.items()}
        for name, serving in nodes.items():
            if serving.run is NodeRun.LOCAL and name in self._local:
                self._local[name].pins = self.devices.pins(serving)
        self._applying = {n: self._backends_of(n, s.run) for n, s in nodes.items()}
        change = self.scheduler.apply_plan(
            nodes, self._applying, restart=effect.restart, replace=effect.replace
        )
        self._follow_peaks()
        return dict(change.as_json())

    def _follow_peaks(self) -> None:
        """Each node's backends report the peaks of what they start (this machine's, or a
        node agent's, sampled on its node), under the configuration's fingerprints."""
        if self._config is None:
            return
        sources: dict[str, PeakSource] = {**self._local, **self._agents}
        self._recorders.extend(
            follow_peaks(
                self.scheduler.nodes,
                {n: s for n, s in sources.items() if n in self.scheduler.nodes},
                self._recorders,
                self._config.memory.fingerprints(),
                self._peaks,
                on_error=lambda message: self.reporter.say(Level.WARNING, message),
            )
        )

    def route(self, effect: Routes) -> None:
        """Route by ``effect`` from now on."""
        self.routes.replace(role_routes(effect.placements, effect.config), effect.unserved)

    def mark_lost(self, effect: MarkLost) -> None:
        """The node is lost: its agent ends (Ray may declare a node dead that still runs)
        and its scheduler marks its roles ``lost``."""
        agent = self._agents.get(effect.node)
        if agent is not None:
            agent.lost(effect.reason)
        node = self.scheduler.nodes.get(effect.node)
        if node is not None:
            node.node_lost(effect.reason)

    def record(self, effect: Record) -> None:
        """A change decided for the fleet: in the node's event log, the log and the output."""
        node = self.scheduler.nodes.get(effect.node)
        if node is not None:
            node.record(effect.kind, effect.role, effect.cause)
        self.reporter.say(Level.NOTICE, f"role {effect.role}: {effect.cause}")

    def say(self, effect: Say) -> None:
        """One line to the operator, or to the log only."""
        if effect.log_only:
            log.log(_LOG_LEVELS[effect.level], "%s", effect.text)
        else:
            self.reporter.say(effect.level, effect.text)

    def show_plan(self, effect: ShowPlan) -> None:
        """The plan the run starts with, as a table."""
        self.reporter.plan(plan_table(effect))

    def warm(self, effect: Warm) -> None:
        """Load ``effect.roles`` one by one in the background, evicting nothing (once the
        router serves: :meth:`serving_started`)."""
        if not self._serving:
            self._warm_later.extend(effect.roles)
            return
        task = asyncio.get_running_loop().create_task(self._warm(effect.roles), name="rosterd-warm")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def serving_started(self) -> None:
        """The router serves: the warm-up asked for before it begins now."""
        self._serving = True
        roles, self._warm_later = tuple(self._warm_later), []
        if roles:
            self.warm(Warm(roles))

    async def _warm(self, roles: Sequence[str]) -> None:
        for role in roles:
            try:
                await self.scheduler.load(role, no_evict=True)
            except SchedulerError as exc:
                self.reporter.say(Level.INFO, f"not loaded at start: {role}: {exc}")

    # ---- Ray, and the end -------------------------------------------------------------

    def watch_cluster(self, seen: Callable[[Sequence[RayNode]], None]) -> None:
        """Hand every look at the Ray cluster's nodes to ``seen`` from now on."""
        if self.cluster is not None:
            task = asyncio.get_running_loop().create_task(
                self.cluster.watch(seen), name="rosterd-ray-watch"
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """After the node schedulers stopped: the warm-up and the watch end, the recorders
        store the last peaks, every agent ends (its backends stop)."""
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for recorder in self._recorders:  # the backends sampled their peaks before they stopped
            await recorder.finish()
        agents, self._agents = list(self._agents.values()), {}
        await asyncio.gather(*(a.close() for a in agents), return_exceptions=True)
