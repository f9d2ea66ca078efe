"""The directory of this process's node schedulers (DESIGN.md layer 6): which node serves a role.

Not the fleet's scheduler: that is :mod:`rosterd.fleet_scheduler`, the one owner of the
plan, which tells this directory the plan to serve (``docs/fleet.md`` names the four
"fleet" words).

It owns no state of its own beyond which nodes serve which role and how many
requests each copy of a role has, queued or running (``copy_requests``): every call
goes to that role's :class:`~rosterd.scheduler.node.NodeScheduler`. A role with
replicas has a copy on several nodes; a request goes to the copy
:mod:`rosterd.replica_choice` picks (its prefix's copy within a bounded load, else the
least loaded ready one). A node holding several copies of a role, each on a device of
its own, serves the further ones as units of their own (``chat~2``,
:mod:`rosterd.backends.copy_names`): each is a copy here like another node's, keyed
``NODE/UNIT`` (:func:`copy_key`; a node's first copy is keyed by the node's name). That
count is kept here, at the acquire, rather than read
from the node machines, whose queues fill only once their loops run: a burst would
otherwise all see the same load. A re-plan (a reload, a node lost) is one call,
:meth:`NodeDirectory.apply_plan`: each node kept gets its new roles, budget and
backends (``NodeScheduler.apply``), a new node gets a scheduler, a node left out
drains and stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from rosterd.backends.copy_names import role_of_copy
from rosterd.backends.interface import RoleBackends
from rosterd.errors import RoleMovedError, UnknownRoleError
from rosterd.fleet_scheduler.values import NodeServing
from rosterd.replica_choice import Copy, CopyState, choose_copy, copy_to_wait_on
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeChange, SchedulerEvent
from rosterd.scheduler.views import DirectoryNode, RoleCopies
from rosterd.supervisor import BackendEvent

#: How many times one request follows its role to a new node before it gets the error.
MAX_MOVES: Final[int] = 3


def copy_key(node: str, unit: str) -> str:
    """The key of the copy ``unit`` (a role, or a further copy of it, ``chat~2``) on
    ``node``: the node's name for its first copy (as copies on several nodes have always
    been keyed), ``NODE/UNIT`` for a further one (``box/chat~2``)."""
    return node if role_of_copy(unit) == unit else f"{node}/{unit}"


def split_copy_key(key: str, role: str) -> tuple[str, str]:
    """``(node, unit)`` of a :func:`copy_key` of a copy of ``role``."""
    node, separator, unit = key.partition("/")
    return (node, unit) if separator else (node, role)


@dataclass(frozen=True)
class PlanChange:
    """What :meth:`NodeDirectory.apply_plan` changed.

    ``nodes``: node -> its :class:`NodeChange` (nodes kept or added; a node added
    lists its roles as ``added``); ``added_nodes`` / ``drained_nodes``: nodes that
    appeared / were left out (these drain, then stop every backend); ``moved``:
    role -> ``(from node, to node)``.
    """

    nodes: Mapping[str, NodeChange]
    added_nodes: tuple[str, ...] = ()
    drained_nodes: tuple[str, ...] = ()
    moved: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether anything changed."""
        return bool(
            self.added_nodes
            or self.drained_nodes
            or any(change.changed for change in self.nodes.values())
        )

    def as_json(self) -> dict[str, object]:
        """JSON-ready data: ``{"changed", "nodes": {name: NodeChange.as_json()},
        "added_nodes", "drained_nodes", "moved": {role: [from, to]}}``."""
        return {
            "changed": self.changed,
            "nodes": {name: change.as_json() for name, change in sorted(self.nodes.items())},
            "added_nodes": list(self.added_nodes),
            "drained_nodes": list(self.drained_nodes),
            "moved": {role: list(pair) for role, pair in sorted(self.moved.items())},
        }


