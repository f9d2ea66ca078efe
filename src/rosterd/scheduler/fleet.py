"""The fleet-level scheduler (DESIGN.md layer 6): the node schedulers of one process, by role.

It owns no state of its own beyond which node serves which role: every call
goes to that role's :class:`~rosterd.scheduler.node.NodeScheduler`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from rosterd.scheduler.errors import UnknownRoleError
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import Lease, SchedulerEvent
from rosterd.supervisor import BackendEvent


class Scheduler:
    """The node schedulers of one ``rosterd up`` process, addressed by role.

    ``nodes``: node name -> :class:`NodeScheduler`; each role is placed on
    exactly one of them (the plan's placements restricted to the nodes this
    process runs).
    """

    def __init__(self, nodes: Mapping[str, NodeScheduler]) -> None:
        self.nodes = dict(nodes)
        self._node_of: dict[str, NodeScheduler] = {}
        for node in self.nodes.values():
            for role in node.specs:
                self._node_of[role] = node

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

    def start(self) -> None:
        """Start every node's task."""
        for node in self.nodes.values():
            node.start()

    async def acquire(
        self, role: str, *, timeout_s: float | None = None, newer_than: int | None = None
    ) -> Lease:
        """A lease on ``role`` (as ``NodeScheduler.acquire``); give it back with :meth:`release`.

        ``newer_than``: the generation of a lease whose backend failed the request
        before answering; the new lease is of the restarted backend.
        Raises the ``SchedulerError`` subclasses listed there.
        """
        return await self.node_of(role).acquire(role, timeout_s=timeout_s, newer_than=newer_than)

    def suspect(self, lease: Lease, reason: str) -> None:
        """A request on ``lease`` got no byte within its deadline: probe its backend
        (see :meth:`NodeScheduler.suspect`)."""
        self.nodes[lease.node].suspect(lease, reason)

    @property
    def queue_timeout_s(self) -> float:
        """The longest any node lets a request wait for its role, seconds."""
        return max((n.limits.queue_timeout_s for n in self.nodes.values()), default=300.0)

    def release(self, lease: Lease) -> None:
        """Give back a lease from :meth:`acquire`."""
        self.nodes[lease.node].release(lease)

    def backend_event(self, event: BackendEvent) -> None:
        """Pass a supervisor event to the node owning ``event.name`` (other names are ignored).

        Wire it to ``Supervisor(on_event=...)`` so crashes and restarts reach
        the scheduler; see :meth:`NodeScheduler.backend_event`.
        """
        node = self._node_of.get(event.name)
        if node is not None:
            node.backend_event(event)

    async def load(
        self, role: str, *, no_evict: bool = False, timeout_s: float | None = None
    ) -> Lease:
        """Make ``role`` resident without taking a slot (``rosterd load``, warm-up).

        ``no_evict``: give up (``RoleRefusedError``) rather than evict anything.
        The returned lease needs no release.
        """
        return await self.node_of(role).acquire(
            role, timeout_s=timeout_s, take_slot=False, no_evict=no_evict
        )

    async def unload(self, role: str) -> None:
        """Stop ``role``'s backend (``rosterd unload``); see :meth:`NodeScheduler.unload`."""
        await self.node_of(role).unload(role)

    async def shutdown(self) -> None:
        """Drain and stop every node (concurrently); returns when every backend exited."""
        await asyncio.gather(*(node.shutdown() for node in self.nodes.values()))

    def snapshot(self) -> dict[str, object]:
        """``{"nodes": {name: NodeScheduler.snapshot()}}``."""
        return {"nodes": {name: node.snapshot() for name, node in self.nodes.items()}}

    def events(self) -> list[SchedulerEvent]:
        """Every node's event log, oldest first."""
        merged = [e for node in self.nodes.values() for e in node.events]
        merged.sort(key=lambda e: e.at)
        return merged
