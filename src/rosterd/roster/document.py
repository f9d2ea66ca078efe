"""Reading a roster or overlay file into one YAML document (layer 2; reading is the only I/O).

The file is opened read-only and read up to its size limit; its bytes must be
UTF-8 and one YAML document (libyaml's syntax, :mod:`rosterd.roster._yaml_nodes`).
Every failure here, and every :class:`~rosterd.roster._serde_yaml.ReadError`
met while reading fields, becomes a :class:`~rosterd.errors.RosterError` naming
the file, the field path (``roster[3].port``), the line and column, what was
found and what was expected: rosterd's addition to the reference, whose
errors name no place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from rosterd.errors import RosterError
from rosterd.roster._serde_yaml import DocumentReader, ReadError
from rosterd.roster._yaml_nodes import Document, Item, Mark, YamlSyntaxError, load_single_document

#: Largest roster file read, in bytes (as roster.rs ``MAX_ROSTER_BYTES``).
MAX_ROSTER_BYTES: Final = 1_048_576
#: Largest overlay file read, in bytes (rosterd's own bound; overlays are small).
MAX_OVERLAY_BYTES: Final = MAX_ROSTER_BYTES


def read_file(path: Path, limit: int, what: str) -> bytes:
    """The file's bytes (at most ``limit + 1`` read, so an oversize file is seen), opened
    read-only; ``what`` (``roster``, ``overlay``) names the file in messages.

    Raises:
        RosterError: the file cannot be opened or read, naming it.
    """
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


def as_bytes(text: str | bytes, *, file: str | None, what: str, limit: int) -> bytes:
    """``text`` as UTF-8 bytes of at most ``limit`` bytes (the reference's checks first).

    Raises:
        RosterError: over ``limit`` bytes, a lone surrogate in ``text``, or bytes
            that are not UTF-8 (with the line and column of the first bad byte).
    """
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


def parse_document(data: bytes, *, file: str | None) -> Document:
    """The one YAML document in ``data`` (UTF-8 bytes), as a node graph.

    Raises:
        RosterError: not valid YAML or not exactly one document, with libyaml's
            problem, its line and column, and a hint when tabs indent the line.
    """
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


class LocatedError(Exception):
    """A ReadError with its field path, on its way to becoming a RosterError."""

    def __init__(self, message: str, path: str | None, mark: Mark | None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.mark = mark

    def to_error(self, file: str | None) -> RosterError:
        """The RosterError naming ``file``, the field path, line and column."""
        return RosterError(
            self.message,
            file=file,
            path=self.path,
            line=self.mark.line if self.mark else None,
            column=self.mark.column if self.mark else None,
        )


def located(err: ReadError, path: str | None) -> LocatedError:
    """``err`` at field path ``path`` (``None``: the whole file): "found X; expected Y (hint)"."""
    message = f"found {err.found}; expected {err.expected}"
    if err.hint:
        message += f" ({err.hint})"
    mark = err.item.mark if err.item is not None else None
    return LocatedError(message, path, mark)


def key_text(reader: DocumentReader, key: Item, path: str) -> str:
    """A mapping key's literal text, as serde reads a struct's field name.

    Raises:
        LocatedError: the key is a sequence or mapping (at ``path``).
    """
    try:
        return reader.read_str(key, "a field name (plain text)")
    except ReadError as err:
        raise located(err, path) from None


def key_mark(item: Item) -> Mark:
    """Where ``item`` was written (an alias: where the alias is)."""
    return item.mark
