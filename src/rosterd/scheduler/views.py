"""What a node scheduler shows of its state (DESIGN.md layer 6, pure): read-only snapshot
values, taken on the node's loop and handed out for display only, never to decide.

:class:`RoleSnapshot` is one role on one node, :class:`NodeSnapshot` one node,
:class:`DirectoryNode` a node as this process's directory of node schedulers holds it
(draining or not, the copies of its roles). The router turns them into ``/status``'s
and ``rosterd ps``'s JSON in one place (``rosterd.router.status_view``); nothing here
knows JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rosterd.backends.values import KeptKv
from rosterd.scheduler.values import Phase
from rosterd.spec import LatencyClass

#: A role's phase as shown: the scheduler's (``Phase``'s values), or ``unavailable`` for
#: a role that cannot be served (``RoleSnapshot.unavailable_reason`` says why).
ShownPhase = Literal[
    "stopped", "loading", "ready", "restarting", "stopping", "unhealthy", "lost", "unavailable"
]

#: A role's latency class (``LatencyClass``'s values).
LatencyClassName = Literal["interactive", "batch"]

#: Each phase as shown (a role that cannot be served shows ``unavailable`` instead).
SHOWN_PHASE: Mapping[Phase, ShownPhase] = {
    Phase.STOPPED: "stopped",
    Phase.LOADING: "loading",
    Phase.READY: "ready",
    Phase.RESTARTING: "restarting",
    Phase.STOPPING: "stopping",
    Phase.UNHEALTHY: "unhealthy",
    Phase.LOST: "lost",
}

#: Each latency class by its name.
LATENCY_CLASS_NAME: Mapping[LatencyClass, LatencyClassName] = {
    LatencyClass.INTERACTIVE: "interactive",
    LatencyClass.BATCH: "batch",
}


@dataclass(frozen=True, slots=True)
class RoleSnapshot:
    """One role on one node at one moment.

    ``running``: requests its backend runs now, their leases granted; ``queued``: requests
    waiting for a lease; ``resident_bytes``: what the node's budget counts for it.
    Durations are seconds, ``None`` when they do not apply: ``idle_s`` (ready and running
    nothing), ``loaded_for_s`` (holds memory), ``waiting_s`` (its oldest queued request),
    ``last_error_age_s``, ``load_backoff_s`` (a failed load waits this long before the
    next). ``base_url`` and ``pid``: its backend, when it has one. ``restart_pending``: a
    re-plan changed what it launches and it restarts once idle (or after ``drain_s``);
    ``retiring``: a re-plan removed it and it drains before it stops; ``memory``: its
    figures (``rosterd.memory.gathering``), or ``None``; ``kv``: what is kept of its KV
    cache across stops, or ``None`` (these backends keep nothing)."""

    phase: ShownPhase
    latency_class: LatencyClassName
    sticky: bool
    resident_bytes: int
    running: int
    queued: int
    idle_s: float | None
    loaded_for_s: float | None
    waiting_reason: str | None
    waiting_s: float | None
    last_error: str | None
    last_error_age_s: float | None
    load_backoff_s: float | None
    base_url: str | None
    pid: int | None
    restart_pending: bool
    unavailable_reason: str | None
    retiring: bool
    memory: Mapping[str, object] | None
    kv: KeptKv | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node at one moment: its budget (``capacity_bytes``) and what its resident roles
    hold of it (``resident_bytes``), those roles (``resident``, by id), whether a
    transition (stops, then a load) is under way, why the node is lost (``None``: it is
    not), every role it holds (placed or retiring) by id, the requests its backends run
    now (``running``), the node-wide limit on them now (``max_concurrency``, ``None``:
    none) and its memory pools (``pools``: ``host`` and each device, declared, probed and
    counted, bytes: ``MachineState.pools_view``)."""

    capacity_bytes: int
    resident_bytes: int
    resident: tuple[str, ...]
    transition: bool
    lost_reason: str | None
    roles: Mapping[str, RoleSnapshot]
    running: int
    max_concurrency: int | None
    pools: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RoleCopies:
    """A role with replicas, seen from one node holding a copy: every node holding one
    (``nodes``, by name) and ``requests``: those this process sent to this copy that are
    not done, queued there or running (``RoleSnapshot.running`` counts the second only)."""

    nodes: tuple[str, ...]
    requests: int


@dataclass(frozen=True, slots=True)
class DirectoryNode:
    """A node as this process's directory of node schedulers holds it: its snapshot,
    whether a re-plan left it out and it is stopping (``draining``), and the copies of its
    roles that have more than one (role -> :class:`RoleCopies`)."""

    node: NodeSnapshot
    draining: bool
    copies: Mapping[str, RoleCopies]
