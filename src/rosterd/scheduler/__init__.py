"""The scheduler (DESIGN.md layer 6): per node, a pure state machine and the loop applying it.

- :mod:`~rosterd.scheduler.values`: phases, limits, leases, the logged events.
- its errors (``SchedulerError`` and subclasses: why a request could not get
  its role) are in :mod:`rosterd.errors`, re-exported here.
- :mod:`~rosterd.scheduler.events`: the machine's events in and effects out.
- :mod:`~rosterd.scheduler.machine`: ``NodeMachine``, the rules (pure).
- :mod:`~rosterd.scheduler.grants`: the machine's rules for who gets a lease (pure).
- :mod:`~rosterd.scheduler.liveness`: the machine's rules for probes, crash
  restarts, load backoff and cancelled loads (pure).
- :mod:`~rosterd.scheduler.replan`: the machine's rules for a re-plan (pure).
- :mod:`~rosterd.scheduler.loop`: ``NodeLoop``, the asyncio loop of one node that
  applies the machine's effects.
- :mod:`~rosterd.scheduler.node`: ``NodeScheduler``, the node's public API over its loop.
- :mod:`~rosterd.scheduler.fleet`: ``Scheduler``, the nodes of one process by role.

Effects reach backends through :mod:`rosterd.backends.interface` (``RoleBackends``).
``docs/scheduler.md`` draws the state table.
"""

from __future__ import annotations

from rosterd.backends.interface import Endpoint, RoleBackends
from rosterd.backends.local import SupervisorBackends, free_port
from rosterd.errors import (
    LoadBackoffError,
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleMovedError,
    RoleRefusedError,
    RoleUnavailableError,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
)
from rosterd.scheduler.fleet import NodeConfig, PlanChange, Scheduler
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import (
    HOLDS_MEMORY,
    Lease,
    NodeChange,
    NodeConcurrency,
    Phase,
    Revocation,
    SchedulerEvent,
    SchedulerLimits,
    client_reason,
)

__all__ = [
    "HOLDS_MEMORY",
    "Endpoint",
    "Lease",
    "LoadBackoffError",
    "LoadFailedError",
    "NodeChange",
    "NodeConcurrency",
    "NodeConfig",
    "NodeMachine",
    "NodeScheduler",
    "Phase",
    "PlanChange",
    "QueueFullError",
    "QueueTimeoutError",
    "Revocation",
    "RoleBackends",
    "RoleMovedError",
    "RoleRefusedError",
    "RoleUnavailableError",
    "Scheduler",
    "SchedulerError",
    "SchedulerEvent",
    "SchedulerLimits",
    "ShuttingDownError",
    "SupervisorBackends",
    "UnknownRoleError",
    "client_reason",
    "free_port",
]
