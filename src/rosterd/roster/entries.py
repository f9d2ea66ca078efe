"""The roster file's entries as serde reads them (layer 2).

:func:`read_roster` walks the document as the reference's ``#[derive(Deserialize)]``
structs do: the top-level ``roster`` list and, per entry, the known fields
``id role name repo ram_gb backend port status`` (unknown keys ignored, their
values never read). It notes, as warnings, what the reference silently
accepts: a file without a ``roster:`` key or without entries, a merge key
(``<<``), which YAML 1.2 and the reference do not apply, and an unknown key
close to a missing known one (``ramgb`` for ``ram_gb``: "did you mean").
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Final

from rosterd.roster._serde_yaml import ROOT_DEPTH, DocumentReader, ReadError
from rosterd.roster._yaml_nodes import Alias, Document, Item, Scalar, ScalarStyle
from rosterd.roster.document import LocatedError, key_mark, key_text, located
from rosterd.rust_debug import rust_debug_str

#: Most entries a roster may list (as roster.rs ``MAX_ENTRIES``).
MAX_ENTRIES: Final = 256

_ENTRY_FIELDS: Final = ("id", "role", "name", "repo", "ram_gb", "backend", "port", "status")
#: serde_yaml's remaining depth when it reads an entry's ``ram_gb``
#: (file mapping, ``roster`` sequence and entry mapping each take one level).
_RAM_GB_DEPTH: Final = ROOT_DEPTH - 3


@dataclass(slots=True)
class RawEntry:
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
    backend_line: int | None = None  # where ``backend`` was written, for warnings


def read_roster(
    reader: DocumentReader, document: Document, *, file: str | None = None
) -> tuple[list[RawEntry], list[str]]:
    """The roster's entries in file order, and the warnings found while reading them.

    ``file`` names the file in the warnings about an entry's keys.

    Raises:
        LocatedError: the file is rejected (the root is not a mapping, ``roster``
            given twice or not a list, over :data:`MAX_ENTRIES` entries, an entry
            that is not a mapping, has no ``id``, repeats a field, or a field the
            reference cannot read), with the field path and mark.
    """
    root = document.root
    try:
        pairs = reader.read_struct(root, "a mapping with a `roster:` list")
    except ReadError as err:
        raise located(err, None) from None
    roster_item: Item | None = None
    other_keys: list[tuple[str, int]] = []
    for key, value in pairs:
        name = key_text(reader, key, "(top level)")
        if name != "roster":
            other_keys.append((name, key_mark(key).line))
            continue  # unknown top-level keys are ignored, as serde does
        if roster_item is not None:
            raise LocatedError("`roster` is given twice; expected it once", "roster", key_mark(key))
        roster_item = value
    if roster_item is None:
        return [], [_no_roster_key_warning(other_keys, file)]
    try:
        items = reader.read_seq(roster_item, "a list of entries")
    except ReadError as err:
        raise located(err, "roster") from None
    if not items:
        return [], [_NO_ENTRIES]
    if len(items) > MAX_ENTRIES:
        raise LocatedError(
            f"the roster lists {len(items)} entries; expected at most {MAX_ENTRIES}",
            "roster",
            key_mark(roster_item),
        )
    entries: list[RawEntry] = []
    warnings: list[str] = []
    for index, item in enumerate(items):
        entries.append(_read_entry(reader, item, f"roster[{index}]", warnings, file))
    return entries, warnings


#: The warning for a roster without entries (an empty file, ``roster:`` with no value).
_NO_ENTRIES: Final = "the roster lists no entries; nothing is imported"
#: Most top-level keys a warning names.
_MAX_KEYS_SHOWN: Final = 8


def _no_roster_key_warning(keys: list[tuple[str, int]], file: str | None = None) -> str:
    """The warning for a file without a ``roster`` key, naming the keys it has, led by
    ``FILE:LINE: `` (the line of the key that looks like a misspelt ``roster``, else of
    the first key) when ``file`` is known, as the entries' warnings (:func:`entry_where`).

    ``keys`` is ``(key text, 1-based line)`` per top-level key, in file order.
    """
    if not keys:
        return _NO_ENTRIES
    names = list(dict.fromkeys(name for name, _ in keys))
    shown = ", ".join(rust_debug_str(name) for name in names[:_MAX_KEYS_SHOWN])
    if len(names) > _MAX_KEYS_SHOWN:
        shown += f" and {len(names) - _MAX_KEYS_SHOWN} more"
    hint = ""
    line = keys[0][1]
    close = difflib.get_close_matches("roster", names[:_MAX_KEYS_SHOWN], n=1, cutoff=0.6)
    if close:
        hint = f" ({rust_debug_str(close[0])} looks like a misspelt `roster`)"
        line = next(at for name, at in keys if name == close[0])
    at = "" if file is None else f"{file}:{line}: "
    return (
        f"{at}the file has no `roster:` key (top-level keys: {shown}, line {keys[0][1]}); "
        f"a roster is a mapping with a `roster:` list of entries, so nothing is imported{hint}"
    )


def entry_where(file: str | None, line: int | None, path: str, raw: RawEntry) -> str:
    """Where a warning about entry ``raw`` (at ``path``, e.g. ``roster[2]``) points:
    ``FILE:LINE: roster[2] (id "x", line N)``, with ``LINE`` the line of the key
    concerned and ``N`` the entry's; ``FILE:LINE: `` only when the file is known."""
    at = "" if file is None else f"{file}: " if line is None else f"{file}:{line}: "
    return f"{at}{path} (id {rust_debug_str(raw.id)}, line {raw.line})"


