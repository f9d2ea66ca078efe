"""The roster import's result and its JSON shape (layer 2; value types, no I/O).

:class:`ImportedRoster` holds the imported specs, the skipped entries with
their reasons, rosterd's warnings and the aliases; :func:`spec_to_json` is one
spec as ``rosterd roster import --json`` prints it (the reference's case-file
shape).
"""

from __future__ import annotations

from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field

from rosterd.spec import InferenceSpec


@dataclass(frozen=True)
class ImportedSpec:
    """One roster entry turned into a spec (as roster.rs ``ImportedSpec``).

    ``spec.model`` is the roster's display name when it is a plain token of at
    most 128 bytes, else ``None``; ``name`` keeps the raw display name. ``repo``
    and ``status`` are the roster's text (``""`` if missing). ``line`` is the
    1-based line where the entry starts. ``ram_gb_unmeasured`` marks a ``"~N"``
    ``ram_gb`` (the operator's guess; ``is_unmeasured_ram_gb``), which the
    reference reads as N and does not keep; views show it as unmeasured.
    """

    spec: InferenceSpec
    repo: str
    status: str
    name: str
    line: int
    ram_gb_unmeasured: bool = False


@dataclass(frozen=True)
class ImportedRoster:
    """The result of an import (as roster.rs ``ImportedRoster``).

    ``specs`` are the importable entries in roster order; ``skipped`` is
    ``(id, reason)`` for every entry not imported, in roster order, with the
    reference's reason text; ``warnings`` are rosterd's notes (no ``roster:``
    key or no entries, merge keys, overlay settings naming no roster entry,
    overlay roles given twice, aliases whose ``name`` differs from their
    target's), which never change the rest;
    ``aliases`` maps each id skipped as an alias to the role it aliases;
    ``alias_specs`` (rosterd's, not the reference's; never printed by the import) holds
    the spec each alias would have been on its own, for the fleet to serve it separately
    when it gives the alias other weights (``rosterd.weights.separate_aliases``);
    ``served_apart`` (rosterd's, empty from the import) names the aliases
    ``separate_aliases`` took out of ``skipped`` and ``aliases`` to serve on their own, so
    that ``up`` counts the skipped entries as the import does.
    """

    specs: tuple[ImportedSpec, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    aliases: AbcMapping[str, str] = field(default_factory=dict)
    alias_specs: AbcMapping[str, ImportedSpec] = field(default_factory=dict)
    served_apart: tuple[str, ...] = ()

    def get(self, id: str) -> ImportedSpec | None:
        """The imported spec whose role is ``id`` (the first, if several), else ``None``."""
        for imported in self.specs:
            if imported.spec.role == id:
                return imported
        return None


def spec_to_json(imported: ImportedSpec) -> dict[str, object]:
    """The spec as ``rosterd roster import --json`` prints it: exactly the keys
    ``role, flavor, model, port, weights_bytes, sticky, latency_class, excludes,
    repo, status`` (the reference's case-file shape)."""
    spec = imported.spec
    return {
        "role": spec.role,
        "flavor": spec.flavor.id,
        "model": spec.model,
        "port": spec.serve.port,
        "weights_bytes": spec.memory.weights_bytes,
        "sticky": spec.sticky,
        "latency_class": spec.latency_class.value,
        "excludes": list(spec.excludes),
        "repo": imported.repo,
        "status": imported.status,
    }
