"""What the fleet scheduler is made of (DESIGN.md layer 6, pure values): how each fleet node
is run, the configuration served, and what a plan gives one node.

Plain frozen values, no I/O: the fleet machine (:mod:`rosterd.fleet_scheduler.machine`)
decides on them, the fleet loop carries them to the effects, and a test builds
them by hand. The memory figures are reached through :class:`MemoryFigures`, a
Protocol that ``rosterd.memory.gathering.RosterMemory`` satisfies, so that this
layer needs none of the I/O that gathers them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rosterd.fleet.model import Fleet
from rosterd.roster.result import ImportedRoster, ImportedSpec
from rosterd.scheduler.values import DevicePool, NodeConcurrency
from rosterd.spec import InferenceSpec


class NodeRun(enum.Enum):
    """How a fleet node is run.

    ``LOCAL``: this machine's supervisor runs it (its address is this machine and no
    Ray node is there, or there is no Ray at all); ``AGENT``: a node agent on its Ray
    node runs it; ``ABSENT``: nothing runs it (not this machine, and no live Ray
    node has its address); ``LOST``: it ran on Ray and its Ray node or agent died.
    """

    LOCAL = "local"
    AGENT = "agent"
    ABSENT = "absent"
    LOST = "lost"

    @property
    def running(self) -> bool:
        """Whether the node runs backends (``LOCAL`` or ``AGENT``)."""
        return self in (NodeRun.LOCAL, NodeRun.AGENT)


@dataclass(frozen=True, slots=True)
class Connection:
    """What was found out about one fleet node before a change (the I/O is done: Ray's
    nodes listed and matched, addresses resolved): ``run`` is ``LOCAL``, ``AGENT`` (a
    live Ray node has its address: ``ray_node_id``) or ``ABSENT``; ``reason`` says how
    it is run (``Ray node 1a2b3c at 10.0.0.2``, ``this machine, no Ray node``) or why
    nothing runs it; ``ips``: the IPs its address resolved to (a lost node is found
    back by them)."""

    node: str
    address: str
    run: NodeRun
    reason: str
    ray_node_id: str | None = None
    ips: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """How one fleet node is run now (``run``), at which ``address``, ``reason`` in words
    (how it is run, why it is not, or why it is lost), its Ray node (``ray_node_id``,
    ``None`` when not on Ray; a lost node keeps the one it had) and the IPs its address
    resolved to (``ips``)."""

    run: NodeRun
    address: str
    reason: str
    ray_node_id: str | None = None
    ips: tuple[str, ...] = ()

    @classmethod
    def of(cls, connection: Connection) -> NodeStatus:
        """The status a fresh :class:`Connection` gives."""
        return cls(
            connection.run,
            connection.address,
            connection.reason,
            connection.ray_node_id,
            connection.ips,
        )


class MemoryFigures(Protocol):
    """Every role's memory figures, as ``rosterd.memory.gathering.RosterMemory`` holds them
    (DESIGN.md "Memory": the largest of ``ram_gb``, the estimate and the peak measured)."""

    @property
    def notes(self) -> tuple[str, ...]:
        """The measured-peaks files that were ignored, each saying why."""
        ...

    def planning_specs(self, specs: Iterable[InferenceSpec]) -> list[InferenceSpec]:
        """``specs`` with each role's memory set to its planning figure (bytes)."""
        ...

    def node_specs(self, specs: Mapping[str, InferenceSpec], node: str) -> dict[str, InferenceSpec]:
        """``specs`` (role -> spec) with each role's memory set to its figure on ``node``."""
        ...

    def reason_notes(self) -> dict[str, str]:
        """Role -> the words an unplaced reason adds after its figure."""
        ...

    def slots(self) -> dict[str, int]:
        """Role -> its backend's parallel slots."""
        ...

    def warnings(self) -> list[str]:
        """One line per role whose figure is far from its ``ram_gb``."""
        ...

    def role_json(self, role: str, node: str | None) -> dict[str, object] | None:
        """``role``'s figures on ``node`` as ``/status`` shows them, or ``None`` if unknown."""
        ...

    def fingerprints(self) -> dict[str, str]:
        """Role -> its run fingerprint (what its backend launches with)."""
        ...


@dataclass(frozen=True)
class ServedConfig:
    """One configuration, read and gathered (files imported, figures gathered, weights
    resolved on this machine): the imported ``roster``, the ``fleet``, the ``memory``
    figures, ``launch`` (role -> what it launches with on this machine, in words: its
    weights and run fingerprint; a role whose words change restarts once idle),
    ``unavailable_here`` (role -> why this machine cannot use its weights; such a role
    placed on a node of this machine is served as unavailable) and ``dialects`` (role ->
    the dialects its backend answers itself, ``Adapter.dialects_for`` its weights: a
    llama.cpp role reranks only when they are a reranker; a role not in it: its
    adapter's for unknown weights)."""

    roster: ImportedRoster
    fleet: Fleet
    memory: MemoryFigures
    launch: Mapping[str, str] = field(default_factory=dict)
    unavailable_here: Mapping[str, str] = field(default_factory=dict)
    dialects: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def first_by_role(self) -> dict[str, ImportedSpec]:
        """Role id -> its first imported entry: the one planned when an id is given twice."""
        first: dict[str, ImportedSpec] = {}
        for imported in self.roster.specs:
            first.setdefault(imported.spec.role, imported)
        return first

    def repos(self) -> dict[str, str | None]:
        """Role -> the roster's Hugging Face repo (``None`` when it names none)."""
        return {role: s.repo or None for role, s in self.first_by_role().items()}

    def model_names(self) -> dict[str, str]:
        """Role -> the roster's own ``name`` (an ollama tag such as ``llama3.1:8b``)."""
        return {role: s.name for role, s in self.first_by_role().items()}


@dataclass(frozen=True)
class NodeServing:
    """What one node serves under a plan (the one node-config builder's output,
    :func:`rosterd.fleet_scheduler.served.node_serving`), as the fleet machine decides it
    and the node schedulers' directory applies it (``NodeDirectory.apply_plan``, with
    the backends of each node beside it): its ``name``, budget (``capacity_bytes``), the
    roles placed there with their figures on it (``specs``: role -> spec), the roles it
    cannot serve (``unavailable``: role -> why), each role's figures as ``/status``
    shows them (``memory``: role -> ``RoleMemory.as_json``) and the node-wide limit on
    generations at once (``concurrency``; ``None``: a node kept keeps its own, a new one
    has none); ``run`` says who runs it (``LOCAL`` or ``AGENT``; ``LOST`` for a lost
    node that keeps the roles nowhere else could take); ``devices``: device id -> its
    pool as the node machine holds roles to it (none: host RAM alone)."""

    name: str
    capacity_bytes: int
    specs: Mapping[str, InferenceSpec]
    unavailable: Mapping[str, str] = field(default_factory=dict)
    memory: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    concurrency: NodeConcurrency | None = None
    run: NodeRun = NodeRun.LOCAL
    devices: Mapping[str, DevicePool] = field(default_factory=dict)
