"""What the fleet asks for (DESIGN.md layer 6, pure values): the effects the fleet machine
returns, which the fleet loop applies in order through ``FleetEffects`` (the fleet's
syscall table, :mod:`rosterd.fleet_scheduler.loop`).

Four of them answer with an event that the machine handles before any other:
:class:`Solve` (-> ``PlanSolved``), :class:`StartAgents` (-> ``AgentsStarted``),
:class:`Teach` (-> ``Taught``) and :class:`ApplyPlan` (-> ``PlanApplied``). The rest
answer nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rosterd.fleet.model import Fleet
from rosterd.fleet_scheduler.values import NodeServing, ServedConfig
from rosterd.placement.problem import Plan
from rosterd.spec import InferenceSpec


@dataclass(frozen=True)
class Solve:
    """Plan ``specs`` (with their planning figures) on ``fleet``'s nodes named in
    ``running``, keeping ``previous`` (the plan in force) where it still fits;
    ``memory_notes`` as ``plan``'s. ``whole``: plan the whole fleet too (a new
    configuration); otherwise the plan of the running nodes is also the whole one.
    ``config``: the configuration planned (its memory figures give each role's need on
    a device). The solver runs off the loop, up to its time limit."""

    specs: Sequence[InferenceSpec]
    fleet: Fleet
    running: tuple[str, ...]
    previous: Plan | None
    memory_notes: Mapping[str, str] = field(default_factory=dict)
    whole: bool = True
    config: ServedConfig | None = None


@dataclass(frozen=True)
class StartAgents:
    """Start a node agent on each node of ``nodes`` (node -> what it will serve) under
    ``config`` (its weights are resolved there with the fleet's ``models``), pinned to
    its Ray node (``ray_node_ids``: node -> Ray node id)."""

    nodes: Mapping[str, NodeServing]
    config: ServedConfig
    ray_node_ids: Mapping[str, str]


@dataclass(frozen=True)
class DropAgents:
    """End the agents of ``nodes`` (their backends stop): a refused change started them."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Teach:
    """Tell each node of ``nodes`` the roles it serves from now on (its backends learn
    their specs, weights and model names under ``config``; a role running keeps its
    process until its node scheduler restarts it). ``new_config``: ``config`` is a new
    configuration (a reload: this machine's nodes get backends of their own for it);
    otherwise the nodes' backends only learn roles moved to them (a node's loss)."""

    nodes: Mapping[str, NodeServing]
    config: ServedConfig
    new_config: bool = True


@dataclass(frozen=True)
class ApplyPlan:
    """Serve ``nodes`` (node -> :class:`NodeServing`) from now on, in one step
    (``NodeDirectory.apply_plan``): ``restart`` names roles whose launch changed outside
    their spec; ``replace`` names nodes whose scheduler starts afresh (lost, then back).
    Nodes left out drain and stop."""

    nodes: Mapping[str, NodeServing]
    restart: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()


@dataclass(frozen=True)
class Routes:
    """Route requests by ``config`` from now on: ``placements`` (role -> node) are the
    roles served, ``unserved`` (name -> why) what a 404 says of a name not served."""

    config: ServedConfig
    placements: Mapping[str, str]
    unserved: Mapping[str, str]


@dataclass(frozen=True)
class MarkLost:
    """Tell ``node``'s scheduler that the node is lost (``reason``): its roles go ``lost``."""

    node: str
    reason: str


@dataclass(frozen=True)
class Record:
    """Log a change to ``role`` decided for the fleet (``kind``: ``moved``, ``unplaced``)
    with its ``cause`` in ``node``'s event log, the log and the run's output."""

    node: str
    kind: str
    role: str
    cause: str


class Level(enum.Enum):
    """How a :class:`Say` reads: news, good news, a notice to read, a warning about the
    input, or something that fails."""

    INFO = "info"
    OK = "ok"
    NOTICE = "notice"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Say:
    """Tell the operator ``text`` (one line) at ``level``; ``log_only``: only in the log
    (what a running ``up`` does by itself after its start, such as a reload's summary)."""

    level: Level
    text: str
    log_only: bool = False


@dataclass(frozen=True)
class ShowPlan:
    """Show the plan the run starts with: ``plan`` of ``config`` (the plan in force),
    ``local`` the nodes this machine runs, ``where`` node -> how it is run, in words
    (``None``: without Ray), and the roles moved off nodes that do not run (``moved``)."""

    plan: Plan
    config: ServedConfig
    local: tuple[str, ...]
    where: Mapping[str, str] | None = None
    moved: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Warm:
    """Load ``roles`` (in this order) in the background, evicting nothing."""

    roles: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """Answer the caller waiting on ``ticket``: the ``change`` applied, or ``error`` (the
    configuration was refused, and the one in force stays; ``nothing_to_serve``: because
    no node of it runs)."""

    ticket: int
    change: Mapping[str, object] | None = None
    error: str | None = None
    nothing_to_serve: bool = False


FleetEffect = (
    Solve
    | StartAgents
    | DropAgents
    | Teach
    | ApplyPlan
    | Routes
    | MarkLost
    | Record
    | Say
    | ShowPlan
    | Warm
    | Answer
)
