"""The overlay: operator facts the roster lacks, and its file reader (layer 2).

:class:`RosterOverlay` holds ``excludes``, ``latency_class`` and ``sticky`` per
role (as roster.rs ``RosterOverlay``); :meth:`RosterOverlay.from_yaml` reads an
overlay file as the reference's serde does, with unknown keys an error.
:func:`overlay_warnings` names the overlay settings that apply to no roster
entry (rosterd's own notes; the import's result does not change).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from rosterd.roster._serde_yaml import DocumentReader, ReadError
from rosterd.roster._yaml_nodes import Document
from rosterd.roster.document import (
    MAX_OVERLAY_BYTES,
    LocatedError,
    as_bytes,
    key_mark,
    key_text,
    located,
    parse_document,
)
from rosterd.rust_debug import rust_debug_str
from rosterd.spec import LatencyClass

_OVERLAY_FIELDS: Final = ("excludes", "latency_class", "sticky")


@dataclass(frozen=True)
class RosterOverlay:
    """Operator facts the roster does not carry (as roster.rs ``RosterOverlay``).

    ``excludes`` maps a role to the roles it must never be resident beside
    (``planner`` or ``role:planner``), ``latency_class`` and ``sticky`` map a
    role to its class and stickiness. Roles not named keep the defaults
    (sticky, ``batch`` unless the role's text says voice or realtime).
    ``key_lines``, ``exclude_lines`` and ``warnings`` are rosterd's own: where
    each key was written, for the warnings :func:`overlay_warnings` gives about
    keys that name no roster entry.
    """

    excludes: AbcMapping[str, tuple[str, ...]] = field(default_factory=dict)
    latency_class: AbcMapping[str, LatencyClass] = field(default_factory=dict)
    sticky: AbcMapping[str, bool] = field(default_factory=dict)
    #: Where each role key was written: ``(section, role)`` → 1-based line (the
    #: last occurrence when a role is given twice). Empty for an overlay built in code.
    key_lines: AbcMapping[tuple[str, str], int] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: 1-based line of each ``excludes`` list item, aligned with ``excludes[role]``.
    exclude_lines: AbcMapping[str, tuple[int, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    #: Notes found while reading the overlay (a role given twice in one section).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_yaml(cls, text: str | bytes, *, file: str | None = None) -> RosterOverlay:
        """Read an overlay file as the reference's serde does.

        Top-level keys are ``excludes`` (role → list of roles), ``latency_class``
        (role → ``interactive``/``batch``, lowercase) and ``sticky`` (role →
        ``true``/``false``); any other key is an error, each may appear once.
        Role keys are the literal text of the key (``42:`` is role ``"42"``); a
        role given twice in one section keeps the last, with a warning naming
        both lines. An empty file is an empty overlay.

        Raises:
            RosterError: naming ``file``, the field path (``sticky.m1``), line
                and column, and what was expected.
        """
        data = as_bytes(text, file=file, what="overlay", limit=MAX_OVERLAY_BYTES)
        document = parse_document(data, file=file)
        reader = DocumentReader(document)
        try:
            return _read_overlay(reader, document)
        except LocatedError as err:
            raise err.to_error(file) from None
        except ReadError as err:
            raise located(err, "overlay").to_error(file) from None


def _read_overlay(reader: DocumentReader, document: Document) -> RosterOverlay:
    try:
        pairs = reader.read_struct(document.root, "a mapping of excludes, latency_class, sticky")
    except ReadError as err:
        raise located(err, None) from None
    seen: set[str] = set()
    excludes: dict[str, tuple[str, ...]] = {}
    latency: dict[str, LatencyClass] = {}
    sticky: dict[str, bool] = {}
    key_lines: dict[tuple[str, str], int] = {}
    exclude_lines: dict[str, tuple[int, ...]] = {}
    warnings: list[str] = []
    for key, value in pairs:
        name = key_text(reader, key, "(top level)")
        if name not in _OVERLAY_FIELDS:
            raise LocatedError(
                f"unknown field `{name}`; expected one of `excludes`, `latency_class`, `sticky`",
                None,
                key_mark(key),
            )
        if name in seen:
            raise LocatedError(
                f"`{name}` is given twice; expected each field once", name, key_mark(key)
            )
        seen.add(name)
        try:
            role_pairs = reader.read_struct(value, "a mapping of role to value")
        except ReadError as err:
            raise located(err, name) from None
        for role_key, role_value in role_pairs:
            role = key_text(reader, role_key, name)
            path = f"{name}.{role}"
            line = key_mark(role_key).line
            earlier = key_lines.get((name, role))
            if earlier is not None:
                warnings.append(
                    f"overlay {_shown_path(name, role)} (lines {earlier} and {line}): "
                    f"{rust_debug_str(role)} is given twice in `{name}`; "
                    f"the last (line {line}) is used"
                )
            key_lines[(name, role)] = line
            try:
                if name == "excludes":
                    items = reader.read_seq(role_value, "a list of roles")
                    excludes[role] = tuple(reader.read_str(i, "a role") for i in items)
                    exclude_lines[role] = tuple(key_mark(i).line for i in items)
                elif name == "latency_class":
                    variant = reader.read_unit_enum(role_value, ("interactive", "batch"))
                    latency[role] = LatencyClass(variant)
                else:
                    sticky[role] = reader.read_bool(role_value)
            except ReadError as err:
                raise located(err, path) from None
    return RosterOverlay(
        excludes=MappingProxyType(excludes),
        latency_class=MappingProxyType(latency),
        sticky=MappingProxyType(sticky),
        key_lines=MappingProxyType(key_lines),
        exclude_lines=MappingProxyType(exclude_lines),
        warnings=tuple(warnings),
    )


def _shown_path(section: str, role: str) -> str:
    """``section.role`` for a warning; the role quoted when it is empty or not printable."""
    shown = role if role and role.isprintable() and role.strip() == role else rust_debug_str(role)
    return f"{section}.{shown}"


#: Most overlay keys (or excludes items) naming no roster entry that get their
#: own warning; the rest are counted in one more.
_MAX_OVERLAY_MISSES: Final = 50


def overlay_warnings(overlay: RosterOverlay, ids: list[str]) -> list[str]:
    """Warnings for overlay settings that name no roster entry.

    ``ids`` are the ids of every roster entry (imported or skipped). A role key
    of ``excludes``, ``latency_class`` or ``sticky`` and an ``excludes`` item
    (one leading ``role:`` removed) that is none of them applies to nothing:
    each gets a warning naming the section, the key and its overlay line, and
    the closest id when one is close (for an excludes item, other than the
    role itself); past 50 such warnings one more gives the count. The import's
    result does not change.
    """
    known = set(ids)
    candidates = list(dict.fromkeys(ids))
    misses: list[str] = []

    def hint(name: str, not_this: str | None = None) -> str:
        if len(misses) >= _MAX_OVERLAY_MISSES:
            return ""
        pool = [c for c in candidates if c != not_this] if not_this is not None else candidates
        close = difflib.get_close_matches(name, pool, n=1, cutoff=0.75)
        return f" (did you mean {rust_debug_str(close[0])}?)" if close else ""

    def where(section: str, role: str, line: int | None) -> str:
        at = f" (line {line})" if line is not None else ""
        return f"overlay {_shown_path(section, role)}{at}"

    sections: tuple[tuple[str, AbcMapping[str, object]], ...] = (
        ("excludes", overlay.excludes),
        ("latency_class", overlay.latency_class),
        ("sticky", overlay.sticky),
    )
    for section, settings in sections:
        for role in settings:
            if role in known:
                continue
            line = overlay.key_lines.get((section, role))
            misses.append(
                f"{where(section, role, line)}: no roster entry has the id "
                f"{rust_debug_str(role)}; this setting applies to nothing{hint(role)}"
            )
    for role, excluded in overlay.excludes.items():
        lines = overlay.exclude_lines.get(role, ())
        for index, item in enumerate(excluded):
            target = item.removeprefix("role:")
            if target in known:
                continue
            line = lines[index] if index < len(lines) else None
            misses.append(
                f"{where('excludes', role, line)}: {rust_debug_str(item)} names no roster "
                f"entry; this exclusion applies to nothing{hint(target, not_this=role)}"
            )
    if len(misses) > _MAX_OVERLAY_MISSES:
        extra = len(misses) - _MAX_OVERLAY_MISSES
        misses = misses[:_MAX_OVERLAY_MISSES]
        misses.append(f"overlay: {extra} more settings name no roster entry")
    return misses
