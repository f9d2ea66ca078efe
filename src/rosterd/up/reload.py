"""The configuration a ``rosterd up`` serves, and its reload without restart (layer 8): a
running ``up`` re-reads its roster, overlay and fleet, and applies the change only if it
is valid.

:func:`served_config` turns an imported roster, a fleet and a plan into what this
process serves (:class:`Served`: one ``NodeConfig`` per local node); ``up`` uses it
at start, and :class:`ConfigReloader` on every reload.

A reload (``POST /rosterd/reload``, SIGHUP, or ``--watch`` noticing a file
changed) imports the roster and overlay, reads the fleet, gathers every role's
memory figures again (:func:`plan_config`: the largest of ``ram_gb``, the
estimate and the measured peak, as at start), plans with the plan in force as
``previous`` (sticky roles stay on their node), resolves the weights, and only
then applies the result in one step:
``Scheduler.apply_plan`` and ``RouteTable.replace``. New roles become
routable, removed roles drain and stop, roles whose launch changed restart
when idle, the others keep running. A file that does not import, read or plan
leaves the running configuration as it is; the error, with its file, line and
column, goes to the log, to ``/status`` (``config.last_error``) and to the
reload's caller.

``--watch`` polls the three files every :data:`WATCH_INTERVAL_S` seconds (their
size, mtime and inode, then their bytes): three small files need no watcher
library, and polling by path keeps working when an editor replaces a file by
renaming a new one over it, which an inotify watch on the old file misses.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from rosterd.adapters import WeightsSource, adapter_for
from rosterd.backends.local import SupervisorBackends
from rosterd.errors import (
    InputError,
    NothingToServeError,
    ReloadRefusedError,
    RosterdError,
    WeightsError,
)
from rosterd.fleet import Fleet, Node
from rosterd.fleet.local import local_fleet
from rosterd.fleet.reader import load_fleet
from rosterd.memory.gathering import RosterMemory
from rosterd.placement import Plan, plan
from rosterd.roster import ImportedRoster, load_roster
from rosterd.router import RouteTable
from rosterd.scheduler.fleet import NodeConfig, Scheduler
from rosterd.scheduler.values import NodeConcurrency
from rosterd.spec import InferenceSpec
from rosterd.supervisor import Supervisor
from rosterd.up.plan_view import (
    check_ports,
    first_by_role,
    is_local_address,
    role_routes,
    unserved_reasons,
)
from rosterd.weights import resolve_for_fleet

if TYPE_CHECKING:
    from rosterd.up.ray_fleet import UpFleet
    from rosterd.up.runtime import UpOptions

log = logging.getLogger("rosterd.reload")

#: How often ``--watch`` looks at the roster, overlay and fleet files, seconds.
WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Served:
    """What one configuration gives this process: the ``roster``, the ``fleet``, the
    ``plan`` (``result``), the fleet nodes that are this machine (``local_nodes``),
    each one's :class:`NodeConfig` (``nodes``), each role's weights (``weights``:
    role -> where they are; ``None`` for a flavor that keeps its own, or missing)
    the memory figures gathered for it (``memory``; ``None``: the specs' own) and the
    nodes whose scheduler starts afresh (``replaced_nodes``: a Ray node lost, then back)."""

    roster: ImportedRoster
    fleet: Fleet
    result: Plan
    local_nodes: tuple[Node, ...]
    nodes: Mapping[str, NodeConfig]
    weights: Mapping[str, WeightsSource | None]
    memory: RosterMemory | None = None
    replaced_nodes: tuple[str, ...] = ()

    def fingerprints(self) -> dict[str, str]:
        """Role -> its run fingerprint (``RoleMemory.fingerprint``), for the peak recorders."""
        if self.memory is None:
            return {}
        return {role: m.fingerprint for role, m in self.memory.roles.items()}


def read_config(options: UpOptions) -> tuple[ImportedRoster, Fleet]:
    """Import the roster (with its overlay) and read the fleet of ``options``.

    Raises:
        RosterError, FleetError: a file is rejected (file, line and column named).
    """
    roster = load_roster(options.roster_path, options.overlay_path)
    fleet = load_fleet(options.fleet_path) if options.fleet_path is not None else local_fleet()
    return roster, fleet


async def plan_config(
    roster: ImportedRoster,
    fleet: Fleet,
    previous: Plan | None,
    options: UpOptions,
    memory: RosterMemory,
    *,
    after_plan: Callable[[], None] = lambda: None,
) -> Plan:
    """The plan of ``roster`` on ``fleet`` as ``up`` makes it: each role counting its
    planning figure from ``memory`` (unplaced reasons name both numbers), ``previous``
    kept where it still fits, then the port check unless ``options`` has
    ``--auto-backend-ports``. The solver runs in a thread (up to its time limit),
    so the loop keeps serving; ``after_plan()`` runs once it returned."""
    specs = memory.planning_specs(s.spec for s in roster.specs)
    try:
        result = await asyncio.to_thread(
            plan, specs, fleet, previous, memory_notes=memory.reason_notes()
        )
    finally:
        after_plan()
    if not options.auto_backend_ports:  # the same port check as at start
        result = check_ports(result, roster, fleet, router_port=options.port)
    return result


def refuse_lost_weights(old: Served, new: Served) -> None:
    """Refuse a configuration in which a role has weights it cannot use (missing, not
    allowed) that it did not have in ``old``: the running backend would be stopped for a
    role that cannot start again. At start such a role is served as unavailable instead.

    Raises:
        ReloadRefusedError: naming each such role and why, and that nothing changed.
    """
    before = {r for config in old.nodes.values() for r in config.unavailable}
    lost = {
        role: why
        for config in new.nodes.values()
        for role, why in config.unavailable.items()
        if role not in before
    }
    if lost:
        said = "; ".join(
            why if why.startswith(f"role {role}:") else f"role {role}: {why}"
            for role, why in sorted(lost.items())
        )
        raise ReloadRefusedError(f"{said}; the running configuration stays")


def retired_reasons(
    change: Mapping[str, object], roster: ImportedRoster, result: Plan
) -> dict[str, str]:
    """Role -> why a reload stopped serving it, for each role it retired and did not place
    elsewhere: the import's reason for skipping it, or the plan's for leaving it unplaced."""
    nodes = change.get("nodes")
    retired = {
        role
        for node in (nodes.values() if isinstance(nodes, dict) else ())
        if isinstance(node, dict)
        for role in node.get("retired", ())
    }
    skipped, unplaced = dict(roster.skipped), dict(result.unplaced)
    why: dict[str, str] = {}
    for role in sorted(retired - set(result.placements)):
        if role in skipped:
            why[role] = f"the roster import skips it: {skipped[role]}"
        elif role in unplaced:
            why[role] = f"unplaced: {unplaced[role]}"
        else:
            why[role] = "no longer in the roster"
    return why


def restarted_roles(old: Served, new: Served) -> list[str]:
    """Roles served by both whose launch changed outside their spec: their weights, or
    their run fingerprint (weights, ``ctx_size``, ``parallel``, ``extra_args``), so
    they restart once idle."""
    before, after = old.fingerprints(), new.fingerprints()
    roles = [r for r, w in new.weights.items() if r in old.weights and old.weights[r] != w]
    roles += [r for r, f in after.items() if r in before and before[r] != f]
    return sorted(set(roles))


def served_config(
    roster: ImportedRoster,
    fleet: Fleet,
    result: Plan,
    supervisor: Supervisor,
    *,
    auto_ports: bool,
    out: Console,
    local_nodes: Sequence[Node] | None = None,
    memory: RosterMemory | None = None,
) -> Served:
    """What ``result`` gives this process: one :class:`NodeConfig` per local node, over
    the roles planned there, with :class:`SupervisorBackends` on ``supervisor``
    (``auto_ports``: the OS picks backend ports); each role's weights are resolved
    now, and a role without them is printed on ``out`` and served as unavailable.
    ``local_nodes``: the nodes this machine's supervisor runs (with Ray: those that
    have no Ray node; may be none); default: every node whose address is this machine.
    ``memory``: each role then counts its memory figure on its node
    (``RosterMemory.node_specs``); without it, the spec's own.

    Raises:
        NothingToServeError: no ``local_nodes`` given and no node of the fleet is this machine.
    """
    if local_nodes is None:
        local_nodes = tuple(n for n in fleet.nodes if is_local_address(n.address))
        if not local_nodes:
            raise NothingToServeError("no node of the fleet is this machine; nothing to serve")
    local_nodes = tuple(local_nodes)
    by_role = first_by_role(roster)
    repos = {role: s.repo for role, s in by_role.items()}

    def weights_for(spec: InferenceSpec) -> WeightsSource:
        found = resolve_for_fleet(spec, fleet, repo=repos.get(spec.role) or None)
        if found is None:
            raise WeightsError(f"role {spec.role}: its flavor keeps its own weights")
        return found

    nodes: dict[str, NodeConfig] = {}
    weights: dict[str, WeightsSource | None] = {}
    for node in local_nodes:
        specs = {
            role: by_role[role].spec
            for role, name in result.placements.items()
            if name == node.name
        }
        if memory is not None:
            specs = memory.node_specs(specs, node.name)
        unavailable: dict[str, str] = {}
        for spec in specs.values():
            weights[spec.role] = None
            if adapter_for(spec.flavor).shared_server:
                continue  # ollama keeps its own weights: nothing to resolve
            try:
                weights[spec.role] = weights_for(spec)
            except RosterdError as exc:
                unavailable[spec.role] = str(exc)
                out.print(
                    Text(f"role {spec.role} is unavailable (requests get 503): {exc}", style="red")
                )
        backends = SupervisorBackends(
            supervisor,
            specs,
            host=node.address if node.address != "localhost" else "127.0.0.1",
            resolve_weights=weights_for,
            auto_ports=auto_ports,
            node=node.name,
            model_names={role: s.name for role, s in by_role.items()},
        )
        figures = (
            {r: memory.roles[r].as_json(node.name) for r in specs if r in memory.roles}
            if memory is not None
            else {}
        )
        nodes[node.name] = NodeConfig(
            node.name,
            node.capacity_bytes,
            specs,
            backends,
            unavailable,
            memory=figures,
            concurrency=NodeConcurrency(
                node.max_concurrency, memory.slots() if memory is not None else {}
            ),
        )
    return Served(roster, fleet, result, local_nodes, nodes, weights, memory)


def error_json(exc: RosterdError, at: float) -> dict[str, object]:
    """A refused reload as ``/status`` shows it: ``{"message", "file", "line", "column",
    "at"}`` (``file``/``line``/``column`` ``None`` when the error names no place;
    ``at``: seconds since the epoch)."""
    where = exc if isinstance(exc, InputError) else None
    return {
        "message": str(exc),
        "file": where.file if where else None,
        "line": where.line if where else None,
        "column": where.column if where else None,
        "at": at,
    }


def _fingerprint(paths: Iterable[Path]) -> tuple[object, ...]:
    """Size, mtime and inode of each of ``paths`` (``None`` for one that cannot be read)."""
    marks: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            marks.append(None)
            continue
        marks.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(marks)


def _digest(paths: Iterable[Path]) -> str:
    """A hash of the bytes of ``paths`` (a file that cannot be read counts as empty)."""
    h = hashlib.sha256()
    for path in paths:
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"\0unreadable")
        h.update(b"\0")
    return h.hexdigest()


class ConfigReloader:
    """The reload of one ``rosterd up`` run (see the module).

    ``served``: the configuration in force; ``await serve_config(roster, fleet,
    previous)`` builds a :class:`Served` from newly read files, planned with the
    plan in force as ``previous`` (gathering the memory figures, planning with
    :func:`plan_config`, resolving weights, making each node's backends; raises
    ``RosterdError`` when nothing can be served); ``on_applied(served, change)``
    runs after a change was applied (the peak recorders, the warm-up of new roles).
    """

    def __init__(
        self,
        options: UpOptions,
        served: Served,
        *,
        scheduler: Scheduler,
        routes: RouteTable,
        serve_config: Callable[[ImportedRoster, Fleet, Plan], Awaitable[Served]],
        on_applied: Callable[[Served, Mapping[str, object]], None] = lambda s, c: None,
    ) -> None:
        self.options = options
        self.served = served
        self.scheduler = scheduler
        self.routes = routes
        self._serve_config = serve_config
        self._on_applied = on_applied
        self._lock = asyncio.Lock()
        self.last_reload_at: float | None = None
        self.last_change: Mapping[str, object] | None = None
        self.last_error: dict[str, object] | None = None
        self._seen = _digest(self.paths)
        self._warned = set(served.roster.warnings)  # `up` said these at start

    @property
    def paths(self) -> tuple[Path, ...]:
        """The files a reload reads: the roster, then the overlay and fleet when given."""
        given = (self.options.roster_path, self.options.overlay_path, self.options.fleet_path)
        return tuple(p for p in given if p is not None)

    def status(self) -> dict[str, object]:
        """``/status``'s ``config``: ``{"files": {"roster", "overlay", "fleet"} (paths or
        None), "watch", "last_reload_at" (epoch seconds or None), "last_change",
        "last_error" (see :func:`error_json`, None after a reload that worked)}``."""
        o = self.options
        return {
            "files": {
                "roster": str(o.roster_path),
                "overlay": str(o.overlay_path) if o.overlay_path else None,
                "fleet": str(o.fleet_path) if o.fleet_path else None,
            },
            "watch": o.watch,
            "last_reload_at": self.last_reload_at,
            "last_change": self.last_change,
            "last_error": self.last_error,
        }

    async def reload(self) -> Mapping[str, object]:
        """Re-read, plan and apply the configuration; what changed (``PlanChange.as_json``).

        One reload at a time; a second caller waits for the first.

        Raises:
            RosterdError: the new configuration is refused (a file rejected, no
                node of the fleet is this machine); nothing changed.
        """
        async with self._lock:
            self._seen = _digest(self.paths)
            try:
                change = await self._reload()
            except RosterdError as exc:
                self.last_error = error_json(exc, time.time())
                log.error("reload refused, the running configuration stays: %s", exc)
                raise
            self.last_reload_at = time.time()
            self.last_change = change
            self.last_error = None
            return change

    async def _reload(self) -> Mapping[str, object]:
        roster, fleet = read_config(self.options)
        served = await self._serve_config(roster, fleet, self.served.result)
        refuse_lost_weights(self.served, served)
        result = served.result
        restart = restarted_roles(self.served, served)
        # One step, no await: the scheduler and the router change together.
        change = dict(
            self.scheduler.apply_plan(
                served.nodes, restart=restart, replace=served.replaced_nodes
            ).as_json()
        )
        why = retired_reasons(change, roster, result)
        if why:
            change["why"] = why
            for role, reason in why.items():
                log.warning("reload: role %s is no longer served: %s", role, reason)
        self.routes.replace(
            role_routes(self.scheduler.roles, roster, result),
            unserved_reasons(result, roster, served.nodes),
        )
        self.served = served
        for warning in roster.warnings:
            if warning not in self._warned:  # said once per run, not again at every reload
                self._warned.add(warning)
                log.warning("reload: %s", warning)
        log.info("reloaded %s: %s", ", ".join(map(str, self.paths)), _summary(change))
        self._on_applied(served, change)
        return change

    async def try_reload(self) -> None:
        """:meth:`reload`, its refusal only logged and kept for ``/status`` (SIGHUP, watch)."""
        with contextlib.suppress(RosterdError):  # logged and shown in /status by reload()
            await self.reload()

    async def watch(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Reload whenever the files' bytes change (looked at every ``interval_s``); runs
        until cancelled. A refused change is not tried again until the files change."""
        marks = _fingerprint(self.paths)
        while True:
            await asyncio.sleep(interval_s)
            now = _fingerprint(self.paths)
            if now == marks:
                continue
            marks = now
            if _digest(self.paths) != self._seen:
                await self.try_reload()


