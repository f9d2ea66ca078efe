"""The roster import (layer 2): the lab's roster file in, validated inference specs out.

Mirrors the reference ``seed/roster.rs`` (serde + serde_yaml 0.9) entry by
entry: the same specs field by field, the same skipped ids with the same
reason text, and the same accept/reject decision for the whole file. The YAML
syntax is libyaml's, through PyYAML's event parser, so no Python object is
ever constructed from the file's tags.

What rosterd adds to the reference: whole-file errors name the file, the field
path (``roster[3].port``), line and column, what was found and what is
expected; a merge key (``<<``), which the reference does not apply, gives a
warning naming the entry and line; so do a file without a ``roster:`` key or
without entries, overlay keys and excludes items naming no roster entry, and
an overlay role given twice (the reference keeps the last), and an entry
skipped as an alias whose ``name`` differs from its target's; each imported
spec keeps the roster's display name and line. The roster is opened
read-only and never written.

The package re-exports its value types only (``ImportedRoster``, ``ImportedSpec``,
``spec_to_json``), so that a pure module may import them without the reader; the
reader is :func:`rosterd.roster.importer.load_roster`. One concept a module:

* :mod:`~rosterd.roster.importer` — entries to specs or skips (``import_roster``,
  ``load_roster``, ``flavor_for_backend``, ``ram_bytes``);
* :mod:`~rosterd.roster.result` — ``ImportedSpec``, ``ImportedRoster`` and
  ``spec_to_json``;
* :mod:`~rosterd.roster.overlay` — ``RosterOverlay`` and its reader;
* :mod:`~rosterd.roster.entries` — the roster's entries as serde reads them;
* :mod:`~rosterd.roster.document` — the file's bytes, its YAML document, and
  located errors;
* ``_yaml_nodes``, ``_serde_yaml`` and ``_rust_std``: private emulation of the
  reference's libraries: libyaml's events as a node graph, serde_yaml 0.9's typed
  reads and limits, Rust's ``trim``, ``split_whitespace`` and ``parse``.
  Rust's ``{:?}`` string formatting is :mod:`rosterd.rust_debug` (layer 1), as
  spec validation quotes with it too.

Everything other modules use is re-exported here; import it from
``rosterd.roster``.
"""

from __future__ import annotations

from rosterd.roster.result import ImportedRoster, ImportedSpec, spec_to_json

__all__ = ["ImportedRoster", "ImportedSpec", "spec_to_json"]
