"""What ``rosterd up`` tells the operator, as values (layer 8): the :class:`Reporter` it
talks to, the plan as a table of words (:func:`plan_table`) and the words of its other
notices. ``rosterd.cli`` implements the reporter with Rich (DESIGN.md: only the CLI
prints); a test may implement it with a list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from rosterd.backends.copy_names import unit_names
from rosterd.fleet_scheduler.effects import Level, ShowPlan
from rosterd.supervisor import BackendEvent, describe_exit
from rosterd.tokens import GB


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One role of the printed plan: its ``role``, ``flavor``, ``model`` (``-`` for
    none), the roster's ``ram_gb`` (``~`` for an unmeasured guess), the ``gib`` that
    counts on its node, its latency ``latency_class``, ``sticky`` (``yes``/``no``) and
    ``residency`` (``always``, ``on demand, evicted last`` for a sticky role, or ``on demand``)."""

    role: str
    flavor: str
    model: str
    ram_gb: str
    gib: str
    latency_class: str
    sticky: str
    residency: str


@dataclass(frozen=True, slots=True)
class NodeTable:
    """One node of the printed plan: its ``title`` (name, address, how it is run,
    capacity), its ``rows`` and a ``caption`` (``None``: none)."""

    title: str
    rows: tuple[PlanRow, ...]
    caption: str | None = None


@dataclass(frozen=True, slots=True)
class PlanTable:
    """The plan as people read it: a table per node, the unplaced roles with why, how many
    roster entries the import skipped (``rosterd roster import``'s count, as ``plan``'s
    header) and which of those, aliases the fleet gives other weights, are served as roles
    of their own (``served_apart``)."""

    nodes: tuple[NodeTable, ...]
    unplaced: tuple[tuple[str, str], ...]
    skipped: int
    served_apart: tuple[str, ...] = ()


class Reporter(Protocol):
    """Where ``rosterd up`` says what it does (implemented by the CLI)."""

    def say(self, level: Level, text: str) -> None:
        """One line at ``level`` (``WARNING``: about the input, said as ``warning: ...``)."""
        ...

    def plan(self, table: PlanTable) -> None:
        """The plan the run starts with."""
        ...


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GB:.2f}"


def _bytes(value: object, default: int) -> int:
    """A figure of ``role_json`` (bytes), or ``default`` where it has none."""
    return value if isinstance(value, int) else default


def plan_table(shown: ShowPlan) -> PlanTable:
    """The words of the plan ``shown`` (the fleet scheduler's ``ShowPlan``): each role's
    GiB is its counted figure on its node and ``ram_gb`` the roster's."""
    config, result = shown.config, shown.plan
    specs = {role: s.spec for role, s in config.first_by_role().items()}
    local = set(shown.local)
    tables: list[NodeTable] = []
    for node in config.fleet.nodes:
        node_plan = result.nodes.get(node.name)
        if shown.where is not None and node.name in shown.where:
            run_by = shown.where[node.name]
        else:
            run_by = "this machine" if node.name in local else "remote: not started here"
        always = set(node_plan.always_resident) if node_plan else set()
        rows: list[PlanRow] = []
        guessed = False
        here = [r for r, n in result.copy_pairs() if n == node.name]  # every copy
        # a further copy on another of the node's devices: named as ps and /status name it
        for role, shown_as in zip(here, unit_names(here), strict=True):
            s = specs[role]
            figures = config.memory.role_json(role, node.name)
            counted, declared = s.memory.resident_bytes, _gib(s.memory.resident_bytes)
            if figures is not None:
                counted = _bytes(figures.get("counted_bytes"), counted)
                unmeasured = bool(figures.get("declared_unmeasured"))
                declared_bytes = _bytes(figures.get("declared_bytes"), s.memory.resident_bytes)
                declared = ("~" if unmeasured else "") + _gib(declared_bytes)
                guessed = guessed or unmeasured
            rows.append(
                PlanRow(
                    shown_as,
                    s.flavor.id,
                    s.model or "-",
                    declared,
                    _gib(counted),
                    s.latency_class.value,
                    "yes" if s.sticky else "no",
                    _residency(role in always, s.sticky),
                )
            )
        title = (
            f"node {node.name} ({node.address}, {run_by}): capacity {_gib(node.capacity_bytes)} GiB"
        )
        caption = "~: the roster's guess (unmeasured); GiB: what counts" if guessed else None
        tables.append(NodeTable(title, tuple(rows), caption))
    roster = config.roster
    # The import's count: the aliases served apart left ``skipped`` only for plan and up.
    skipped = len(roster.skipped) + len(roster.served_apart)
    return PlanTable(tuple(tables), tuple(result.unplaced), skipped, roster.served_apart)


def _residency(always: bool, sticky: bool) -> str:
    """The plan table's residency: ``always`` for an interactive role, else loaded on demand
    and, sticky (DESIGN.md), evicted only after every non-sticky candidate: a sticky batch
    role shown as plain "on demand" read as if stickiness had not been applied."""
    if always:
        return "always"
    return "on demand, evicted last" if sticky else "on demand"


def backend_event_text(event: BackendEvent) -> str | None:
    """What ``up`` says when a backend dies by itself and how the supervisor restarts it
    (``None`` for the events it does not say)."""
    if event.kind == "exited":
        code = event.exit_code
        how = (
            describe_exit(code)
            if code is not None and code < 0
            else f"exited by itself (code {code})"
        )
        return f"backend {event.name} {how}"
    if event.kind == "restarting":
        return f"restarting {event.name} in {event.delay_s or 0:.1f} s"
    if event.kind == "restart_failed":
        return f"restart of {event.name} failed: {event.detail}"
    return None


def open_listener_text(host: str) -> str:
    """The warning for a router on ``host`` (not a loopback address) with no API key."""
    return (
        f"listening on {host} without an API key: anyone who can reach this "
        "address can use every model and load or unload roles. Pass --api-key KEY (or "
        "set ROSTERD_API_KEY) to require one."
    )


def serving_text(roles: Iterable[str], url: str, *, keyed: bool) -> str:
    """What ``up`` says once it serves."""
    count = len(list(roles))
    key = "API key required" if keyed else "no API key"
    return f"rosterd serving {count} role(s) on {url}/v1 ({key}; Ctrl-C to stop)"