def _summary(change: Mapping[str, object]) -> str:
    """What a change did, in words for the log."""
    if not change.get("changed"):
        return "nothing changed"
    parts: list[str] = []
    nodes = change.get("nodes")
    for name, node in (nodes if isinstance(nodes, dict) else {}).items():
        said = [
            f"{k} {', '.join(node[k])}"
            for k in ("added", "retired", "restarted", "updated")
            if node.get(k)
        ]
        capacity = node.get("capacity_bytes")
        if isinstance(capacity, list):
            said.append(f"capacity {capacity[0] / 2**30:.2f} -> {capacity[1] / 2**30:.2f} GiB")
        if said:
            parts.append(f"node {name}: {'; '.join(said)}")
    for key in ("added_nodes", "drained_nodes"):
        value = change.get(key)
        if isinstance(value, list) and value:
            parts.append(f"{key.replace('_', ' ')}: {', '.join(value)}")
    return "; ".join(parts)


def status_extra(reloader: ConfigReloader, ray: UpFleet | None) -> dict[str, object]:
    """What ``/status`` adds to the scheduler's view: unplaced roles, remote nodes, the
    solver, the configuration (files, last reload, its error), and with Ray its
    address and the roles re-planned off nodes not connected."""
    served = reloader.served
    local = set(reloader.scheduler.nodes)  # the nodes this process runs, by Ray or not
    # With Ray, a node's loss re-plans between reloads: its plan is the one in force.
    result = ray.served.plan if ray is not None and ray.served is not None else served.result
    extra: dict[str, object] = {
        "unplaced": [list(u) for u in result.unplaced],
        "remote_nodes": [
            {"node": n.name, "address": n.address, "served_here": False}
            for n in served.fleet.nodes
            if n.name not in local
        ],
        "plan_solver": result.solver,
        "config": reloader.status(),
    }
    if ray is not None:
        extra["ray_address"] = ray.address
        extra["moved"] = dict(ray.served.moved if ray.served else {})
    return extra
