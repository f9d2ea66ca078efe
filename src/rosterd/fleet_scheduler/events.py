"""What happens to the fleet (DESIGN.md layer 6, pure values): the events the fleet machine
handles, one at a time, in the order the fleet loop takes them.

Three come from outside: :class:`Reload` (the start of ``rosterd up`` is the first,
from an empty fleet; then ``rosterd reload``, SIGHUP or ``--watch``), :class:`NodeLost`
(an agent found dead by a call to it) and :class:`ClusterSeen` (a look at the Ray
cluster's nodes: Ray's own node-death signal, and lost nodes whose address a live Ray
node has again). The others carry back what an effect did:
:class:`PlanSolved` (a :class:`~rosterd.fleet_scheduler.effects.Solve`),
:class:`AgentsStarted`, :class:`Taught`, :class:`PlanApplied`, or that one failed
(:class:`EffectFailed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rosterd.fleet_scheduler.values import Connection, ServedConfig
from rosterd.placement.problem import Plan
from rosterd.ray_match import RayNode


@dataclass(frozen=True)
class Reload:
    """Serve ``config`` from now on (``ticket`` names the caller waiting for the answer).

    ``connections``: per node of ``config.fleet``, what was found of it now;
    ``force``: apply it even if it serves no role while roles are served now;
    ``start``: the first configuration of the run (the plan is shown, a refusal
    ends the run).
    """

    ticket: int
    config: ServedConfig
    connections: Mapping[str, Connection]
    force: bool = False
    start: bool = False


@dataclass(frozen=True)
class NodeLost:
    """Fleet node ``node`` is lost (``reason``: why, in words)."""

    node: str
    reason: str


@dataclass(frozen=True)
class ClusterSeen:
    """The Ray cluster's nodes, alive and dead, as one look just listed them."""

    ray_nodes: tuple[RayNode, ...]


@dataclass(frozen=True)
class PlanSolved:
    """The plans a :class:`~rosterd.fleet_scheduler.effects.Solve` asked for: ``full`` (of
    the whole fleet) and ``served`` (of the nodes that run; ``full`` itself when every
    node runs)."""

    full: Plan
    served: Plan


@dataclass(frozen=True)
class AgentsStarted:
    """The agents a :class:`~rosterd.fleet_scheduler.effects.StartAgents` started
    (``started``) and those that could not start (``failed``: node -> why)."""

    started: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Taught:
    """The nodes that could not learn their roles (``failed``: node -> why; empty: all did)."""

    failed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PlanApplied:
    """What an :class:`~rosterd.fleet_scheduler.effects.ApplyPlan` changed, as
    ``PlanChange.as_json`` gives it."""

    change: Mapping[str, object]


@dataclass(frozen=True)
class EffectFailed:
    """An effect of the change under way failed unexpectedly (``why``): the change ends
    as a refusal."""

    why: str


#: What comes from outside.
OuterEvent = Reload | NodeLost | ClusterSeen
#: What answers an effect.
AnswerEvent = PlanSolved | AgentsStarted | Taught | PlanApplied | EffectFailed
FleetEvent = OuterEvent | AnswerEvent