#: How close an unknown key must be to a known field for a "did you mean" (difflib's ratio).
_KEY_CUTOFF: Final = 0.75


def _read_entry(
    reader: DocumentReader, item: Item, path: str, warnings: list[str], file: str | None
) -> RawEntry:
    try:
        pairs = reader.read_struct(item, "an entry (a mapping with at least `id:`)")
    except ReadError as err:
        raise located(err, path) from None
    node = item.target if isinstance(item, Alias) else item
    values: dict[str, object] = {}
    merge_line: int | None = None
    unknown: list[tuple[str, int]] = []  # (key, line) of keys the reference ignores
    lines: dict[str, int] = {}
    for key, value in pairs:
        name = key_text(reader, key, path)
        if name not in _ENTRY_FIELDS:
            unknown.append((name, key_mark(key).line))
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
            raise LocatedError(
                f"`{name}` is given twice in this entry; expected each field once",
                field_path,
                key_mark(key),
            )
        lines[name] = key_mark(key).line
        try:
            if name == "ram_gb":
                values[name] = reader.read_value(value, _RAM_GB_DEPTH)
            elif name == "port":
                values[name] = reader.read_optional_u16(value)
            else:
                values[name] = reader.read_str(value)
        except ReadError as err:
            raise located(err, field_path) from None
    if "id" not in values:
        raise LocatedError(
            "the entry has no `id`; expected every entry to have one", path, node.mark
        )
    raw = RawEntry(
        id=str(values["id"]),
        role=str(values.get("role", "")),
        name=str(values.get("name", "")),
        repo=str(values.get("repo", "")),
        ram_gb=values.get("ram_gb"),
        backend=str(values.get("backend", "")),
        port=_int_or_none(values.get("port")),
        status=str(values.get("status", "")),
        line=node.mark.line,
        backend_line=lines.get("backend"),
    )
    if merge_line is not None:
        warnings.append(
            f"{path} (id {rust_debug_str(raw.id)}, line {merge_line}): the merge key `<<` is "
            "not applied (YAML 1.2 has no merge keys); the entry lacks the fields it would "
            "inherit"
        )
    missing = [name for name in _ENTRY_FIELDS if name not in values]
    for name, line in unknown:
        close = difflib.get_close_matches(name.lower(), missing, n=1, cutoff=_KEY_CUTOFF)
        if close:
            warnings.append(
                f"{entry_where(file, line, path, raw)}: unknown key {rust_debug_str(name)} is "
                f"ignored; did you mean `{close[0]}`?"
            )
    return raw


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None
