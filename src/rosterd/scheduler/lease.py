"""A lease (DESIGN.md layer 6): permission to send requests to a role's backend until released.

The node loop grants it (``rosterd.scheduler.loop``); the router holds it for one
request. It carries an asyncio future through which the holder learns that the
scheduler stopped the backend under it, which is why it is not among the pure
values of :mod:`rosterd.scheduler.values` the node machine uses.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from rosterd.backends.values import Endpoint
from rosterd.scheduler.values import Revocation


@dataclass(frozen=True, slots=True)
class Lease:
    """Permission to send requests to ``role``'s backend at ``endpoint`` until released.

    ``generation`` tells leases of an earlier load of the same role apart (a
    release from a stopped generation is ignored); ``waited_s`` is the time
    spent queued, seconds. ``revoked`` gets a :class:`Revocation` when the
    scheduler stops the backend before the lease was released: the holder must
    end its upstream request at once and release the lease. ``copy``: the node's unit
    of a further copy of ``role`` on another of its devices (``chat~2``; ``None``: the
    role's own unit there), which the node scheduler knows the lease by.
    """

    role: str
    node: str
    endpoint: Endpoint
    generation: int
    waited_s: float
    revoked: asyncio.Future[Revocation] | None = field(default=None, compare=False)
    copy: str | None = None

    @property
    def copy_key(self) -> str:
        """The copy's key among the role's copies: its node's name, or ``NODE/UNIT`` for a
        further copy on one of the node's other devices (``box/chat~2``)."""
        return self.node if self.copy is None else f"{self.node}/{self.copy}"

    def of_unit(self) -> Lease:
        """This lease as its node scheduler granted it: named by the node's unit."""
        return self if self.copy is None else replace(self, role=self.copy, copy=None)