def default_node(serving: NodeServing, backends: RoleBackends) -> NodeScheduler:
    """A :class:`NodeScheduler` serving ``serving`` through ``backends``, with the default
    limits and no metrics."""
    return NodeScheduler(
        serving.name,
        serving.capacity_bytes,
        serving.specs,
        backends,
        unavailable=serving.unavailable,
        devices=serving.devices,
    )


class NodeDirectory:
    """The node schedulers of one ``rosterd up`` process, addressed by role.

    ``nodes``: node name -> :class:`NodeScheduler`; each role is placed on
    exactly one of them (the plan's placements restricted to the nodes this
    process runs). ``new_node(serving, backends)`` builds the scheduler of a node a
    re-plan adds (default :func:`default_node`; ``rosterd up`` gives its limits and
    metrics).
    """

    def __init__(
        self,
        nodes: Mapping[str, NodeScheduler],
        *,
        new_node: Callable[[NodeServing, RoleBackends], NodeScheduler] = default_node,
    ) -> None:
        self.nodes = dict(nodes)
        self._new_node = new_node
        self._draining: dict[str, NodeScheduler] = {}  # left out by a re-plan, still stopping
        self._drains: set[asyncio.Task[None]] = set()
        self._started = False
        self._node_of: dict[str, NodeScheduler] = {}
        self._nodes_of: dict[str, tuple[NodeScheduler, ...]] = {}
        #: role -> (node, unit) of each copy: a node's first copy, then its further ones
        self._copies_of: dict[str, tuple[tuple[NodeScheduler, str], ...]] = {}
        #: (role, copy key) -> requests acquired there and not yet released, queued or
        #: running (replicas' load)
        self._copy_requests: dict[tuple[str, str], int] = {}
        self._index()

    def _index(self) -> None:
        held: dict[str, list[tuple[NodeScheduler, str]]] = {}
        for _name, node in sorted(self.nodes.items()):
            for unit in sorted(node.specs, key=lambda u: (role_of_copy(u), u)):
                held.setdefault(role_of_copy(unit), []).append((node, unit))
        self._copies_of = {role: tuple(copies) for role, copies in held.items()}
        self._nodes_of = {
            role: tuple(dict.fromkeys(node for node, _ in copies))
            for role, copies in self._copies_of.items()
        }
        self._node_of = {role: nodes[0] for role, nodes in self._nodes_of.items()}

    def copy_keys(self, role: str) -> tuple[str, ...]:
        """The key of each copy of ``role`` (:func:`copy_key`), first node first."""
        return tuple(copy_key(node.name, unit) for node, unit in self._copies_of.get(role, ()))

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role this process can serve, sorted."""
        return tuple(sorted(self._node_of))

    def node_of(self, role: str) -> NodeScheduler:
        """The node scheduler owning ``role``; raises ``UnknownRoleError``."""
        try:
            return self._node_of[role]
        except KeyError:
            raise UnknownRoleError(f"role {role!r} is not served here") from None

    def nodes_of(self, role: str) -> tuple[NodeScheduler, ...]:
        """Every node scheduler holding a copy of ``role``, by node name (empty: none)."""
        return self._nodes_of.get(role, ())

    def other_copy_ready(self, role: str, node: str) -> bool:
        """Whether a copy of ``role`` other than the one keyed ``node`` (:func:`copy_key`:
        a node's name for its first copy) is ready now: where a request whose backend
        could not be reached may go instead (a failover)."""
        return any(
            copy_key(other.name, unit) != node and other.copy_state(unit) is CopyState.READY
            for other, unit in self._copies_of.get(role, ())
        )

    def node_names(self, role: str) -> str:
        """The names of the nodes holding a copy of ``role``, comma-separated ("" for none):
        what the access log says of a request refused before a node was chosen."""
        return ",".join(node.name for node in self.nodes_of(role))

    def choose_node(
        self, role: str, prefix: bytes | None = None, avoid: Collection[str] = ()
    ) -> NodeScheduler:
        """The node of :meth:`choose_copy_of`'s copy."""
        return self.choose_copy_of(role, prefix, avoid)[0]

    def choose_copy_of(
        self, role: str, prefix: bytes | None = None, avoid: Collection[str] = ()
    ) -> tuple[NodeScheduler, str]:
        """``(node, unit)`` of the copy of ``role`` that takes a request with ``prefix``
        (:func:`rosterd.replica_choice.prefix_key`), skipping the copies keyed in ``avoid``
        (:func:`copy_key`): the ready copy :func:`~rosterd.replica_choice.choose_copy`
        picks (each copy with the requests sent to it and its slots,
        :meth:`NodeScheduler.copy_slots`), else the copy to wait on (a load under way, then
        a cold one, then a lost node's). A role with one copy: that one. Raises
        ``UnknownRoleError`` when no node holds it, or every copy is in ``avoid``."""
        held = self._copies_of.get(role, ())
        if len(held) == 1 and not avoid:
            return held[0]
        copies = []
        by_key: dict[str, tuple[NodeScheduler, str]] = {}
        for node, unit in held:
            state = node.copy_state(unit)
            if state is not None:
                key = copy_key(node.name, unit)
                by_key[key] = (node, unit)
                requests = self._copy_requests.get((role, key), 0)
                # The copy's own slots (its backend's parallel slots): with the per-role
                # limit alone, a one-slot copy running a long request looked free, and a
                # request of its prefix queued there while the other copy sat idle.
                copies.append(Copy(key, state, requests, node.copy_slots(unit)))
        name = choose_copy(copies, prefix, exclude=avoid) or copy_to_wait_on(copies, avoid)
        if name is None:
            if held and not avoid:
                return held[0]  # unavailable everywhere: its node says why
            raise UnknownRoleError(f"role {role!r} has no other copy to try")
        return by_key[name]

    def start(self) -> None:
        """Start every node's task."""
        self._started = True
        for node in self.nodes.values():
            node.start()

    def apply_plan(
        self,
        nodes: Mapping[str, NodeServing],
        backends: Mapping[str, RoleBackends],
        *,
        restart: Collection[str] = (),
        replace: Collection[str] = (),
    ) -> PlanChange:
        """Serve the plan ``nodes`` (node name -> what it serves, a
        :class:`~rosterd.fleet_scheduler.values.NodeServing`) from now on, each node
        through its ``backends`` (node name -> the backends that start its roles); what
        changed.

        Synchronous, so it is atomic for every caller on the loop: when it returns,
        requests resolve roles on the new plan (a role no longer placed anywhere
        raises ``UnknownRoleError``), and each node's machine has the change queued
        before any later event. Per node kept: :meth:`NodeScheduler.apply`
        (``restart`` names roles whose launch changed outside their spec: weights,
        launch options). A node new here gets a scheduler (``new_node``), started if
        this scheduler is. A node left out drains: it takes no new request, lets
        its requests finish (up to ``drain_s``) and stops every backend, in the
        background (:meth:`shutdown` waits for it). A role that moved retires on
        its old node and is added on the new one; its requests the old node does
        not serve are queued on the new one (:meth:`acquire`). ``replace``: nodes whose
        scheduler is drained and made afresh from what they serve (a node lost, then
        back: its old scheduler holds the loss). Needs a running event loop when a node is
        left out or replaced.
        """
        before = dict(self._node_of)
        for name in replace:  # a node that came back after its loss: a scheduler afresh
            old = self.nodes.pop(name, None)
            if old is not None:
                # Its requests follow their roles to the fresh scheduler (RoleMovedError).
                old.apply(
                    {},
                    capacity_bytes=old.capacity_bytes,
                    backends=old.backends,
                    moved={role: name for role in old.specs},
                )
                self._drain(name, old)
        placed: dict[str, str] = {}  # role -> a node holding it (the first by name)
        for name, serving in sorted(nodes.items(), reverse=True):
            for role in serving.specs:
                placed[role] = name
        changes: dict[str, NodeChange] = {}
        added_nodes: list[str] = []
        for name, serving in sorted(nodes.items()):
            node = self.nodes.get(name)
            if node is None:
                node = self._new_node(serving, backends[name])
                self.nodes[name] = node
                added_nodes.append(name)
                changes[name] = NodeChange(added=tuple(sorted(serving.specs)))
                if self._started:
                    node.start()
                continue
            changes[name] = node.apply(
                serving.specs,
                capacity_bytes=serving.capacity_bytes,
                backends=backends[name],
                unavailable=serving.unavailable,
                restart=restart,
                moved={
                    role: placed[role]
                    for role in node.specs
                    if role in placed and role not in serving.specs
                },
                memory=serving.memory,
                concurrency=serving.concurrency,
                devices=serving.devices,
            )
        drained = sorted(set(self.nodes) - set(nodes))
        for name in drained:
            self._drain(name, self.nodes.pop(name))
        self._index()
        moved = {
            role: (old.name, self._node_of[role].name)
            for role, old in before.items()
            if role in self._node_of and self._node_of[role].name != old.name
        }
        return PlanChange(changes, tuple(added_nodes), tuple(drained), moved)

    def _drain(self, name: str, node: NodeScheduler) -> None:
        self._draining[name] = node

        async def drain() -> None:
            try:
                await node.shutdown()
            finally:
                if self._draining.get(name) is node:
                    del self._draining[name]

        task = asyncio.get_running_loop().create_task(drain(), name=f"rosterd-drain-{name}")
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def acquire(
        self,
        role: str,
        *,
        timeout_s: float | None = None,
        newer_than: int | None = None,
        on_node: str | None = None,
        prefix: bytes | None = None,
        avoid: Collection[str] = (),
    ) -> Lease:
        """A lease on ``role`` (as ``NodeScheduler.acquire``); give it back with :meth:`release`.

        The copy is :meth:`choose_copy_of`'s for ``prefix`` and ``avoid`` (the keys of the
        copies already tried, :func:`copy_key`), or the one keyed ``on_node``.
        ``newer_than``: the generation of a lease whose backend failed the request before
        answering; the new lease is of the restarted backend (give ``on_node``: the
        lease's ``copy_key``). The lease names the public ``role``, and its ``copy`` the
        node's unit of a further copy there (``chat~2``). A request waiting while a
        re-plan moves its role (a node lost, a reload) is queued again on the role's
        new node, within what is left of its ``timeout_s``. Raises the
        ``SchedulerError`` subclasses listed there.
        """
        start: NodeScheduler | None = None
        unit = role
        if on_node is not None:
            name, unit = split_copy_key(on_node, role)
            start = self.nodes.get(name)
        if start is None or unit not in start.specs:
            start, unit = self.choose_copy_of(role, prefix, avoid)
        first = (start, unit)

        def ask(node: NodeScheduler, asked: str, left_s: float | None) -> Awaitable[Lease]:
            # A generation counts a backend of one node: on the node the role moved to,
            # any backend is newer than the one that failed the request.
            newer = newer_than if (node, asked) == first else None
            return node.acquire(asked, timeout_s=left_s, newer_than=newer)

        key = (role, copy_key(start.name, unit))
        self._copy_requests[key] = self._copy_requests.get(key, 0) + 1
        try:
            lease = await self._follow_moves(role, timeout_s, ask, start, unit)
        except BaseException:
            self._count_done(key)
            raise
        if (role, lease.copy_key) != key:  # followed a move: counted where it is served
            self._count_done(key)
            moved = (role, lease.copy_key)
            self._copy_requests[moved] = self._copy_requests.get(moved, 0) + 1
        return lease

    def _count_done(self, key: tuple[str, str]) -> None:
        left = self._copy_requests.get(key, 0) - 1
        if left > 0:
            self._copy_requests[key] = left
        else:
            self._copy_requests.pop(key, None)

    async def _follow_moves(
        self,
        role: str,
        timeout_s: float | None,
        ask: Callable[[NodeScheduler, str, float | None], Awaitable[Lease]],
        node: NodeScheduler | None = None,
        unit: str | None = None,
    ) -> Lease:
        """``ask(node, unit, timeout_s)`` on a copy of ``role``; when that node answers
        ``RoleMovedError`` (a re-plan moved the role while the request waited), ask
        the role's copy now, with what is left of the timeout (at most
        ``MAX_MOVES`` times, so a role moved back and forth cannot loop). ``node`` and
        ``unit``: where to ask first (default: the role's first node, the role itself).
        The lease returned names ``role``, and its ``copy`` a further copy's unit."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        node = node if node is not None else self.node_of(role)
        unit = unit if unit is not None else role
        limit_s = node.limits.queue_timeout_s if timeout_s is None else timeout_s
        left_s = timeout_s
        for moves in range(MAX_MOVES + 1):
            try:
                lease = await ask(node, unit, left_s)
            except RoleMovedError:
                self.node_of(role)  # UnknownRoleError: placed nowhere now
                moved_to, moved_unit = self.choose_copy_of(role)
                if (moved_to, moved_unit) == (node, unit) or moves == MAX_MOVES:
                    raise
                node, unit = moved_to, moved_unit
                left_s = max(0.0, limit_s - (loop.time() - started))
                continue
            lease = replace(lease, role=role, copy=None if unit == role else unit)
            if moves == 0:
                return lease
            return replace(lease, waited_s=loop.time() - started)  # counted from the first ask
        raise AssertionError("unreachable: the last move re-raises")

    def suspect(self, lease: Lease, reason: str, *, wedged: bool = False) -> None:
        """A request on ``lease`` got no byte within its deadline: probe its backend, or
        (``wedged``) restart it as unhealthy at once (see :meth:`NodeScheduler.suspect`)."""
        self.nodes[lease.node].suspect(lease.of_unit(), reason, wedged=wedged)

    @property
    def queue_timeout_s(self) -> float:
        """The longest any node lets a request wait for its role, seconds."""
        return max((n.limits.queue_timeout_s for n in self.nodes.values()), default=300.0)

    def release(self, lease: Lease) -> None:
        """Give back a lease from :meth:`acquire` (also after a re-plan moved or removed
        its role, or left its node out)."""
        self._count_done((lease.role, lease.copy_key))
        unit = lease.of_unit()
        node = self.nodes.get(lease.node)
        if node is None or (lease.node in self._draining and unit.role not in node.specs):
            node = self._draining.get(lease.node, node)
        if node is not None:
            node.release(unit)

    def backend_event(self, event: BackendEvent, *, node: str | None = None) -> None:
        """Pass a supervisor event to the node owning ``event.name`` (other names are ignored);
        ``node``: to that node's scheduler only (serving or draining): the event of one copy
        of a role that several nodes hold.

        Wire it to ``Supervisor(on_event=...)`` so crashes and restarts reach
        the scheduler; see :meth:`NodeScheduler.backend_event`.
        """
        for held in (*self.nodes.values(), *self._draining.values()):
            if node is None or held.name == node:
                held.backend_event(event)  # each node takes the events of its roles only

    async def load(
        self, role: str, *, no_evict: bool = False, timeout_s: float | None = None
    ) -> Lease:
        """Make ``role`` resident without taking a slot (``rosterd load``, warm-up).

        ``no_evict``: give up (``RoleRefusedError``) rather than evict anything.
        A role with replicas is loaded on every node holding a copy, at once; the lease
        of the first copy that loads is returned, and the first error when none does.
        The returned lease needs no release.
        """
        self.node_of(role)  # UnknownRoleError
        starts = self._copies_of.get(role, ())
        results = await asyncio.gather(
            *(
                self._follow_moves(
                    role,
                    timeout_s,
                    lambda node, asked, left_s: node.acquire(
                        asked, timeout_s=left_s, take_slot=False, no_evict=no_evict
                    ),
                    start,
                    unit,
                )
                for start, unit in starts
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, Lease):
                return result
        first = results[0]
        assert isinstance(first, BaseException)
        raise first

    async def unload(self, role: str) -> None:
        """Stop ``role``'s backend (``rosterd unload``): every copy of a role with replicas,
        on each node holding one and on each device of a node, at once; returns once each
        exited (see :meth:`NodeScheduler.unload`). As ``rosterd load`` loads every copy, an
        unload that left one resident would leave its memory held with no word of it.

        Raises ``UnknownRoleError``: no node holds ``role``."""
        self.node_of(role)  # UnknownRoleError
        copies = self._copies_of.get(role, ())
        await asyncio.gather(*(node.unload(unit) for node, unit in copies))

    async def shutdown(self) -> None:
        """Drain and stop every node (concurrently), those a re-plan left out too; returns
        when every backend exited."""
        nodes = [*self.nodes.values(), *self._draining.values()]
        await asyncio.gather(*(node.shutdown() for node in nodes))

    def stop_now(self) -> None:
        """Cut the drain of a :meth:`shutdown` under way on every node (a second Ctrl-C)."""
        for node in (*self.nodes.values(), *self._draining.values()):
            node.stop_now()

    def snapshot(self) -> dict[str, DirectoryNode]:
        """Every node by name, read-only, for display: those serving, then those a re-plan
        left out that are stopping (``draining``), each with the copies of its roles that
        have more than one (see :class:`~rosterd.scheduler.views.DirectoryNode`)."""
        nodes: dict[str, DirectoryNode] = {}
        for draining, group in ((False, self.nodes), (True, self._draining)):
            for name, node in group.items():
                snap = node.snapshot()
                copies: dict[str, RoleCopies] = {}
                for unit in snap.roles:
                    held = self._copies_of.get(role_of_copy(unit), ())
                    if len(held) > 1:
                        key = copy_key(name, unit)
                        requests = self._copy_requests.get((role_of_copy(unit), key), 0)
                        copies[unit] = RoleCopies(copy_places(held), requests)
                nodes.setdefault(name, DirectoryNode(snap, draining, copies))
        return nodes

    async def measured_bytes(self) -> dict[str, dict[str, int]]:
        """Node -> role -> measured RSS in bytes (``NodeScheduler.measured_bytes``, every
        node at once); for display (``/status``, ``rosterd ps``, ``/metrics``)."""
        names = list(self.nodes)
        measured = await asyncio.gather(*(self.nodes[n].measured_bytes() for n in names))
        return dict(zip(names, measured, strict=True))

    def events(self) -> list[SchedulerEvent]:
        """Every node's event log, oldest first."""
        nodes = [*self.nodes.values(), *self._draining.values()]
        merged = [e for node in nodes for e in node.events]
        merged.sort(key=lambda e: e.at)
        return merged


def copy_places(held: Collection[tuple[NodeScheduler, str]]) -> tuple[str, ...]:
    """Where each copy of ``held`` (its node and unit) runs, in words: its node's name, or
    for a node holding several, each on a device of its own, the node and the device
    (``box (CUDA0)``, ``box (CUDA1)``), as the node's device pools count it."""
    per_node: dict[str, int] = {}
    for node, _ in held:
        per_node[node.name] = per_node.get(node.name, 0) + 1
    places: list[str] = []
    for node, unit in held:
        if per_node[node.name] == 1:
            places.append(node.name)
            continue
        device = next((d for d, pool in node.devices.items() if unit in pool.bytes_by_role), None)
        places.append(f"{node.name} ({device or unit})")
    return tuple(places)
