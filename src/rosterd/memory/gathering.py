"""Each role's memory figures, gathered in one place for ``plan``, ``up`` and ``models`` (layer 5).

DESIGN.md's rule, applied: a role counts the largest of its roster ``ram_gb``
(declared), the estimate from its weights' metadata and the peak RSS measured
on its last run on that node (``rosterd.memory.count`` decides, purely). This
module gathers those figures for a roster on a fleet, which is I/O: it resolves
each role's weights (``rosterd.weights``; never downloading), reads their facts
(``rosterd.model_facts``: a GGUF's header, an MLX folder's config and
safetensors headers), estimates (``rosterd.memory.estimate``, with the
settings the adapter launches with) and reads the measured peaks kept in the
state folder (``rosterd.memory.peaks``), under the run's fingerprint
(:func:`run_fingerprint`), so a peak measured with other settings does not count.

It then hands out specs whose ``memory`` is the counted figure:
:meth:`RosterMemory.planning_specs` for placement (a role not yet placed counts
the largest peak measured on any node) and :meth:`RosterMemory.node_specs` for
one node's scheduler (that node's peak). A role whose weights or facts cannot
be read keeps the roster's figure (and the measured peak); why is in
:attr:`RoleMemory.estimate_note`. ollama roles have no facts to read: ollama
reports its size only once loaded (``/api/ps``), so before a role's first load
the roster's figure stands and nothing is estimated; once it was loaded, the
size ollama reported is kept as its measured figure (the backends boundary reads
it, ``rosterd.memory.watch`` stores it) and is its estimate too (``estimate_ollama``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rosterd.adapters import adapter_for
from rosterd.adapters.llamacpp import DEFAULT_CTX_SIZE, DEFAULT_PARALLEL
from rosterd.errors import RosterdError
from rosterd.flavors import WeightsKind
from rosterd.fleet import Fleet
from rosterd.memory.count import (
    UNMEASURED_NOTE,
    CountedMemory,
    FigureSource,
    count_memory,
    counted_memory_spec,
    memory_warning,
    show_declared,
    show_gb,
)
from rosterd.memory.estimate import MemoryEstimate
from rosterd.memory.peaks import MeasuredPeaks
from rosterd.model_facts import ModelFacts
from rosterd.model_facts.reader import read_model_facts
from rosterd.roster import ImportedRoster, ImportedSpec
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import ResolvedWeights, WeightsSource, resolve_for_fleet


def serving_settings(source: WeightsSource | None) -> tuple[int, int, tuple[str, ...]]:
    """``(ctx_size, parallel, extra_args)`` a backend is launched with for ``source``:
    the fleet's values, else llama-server's launch defaults (tokens, slots)."""
    if source is None:
        return DEFAULT_CTX_SIZE, DEFAULT_PARALLEL, ()
    return (
        source.ctx_size or DEFAULT_CTX_SIZE,
        source.parallel or DEFAULT_PARALLEL,
        tuple(source.extra_args),
    )


def run_fingerprint(spec: InferenceSpec, source: WeightsSource | None) -> str:
    """What identifies a run's settings, as 16 hex digits: flavor, model, weights path and
    size, ``ctx_size``, ``parallel``, ``extra_args``, ``keep_kv``, ``cache_ram_mb`` and
    ``reranking``. A peak measured under another fingerprint is not counted for this one."""
    ctx, parallel, extra = serving_settings(source)
    size = source.size_bytes if isinstance(source, ResolvedWeights) else 0
    shape = [
        spec.flavor.id,
        spec.model or spec.role,
        str(source.path) if source is not None else None,
        size,
        ctx,
        parallel,
        list(extra),
        bool(getattr(source, "keep_kv", True)),
        getattr(source, "cache_ram_mb", None),
    ]
    if getattr(source, "reranking", False):
        shape.append("reranking")  # only when set: every other role keeps its measured peaks
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RoleMemory:
    """One role's memory figures (bytes).

    ``declared_bytes`` is the roster's ``ram_gb`` (``declared_unmeasured``: it
    was ``"~N"``); ``estimate`` the estimate from the weights (``None`` when
    there is none, ``estimate_note`` saying why); ``measured`` node -> the
    peak RSS of the role's last run there under this ``fingerprint``;
    ``weights``/``facts`` what was read (for ``rosterd models``); ``slots``
    the backend's parallel slots (the fleet's ``parallel``, default 1).
    """

    role: str
    flavor: InferFlavor
    declared_bytes: int
    declared_unmeasured: bool
    fingerprint: str
    estimate: MemoryEstimate | None = None
    estimate_note: str = ""
    measured: Mapping[str, int] = field(default_factory=dict)
    weights: ResolvedWeights | None = None
    facts: ModelFacts | None = None
    slots: int = DEFAULT_PARALLEL

    def measured_bytes(self, node: str | None = None) -> int | None:
        """The peak measured on ``node`` (``None``: the largest on any node), or ``None``."""
        if node is not None:
            return self.measured.get(node)
        return max(self.measured.values(), default=None)

    def counted(self, node: str | None = None) -> CountedMemory:
        """The figure that counts on ``node`` (``None``: for planning, any node's peak)."""
        return count_memory(
            self.declared_bytes,
            self.estimate.total_bytes if self.estimate is not None else None,
            self.measured_bytes(node),
            declared_unmeasured=self.declared_unmeasured,
        )

    def spec(self, spec: InferenceSpec, node: str | None = None) -> InferenceSpec:
        """``spec`` with ``memory`` set to the counted figure (parts kept from the estimate)."""
        memory = counted_memory_spec(self.counted(node), self.estimate)
        return dataclasses.replace(spec, memory=memory)

    def as_json(self, node: str | None = None) -> dict[str, object]:
        """The figures as ``plan --json``, ``/status`` and ``ps`` show them: ``declared_bytes``,
        ``declared_unmeasured``, ``estimated_bytes``, ``measured_bytes``, ``counted_bytes``,
        ``counted_from`` (``roster``, ``estimate`` or ``measured``), ``estimate`` (its
        ``weights_bytes``, ``kv_bytes``, ``overhead_bytes``, or ``None``) and
        ``estimate_note``."""
        counted = self.counted(node)
        estimate = self.estimate
        return {
            "declared_bytes": self.declared_bytes,
            "declared_unmeasured": self.declared_unmeasured,
            "estimated_bytes": estimate.total_bytes if estimate is not None else None,
            "measured_bytes": counted.measured_bytes,
            "counted_bytes": counted.counted_bytes,
            "counted_from": counted.source.value,
            "estimate": None
            if estimate is None
            else {
                "weights_bytes": estimate.weights_bytes,
                "kv_bytes": estimate.kv_bytes,
                "overhead_bytes": estimate.overhead_bytes,
            },
            "estimate_note": self.estimate_note,
        }


@dataclass(frozen=True)
class RosterMemory:
    """Every role's :class:`RoleMemory` by role id, and ``notes``: the measured-peaks files
    that were ignored (each says why)."""

    roles: Mapping[str, RoleMemory]
    notes: tuple[str, ...] = ()

    def planning_specs(self, specs: Iterable[InferenceSpec]) -> list[InferenceSpec]:
        """``specs`` (same order) with each known role's memory set to its planning figure."""
        return [self.roles[s.role].spec(s) if s.role in self.roles else s for s in specs]

    def node_specs(self, specs: Mapping[str, InferenceSpec], node: str) -> dict[str, InferenceSpec]:
        """``specs`` (role -> spec) with each role's memory set to its figure on ``node``."""
        return {
            role: self.roles[role].spec(s, node) if role in self.roles else s
            for role, s in specs.items()
        }

    def warnings(self) -> list[str]:
        """One line per role whose planning figure is more than 20 % away from ``ram_gb``."""
        out = []
        for role, memory in self.roles.items():
            warning = memory_warning(role, memory.counted())
            if warning is not None:
                out.append(warning)
        return out

    def reason_notes(self) -> dict[str, str]:
        """Role -> what placement adds after the figure in an unplaced reason, for roles
        whose counted figure is not the roster's: where it came from and ``ram_gb``; for
        roles that count the roster's ``"~N"``: ``UNMEASURED_NOTE``."""
        notes: dict[str, str] = {}
        for role, memory in self.roles.items():
            counted = memory.counted()
            if counted.counted_bytes != memory.declared_bytes:
                declared = show_declared(memory.declared_bytes, memory.declared_unmeasured)
                where = _SOURCE_WORDS[counted.source]
                notes[role] = f"counted from {where}; the roster's ram_gb says {declared}"
            elif memory.declared_unmeasured:
                notes[role] = UNMEASURED_NOTE
        return notes

    def slots(self) -> dict[str, int]:
        """Role -> its backend's parallel slots."""
        return {role: memory.slots for role, memory in self.roles.items()}

    def role_json(self, role: str, node: str | None) -> dict[str, object] | None:
        """``role``'s figures on ``node`` (``RoleMemory.as_json``), or ``None`` if unknown."""
        memory = self.roles.get(role)
        return memory.as_json(node) if memory is not None else None

    def fingerprints(self) -> dict[str, str]:
        """Role -> its run fingerprint (``RoleMemory.fingerprint``)."""
        return {role: memory.fingerprint for role, memory in self.roles.items()}


_SOURCE_WORDS = {
    FigureSource.MEASURED: "the peak measured on its last run",
    FigureSource.ESTIMATE: "the estimate from its weights",
    FigureSource.ROSTER: "the roster",
}


def gather_memory(
    roster: ImportedRoster,
    fleet: Fleet,
    state_dir: Path | None,
    *,
    hf_cache_dir: Path | None = None,
) -> RosterMemory:
    """Every imported role's figures on ``fleet`` (see the module docstring).

    ``state_dir`` holds the measured peaks (``None``: none are read). A role
    given twice keeps its first entry, as placement does. Never raises for a
    role whose weights or facts cannot be read: it has no estimate, and says why.
    """
    peaks = MeasuredPeaks(state_dir) if state_dir is not None else None
    roles: dict[str, RoleMemory] = {}
    for imported in roster.specs:
        if imported.spec.role not in roles:
            roles[imported.spec.role] = _role_memory(imported, fleet, peaks, hf_cache_dir)
    notes = peaks.warnings if peaks is not None else ()
    return RosterMemory(roles=roles, notes=tuple(notes))


def _role_memory(
    imported: ImportedSpec,
    fleet: Fleet,
    peaks: MeasuredPeaks | None,
    hf_cache_dir: Path | None,
) -> RoleMemory:
    spec = imported.spec
    weights: ResolvedWeights | None = None
    facts: ModelFacts | None = None
    estimate: MemoryEstimate | None = None
    note = ""
    adapter = adapter_for(spec.flavor)
    if spec.flavor.facts.weights is WeightsKind.SERVER_STORE:
        note = f"{spec.flavor.id} keeps its own weights: there is nothing to estimate from"
    else:
        try:
            weights = resolve_for_fleet(
                spec, fleet, repo=imported.repo or None, hf_cache_dir=hf_cache_dir
            )
            if weights is not None:
                facts = read_model_facts(weights.path)
                ctx, parallel, extra = serving_settings(weights)
                estimate = adapter.estimate_memory(
                    facts,
                    ctx_size=ctx,
                    parallel=parallel,
                    extra_args=extra,
                    keep_kv=weights.keep_kv,
                    cache_ram_mb=weights.cache_ram_mb,
                )
        except RosterdError as exc:
            note = f"no estimate: {exc}"
    fingerprint = run_fingerprint(spec, weights)
    measured: dict[str, int] = {}
    if peaks is not None:
        for node in fleet.nodes:
            peak = peaks.peak_bytes(node.name, spec.role, fingerprint=fingerprint)
            if peak is not None:
                measured[node.name] = peak
    shared = adapter.shared_server
    if shared is not None:  # what the server reported holding is the role's figure (ollama)
        reported = shared.reported_estimate(
            max(measured.values(), default=None), spec.memory.weights_bytes
        )
        if reported[0] is not None or estimate is None:
            estimate, note = reported
    _, slots, _ = serving_settings(weights or _fleet_source(fleet, imported))
    return RoleMemory(
        role=spec.role,
        flavor=spec.flavor,
        declared_bytes=spec.memory.weights_bytes,
        declared_unmeasured=imported.ram_gb_unmeasured,
        fingerprint=fingerprint,
        estimate=estimate,
        estimate_note=note,
        measured=measured,
        weights=weights,
        facts=facts,
        slots=slots,
    )


def _fleet_source(fleet: Fleet, imported: ImportedSpec) -> WeightsSource | None:
    """The fleet's ``models:`` entry of a role (by role id, then model name), if any."""
    spec = imported.spec
    for key in (spec.role, spec.model):
        if key and key in fleet.models:
            return fleet.models[key]
    return None


def describe(memory: RoleMemory, node: str | None = None) -> Sequence[str]:
    """The figures in words: declared, estimated, measured and counted (with its source)."""
    counted = memory.counted(node)
    estimate = memory.estimate
    figure = show_gb(counted.counted_bytes)
    if counted.source is FigureSource.ROSTER and memory.declared_unmeasured:
        figure = f"~{figure}"
    return (
        show_declared(memory.declared_bytes, memory.declared_unmeasured),
        show_gb(estimate.total_bytes) if estimate is not None else "-",
        show_gb(counted.measured_bytes) if counted.measured_bytes is not None else "-",
        f"{figure} ({counted.source.value})",
    )
