"""The roster import (layer 2): the lab's roster file in, validated inference specs out.

Mirrors the reference ``seed/roster.rs`` (serde + serde_yaml 0.9) entry by
entry: the same specs field by field, the same skipped ids with the same
reason text, and the same accept/reject decision for the whole file. The
rules for reading each field are in :mod:`rosterd.serde_yaml_rules`; the YAML
syntax is libyaml's, through PyYAML's event parser (:mod:`rosterd.yaml_nodes`),
so no Python object is ever constructed from the file's tags.

What rosterd adds to the reference: whole-file errors name the file, the field
path (``roster[3].port``), line and column, what was found and what is
expected; a merge key (``<<``), which the reference does not apply, gives a
warning naming the entry and line; so do a file without a ``roster:`` key or
without entries, overlay keys and excludes items naming no roster entry, and
an overlay role given twice (the reference keeps the last), and an entry
skipped as an alias whose ``name`` differs from its target's; each imported
spec keeps the roster's display name and line. The roster is opened
read-only and never written.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Final

from rosterd.errors import RosterError, SpecError
from rosterd.rust_debug import rust_debug_str
from rosterd.serde_yaml_rules import (
    ROOT_DEPTH,
    DocumentReader,
    Number,
    ReadError,
    rust_parse_f64,
    rust_split_whitespace,
    rust_trim,
)
from rosterd.spec import InferenceSpec, InferFlavor, LatencyClass, MemorySpec, ServeSpec
from rosterd.tokens import GB, valid_token
from rosterd.yaml_nodes import (
    Alias,
    Document,
    Item,
    Mark,
    Scalar,
    ScalarStyle,
    YamlSyntaxError,
    load_single_document,
)

#: Largest roster file read, in bytes (as roster.rs ``MAX_ROSTER_BYTES``).
MAX_ROSTER_BYTES: Final = 1_048_576
#: Most entries a roster may list (as roster.rs ``MAX_ENTRIES``).
MAX_ENTRIES: Final = 256
#: Largest overlay file read, in bytes (rosterd's own bound; overlays are small).
MAX_OVERLAY_BYTES: Final = MAX_ROSTER_BYTES

_ENTRY_FIELDS: Final = ("id", "role", "name", "repo", "ram_gb", "backend", "port", "status")
_OVERLAY_FIELDS: Final = ("excludes", "latency_class", "sticky")
#: serde_yaml's remaining depth when it reads an entry's ``ram_gb``
#: (file mapping, ``roster`` sequence and entry mapping each take one level).
_RAM_GB_DEPTH: Final = ROOT_DEPTH - 3
_MAX_RAM_GB: Final = 4096.0


@dataclass(frozen=True)
class RosterOverlay:
    """Operator facts the roster does not carry (as roster.rs ``RosterOverlay``).

    ``excludes`` maps a role to the roles it must never be resident beside
    (``planner`` or ``role:planner``), ``latency_class`` and ``sticky`` map a
    role to its class and stickiness. Roles not named keep the defaults
    (sticky, ``batch`` unless the role's text says voice or realtime).
    ``key_lines``, ``exclude_lines`` and ``warnings`` are rosterd's own: where
    each key was written, for the warnings :func:`import_roster` gives about
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
        data = _as_bytes(text, file=file, what="overlay", limit=MAX_OVERLAY_BYTES)
        document = _parse(data, file=file)
        reader = DocumentReader(document)
        try:
            return _read_overlay(reader, document)
        except _LocatedError as err:
            raise err.to_error(file) from None
        except ReadError as err:
            raise _located(err, "overlay").to_error(file) from None


@dataclass(frozen=True)
class ImportedSpec:
    """One roster entry turned into a spec (as roster.rs ``ImportedSpec``).

    ``spec.model`` is the roster's display name when it is a plain token of at
    most 128 bytes, else ``None``; ``name`` keeps the raw display name. ``repo``
    and ``status`` are the roster's text (``""`` if missing). ``line`` is the
    1-based line where the entry starts.
    """

    spec: InferenceSpec
    repo: str
    status: str
    name: str
    line: int


@dataclass(frozen=True)
class ImportedRoster:
    """The result of an import (as roster.rs ``ImportedRoster``).

    ``specs`` are the importable entries in roster order; ``skipped`` is
    ``(id, reason)`` for every entry not imported, in roster order, with the
    reference's reason text; ``warnings`` are rosterd's notes (no ``roster:``
    key or no entries, merge keys, overlay settings naming no roster entry,
    overlay roles given twice, aliases whose ``name`` differs from their
    target's), which never change the rest;
    ``aliases`` maps each id skipped as an alias to the role it aliases.
    """

    specs: tuple[ImportedSpec, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    aliases: AbcMapping[str, str] = field(default_factory=dict)

    def get(self, id: str) -> ImportedSpec | None:
        """The imported spec whose role is ``id`` (the first, if several), else ``None``."""
        for imported in self.specs:
            if imported.spec.role == id:
                return imported
        return None


def flavor_for_backend(backend: str) -> InferFlavor | None:
    """The adapter flavor the roster's ``backend`` text names (as roster.rs).

    The first whitespace-separated word (Unicode White_Space, as Rust's
    ``split_whitespace``), ASCII-lowercased: ``mlx_lm``/``mlx-lm`` → MLX_LM,
    ``llamacpp``/``llama.cpp``/``llama-server`` → LLAMACPP, ``ollama`` → OLLAMA;
    anything else (``mlx-vlm``, ``mlx-audio``, empty) → ``None``.
    """
    words = rust_split_whitespace(backend)
    if not words:
        return None
    first = _ascii_lower(words[0])
    if first in ("mlx_lm", "mlx-lm"):
        return InferFlavor.MLX_LM
    if first in ("llamacpp", "llama.cpp", "llama-server"):
        return InferFlavor.LLAMACPP
    if first == "ollama":
        return InferFlavor.OLLAMA
    return None


def ram_bytes(value: object) -> int | None:
    """Weight bytes for a ``ram_gb`` value (as roster.rs ``ram_bytes``), or ``None``.

    A number, or a string trimmed of whitespace and of every leading ``~`` then
    read by Rust's ``f64`` grammar; finite and within 0..=4096 GB; bytes are
    ``trunc(gb * 2^30)``.
    """
    if isinstance(value, Number):
        gb = value.as_f64()
    elif isinstance(value, str):
        parsed = rust_parse_f64(rust_trim(value).lstrip("~"))
        if parsed is None:
            return None
        gb = parsed
    else:
        return None
    if not (gb == gb and abs(gb) != float("inf") and 0.0 <= gb <= _MAX_RAM_GB):
        return None
    return int(gb * float(GB))


def import_roster(
    text: str | bytes, overlay: RosterOverlay | None = None, *, file: str | None = None
) -> ImportedRoster:
    """Import roster YAML (as roster.rs ``import_roster``).

    ``text`` is the file's bytes (or text); ``overlay`` supplies excludes,
    latency classes and stickiness; ``file`` names the file in errors.

    Raises:
        RosterError: the whole file is rejected (over 1 MiB, not UTF-8, not
            one YAML document, a wrong type or a duplicate for a known field,
            a missing ``id``, over 256 entries, ...), naming the file, field
            path, line and column, what was found and what was expected.
    """
    overlay = overlay or RosterOverlay()
    data = _as_bytes(text, file=file, what="roster", limit=MAX_ROSTER_BYTES)
    document = _parse(data, file=file)
    reader = DocumentReader(document)
    try:
        raws, warnings = _read_roster(reader, document)
    except _LocatedError as err:
        raise err.to_error(file) from None
    except ReadError as err:
        raise _located(err, "roster").to_error(file) from None
    warnings += overlay.warnings
    warnings += _overlay_warnings(overlay, [raw.id for raw in raws])
    return _import_entries(raws, overlay, warnings)


def load_roster(path: Path, overlay_path: Path | None = None) -> ImportedRoster:
    """Read the roster at ``path`` (opened read-only, never written) and import it.

    Raises:
        RosterError: the roster or overlay cannot be read or is rejected; the
            message names the file.
    """
    overlay = None
    if overlay_path is not None:
        overlay_data = _read_file(overlay_path, MAX_OVERLAY_BYTES, "overlay")
        overlay = RosterOverlay.from_yaml(overlay_data, file=str(overlay_path))
    data = _read_file(path, MAX_ROSTER_BYTES, "roster")
    return import_roster(data, overlay, file=str(path))


# --- reading ------------------------------------------------------------------


def _read_file(path: Path, limit: int, what: str) -> bytes:
    """The file's bytes (at most ``limit + 1`` read), opened read-only."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise RosterError(
            f"cannot open the {what}: {err.strerror or err}", file=str(path)
        ) from None
    try:
        with os.fdopen(fd, "rb", closefd=True) as handle:
            return handle.read(limit + 1)
    except OSError as err:
        raise RosterError(
            f"cannot read the {what}: {err.strerror or err}", file=str(path)
        ) from None


def _as_bytes(text: str | bytes, *, file: str | None, what: str, limit: int) -> bytes:
    if isinstance(text, str):
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RosterError(
                f"the {what} text holds a lone surrogate at character {err.start}; "
                "expected UTF-8 text",
                file=file,
            ) from None
    else:
        data = bytes(text)
    if len(data) > limit:
        raise RosterError(
            f"the {what} is over {limit} bytes ({len(data)} or more); "
            f"expected at most {limit} bytes",
            file=file,
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        line_start = data.rfind(b"\n", 0, err.start) + 1
        column = len(data[line_start : err.start].decode("utf-8", "replace")) + 1
        raise RosterError(
            f"invalid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}); "
            f"expected the {what} as UTF-8 text, comments included",
            file=file,
            line=line,
            column=column,
        ) from None
    return data


def _parse(data: bytes, *, file: str | None) -> Document:
    try:
        return load_single_document(data)
    except YamlSyntaxError as err:
        message = f"not valid YAML: {err.message}"
        if err.line is not None and "\t" in _line_text(data, err.line):
            message += " (indent with spaces; YAML forbids tabs in indentation)"
        raise RosterError(message, file=file, line=err.line, column=err.column) from None


def _line_text(data: bytes, line: int) -> str:
    lines = data.split(b"\n", line)
    return lines[line - 1].decode("utf-8", "replace") if len(lines) >= line else ""


class _LocatedError(Exception):
    """A ReadError with its field path, on its way to becoming a RosterError."""

    def __init__(self, message: str, path: str | None, mark: Mark | None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.mark = mark

    def to_error(self, file: str | None) -> RosterError:
        return RosterError(
            self.message,
            file=file,
            path=self.path,
            line=self.mark.line if self.mark else None,
            column=self.mark.column if self.mark else None,
        )


def _located(err: ReadError, path: str | None) -> _LocatedError:
    message = f"found {err.found}; expected {err.expected}"
    if err.hint:
        message += f" ({err.hint})"
    mark = err.item.mark if err.item is not None else None
    return _LocatedError(message, path, mark)


@dataclass(slots=True)
class _RawEntry:
    """One roster entry's fields as serde reads them (roster.rs ``Raw``)."""

    id: str
    role: str
    name: str
    repo: str
    ram_gb: object
    backend: str
    port: int | None
    status: str
    line: int


def _key_text(reader: DocumentReader, key: Item, path: str) -> str:
    try:
        return reader.read_str(key, "a field name (plain text)")
    except ReadError as err:
        raise _located(err, path) from None


def _read_roster(reader: DocumentReader, document: Document) -> tuple[list[_RawEntry], list[str]]:
    root = document.root
    try:
        pairs = reader.read_struct(root, "a mapping with a `roster:` list")
    except ReadError as err:
        raise _located(err, None) from None
    roster_item: Item | None = None
    other_keys: list[tuple[str, int]] = []
    for key, value in pairs:
        name = _key_text(reader, key, "(top level)")
        if name != "roster":
            other_keys.append((name, _key_mark(key).line))
            continue  # unknown top-level keys are ignored, as serde does
        if roster_item is not None:
            raise _LocatedError(
                "`roster` is given twice; expected it once", "roster", _key_mark(key)
            )
        roster_item = value
    if roster_item is None:
        return [], [_no_roster_key_warning(other_keys)]
    try:
        items = reader.read_seq(roster_item, "a list of entries")
    except ReadError as err:
        raise _located(err, "roster") from None
    if not items:
        return [], [_NO_ENTRIES]
    if len(items) > MAX_ENTRIES:
        raise _LocatedError(
            f"the roster lists {len(items)} entries; expected at most {MAX_ENTRIES}",
            "roster",
            _key_mark(roster_item),
        )
    entries: list[_RawEntry] = []
    warnings: list[str] = []
    for index, item in enumerate(items):
        entries.append(_read_entry(reader, item, f"roster[{index}]", warnings))
    return entries, warnings


#: The warning for a roster without entries (an empty file, ``roster:`` with no value).
_NO_ENTRIES: Final = "the roster lists no entries; nothing is imported"
#: Most top-level keys a warning names.
_MAX_KEYS_SHOWN: Final = 8


def _no_roster_key_warning(keys: list[tuple[str, int]]) -> str:
    """The warning for a file without a ``roster`` key, naming the keys it has.

    ``keys`` is ``(key text, 1-based line)`` per top-level key, in file order.
    """
    if not keys:
        return _NO_ENTRIES
    names = list(dict.fromkeys(name for name, _ in keys))
    shown = ", ".join(rust_debug_str(name) for name in names[:_MAX_KEYS_SHOWN])
    if len(names) > _MAX_KEYS_SHOWN:
        shown += f" and {len(names) - _MAX_KEYS_SHOWN} more"
    hint = ""
    close = difflib.get_close_matches("roster", names[:_MAX_KEYS_SHOWN], n=1, cutoff=0.6)
    if close:
        hint = f" ({rust_debug_str(close[0])} looks like a misspelt `roster`)"
    return (
        f"the file has no `roster:` key (top-level keys: {shown}, line {keys[0][1]}); "
        f"a roster is a mapping with a `roster:` list of entries, so nothing is imported{hint}"
    )


def _key_mark(item: Item) -> Mark:
    """Where ``item`` was written (an alias: where the alias is)."""
    return item.mark


def _read_entry(reader: DocumentReader, item: Item, path: str, warnings: list[str]) -> _RawEntry:
    try:
        pairs = reader.read_struct(item, "an entry (a mapping with at least `id:`)")
    except ReadError as err:
        raise _located(err, path) from None
    node = item.target if isinstance(item, Alias) else item
    values: dict[str, object] = {}
    merge_line: int | None = None
    for key, value in pairs:
        name = _key_text(reader, key, path)
        if name not in _ENTRY_FIELDS:
            key_node = key.target if isinstance(key, Alias) else key
            if (
                name == "<<"
                and isinstance(key_node, Scalar)
                and key_node.style is ScalarStyle.PLAIN
            ):
                merge_line = key_node.mark.line
            continue  # unknown keys are ignored (their values are never read)
        field_path = f"{path}.{name}"
        if name in values:
            raise _LocatedError(
                f"`{name}` is given twice in this entry; expected each field once",
                field_path,
                _key_mark(key),
            )
        try:
            if name == "ram_gb":
                values[name] = reader.read_value(value, _RAM_GB_DEPTH)
            elif name == "port":
                values[name] = reader.read_optional_u16(value)
            else:
                values[name] = reader.read_str(value)
        except ReadError as err:
            raise _located(err, field_path) from None
    if "id" not in values:
        raise _LocatedError(
            "the entry has no `id`; expected every entry to have one", path, node.mark
        )
    raw = _RawEntry(
        id=str(values["id"]),
        role=str(values.get("role", "")),
        name=str(values.get("name", "")),
        repo=str(values.get("repo", "")),
        ram_gb=values.get("ram_gb"),
        backend=str(values.get("backend", "")),
        port=_int_or_none(values.get("port")),
        status=str(values.get("status", "")),
        line=node.mark.line,
    )
    if merge_line is not None:
        warnings.append(
            f"{path} (id {rust_debug_str(raw.id)}, line {merge_line}): the merge key `<<` is "
            "not applied (YAML 1.2 has no merge keys); the entry lacks the fields it would "
            "inherit"
        )
    return raw


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _read_overlay(reader: DocumentReader, document: Document) -> RosterOverlay:
    try:
        pairs = reader.read_struct(document.root, "a mapping of excludes, latency_class, sticky")
    except ReadError as err:
        raise _located(err, None) from None
    seen: set[str] = set()
    excludes: dict[str, tuple[str, ...]] = {}
    latency: dict[str, LatencyClass] = {}
    sticky: dict[str, bool] = {}
    key_lines: dict[tuple[str, str], int] = {}
    exclude_lines: dict[str, tuple[int, ...]] = {}
    warnings: list[str] = []
    for key, value in pairs:
        name = _key_text(reader, key, "(top level)")
        if name not in _OVERLAY_FIELDS:
            raise _LocatedError(
                f"unknown field `{name}`; expected one of `excludes`, `latency_class`, `sticky`",
                None,
                _key_mark(key),
            )
        if name in seen:
            raise _LocatedError(
                f"`{name}` is given twice; expected each field once", name, _key_mark(key)
            )
        seen.add(name)
        try:
            role_pairs = reader.read_struct(value, "a mapping of role to value")
        except ReadError as err:
            raise _located(err, name) from None
        for role_key, role_value in role_pairs:
            role = _key_text(reader, role_key, name)
            path = f"{name}.{role}"
            line = _key_mark(role_key).line
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
                    exclude_lines[role] = tuple(_key_mark(i).line for i in items)
                elif name == "latency_class":
                    variant = reader.read_unit_enum(role_value, ("interactive", "batch"))
                    latency[role] = LatencyClass(variant)
                else:
                    sticky[role] = reader.read_bool(role_value)
            except ReadError as err:
                raise _located(err, path) from None
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


# --- import -------------------------------------------------------------------

#: Most overlay keys (or excludes items) naming no roster entry that get their
#: own warning; the rest are counted in one more.
_MAX_OVERLAY_MISSES: Final = 50


def _overlay_warnings(overlay: RosterOverlay, ids: list[str]) -> list[str]:
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


def _ascii_lower(text: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def _alias_name_warning(index: int, alias: _RawEntry, target: _RawEntry) -> str:
    """The warning for an alias entry whose ``name`` differs from its target's.

    ``index`` is the alias entry's 0-based position in the roster. The entry is
    skipped as an alias (same flavor, port and repo as ``target``), so requests
    for it are served by the target's model although its name says otherwise.
    """
    alias_id, target_id = rust_debug_str(alias.id), rust_debug_str(target.id)
    return (
        f"roster[{index}] (id {alias_id}, line {alias.line}): skipped as an alias of "
        f"{target_id} (line {target.line}), which has the same backend flavor, port and repo, "
        f"but it is named {rust_debug_str(alias.name)} where {target_id} is named "
        f"{rust_debug_str(target.name)}; requests for {alias_id} are served by {target_id}. "
        f"Give {alias_id} its own `port` or `repo` to serve it separately (entries on the "
        "same backend without port and repo are aliases of each other), or the same "
        "`name` if it is meant as an alias"
    )


def _import_entries(
    raws: list[_RawEntry], overlay: RosterOverlay, warnings: list[str]
) -> ImportedRoster:
    specs: list[ImportedSpec] = []
    skipped: list[tuple[str, str]] = []
    aliases: dict[str, str] = {}
    # (flavor id, port, repo) -> id of the first imported entry, to spot aliases.
    seen: dict[tuple[str, int | None, str], str] = {}
    # id of each imported entry -> its raw entry, for the alias warning.
    imported_raws: dict[str, _RawEntry] = {}
    for index, raw in enumerate(raws):
        if not valid_token(raw.id, 64):
            skipped.append((raw.id, "id is not a plain token"))
            continue
        flavor = flavor_for_backend(raw.backend)
        if flavor is None:
            skipped.append(
                (raw.id, f"backend {rust_debug_str(raw.backend)} has no inference adapter")
            )
            continue
        key = (flavor.id, raw.port, raw.repo)
        first = seen.get(key)
        if first is not None:
            skipped.append((raw.id, f"alias of {first} (same server, port and weights)"))
            aliases[raw.id] = first
            target = imported_raws[first]
            if raw.name != target.name:
                warnings.append(_alias_name_warning(index, raw, target))
            continue
        weights = ram_bytes(raw.ram_gb)
        if weights is None:
            skipped.append((raw.id, "ram_gb is missing or not a number"))
            continue
        latency = overlay.latency_class.get(raw.id)
        if latency is None:
            text = _ascii_lower(f"{raw.id} {raw.role}")
            voice = "voice" in text or "realtime" in text
            latency = LatencyClass.INTERACTIVE if voice else LatencyClass.BATCH
        spec = InferenceSpec(
            role=raw.id,
            flavor=flavor,
            model=raw.name if valid_token(raw.name, 128) else None,
            serve=ServeSpec(port=raw.port),
            memory=MemorySpec(weights_bytes=weights),
            sticky=overlay.sticky.get(raw.id, True),
            latency_class=latency,
            excludes=tuple(overlay.excludes.get(raw.id, ())),
        )
        try:
            spec.validate()
        except SpecError as err:
            skipped.append((raw.id, f"not a valid inference spec: {err}"))
            continue
        seen[key] = raw.id
        imported_raws[raw.id] = raw
        specs.append(
            ImportedSpec(spec=spec, repo=raw.repo, status=raw.status, name=raw.name, line=raw.line)
        )
    return ImportedRoster(
        specs=tuple(specs),
        skipped=tuple(skipped),
        warnings=tuple(warnings),
        aliases=MappingProxyType(aliases),
    )


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
