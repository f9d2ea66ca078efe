"""A kept KV slot's record (DESIGN.md layer 6, beside the KV keeper): the typed value
:class:`~rosterd.backends.kv_keep.KvKeeper` keeps in memory for each saved slot, and its
file, ``<state folder>/kv/<role>/slot<N>.json``.

The keeper reads the files when it opens (``rosterd up`` does it in a thread), before a
restore and before it prunes; it writes one after each save and restore. Everything
else, ``/status`` among it, reads the values in memory: no disk I/O, nothing removed.
A file that does not read as a JSON object is removed where it is read (no save is
better than a wrong one), with one line in the log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

log = logging.getLogger("rosterd.kv")

#: The format of the records this rosterd writes; another is refused at a restore.
RECORD_VERSION: Final[int] = 1


@dataclass(frozen=True, slots=True)
class KvRecord:
    """One saved slot: ``file`` (its name in the role's folder, written by the server),
    ``tokens`` and ``file_bytes`` it holds, when it was saved and last used (saved or
    restored; seconds since the epoch; ``saved_at`` ``None`` when the file did not say),
    the ``identity`` a restore must match (weights, launch settings, backend version) and
    the record's format ``version`` (``None`` when the file had none that is a number)."""

    slot: int
    file: str
    tokens: int
    file_bytes: int
    saved_at: float | None
    used_at: float
    identity: Mapping[str, object] = field(default_factory=dict)
    version: int | None = RECORD_VERSION

    def used(self, at: float) -> KvRecord:
        """This record, last used at ``at`` (seconds since the epoch)."""
        return replace(self, used_at=at)

    def as_json(self) -> dict[str, object]:
        """The record as its file holds it."""
        return {
            "version": self.version,
            "slot": self.slot,
            "file": self.file,
            "tokens": self.tokens,
            "file_bytes": self.file_bytes,
            "saved_at": self.saved_at,
            "used_at": self.used_at,
            "identity": dict(self.identity),
        }

    @classmethod
    def from_json(cls, slot: int, data: Mapping[str, object]) -> KvRecord:
        """The record of slot ``slot`` from its file's object; a field missing or of
        another type reads as zero, ``None`` or empty (a restore then refuses it)."""
        identity = data.get("identity")
        version = data.get("version")
        return cls(
            slot=slot,
            file=str(data.get("file")),
            tokens=_int(data.get("tokens")),
            file_bytes=_int(data.get("file_bytes")),
            saved_at=_seconds(data.get("saved_at")),
            used_at=_seconds(data.get("used_at")) or 0.0,
            identity={str(k): v for k, v in identity.items()} if isinstance(identity, dict) else {},
            version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        )


def record_path(folder: Path, slot: int) -> Path:
    """Where the record of slot ``slot`` is in a role's ``folder``."""
    return folder / f"slot{slot}.json"


def read_records(folder: Path, role: str) -> dict[int, KvRecord]:
    """Slot -> its record, for the records in ``role``'s ``folder`` (empty when there is
    none); a file that does not read as a JSON object is removed and logged."""
    out: dict[int, KvRecord] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("slot*.json")):
        slot = path.stem.removeprefix("slot")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if not slot.isdigit() or not isinstance(data, dict):
            log.warning("role %s: kept KV record %s unreadable; removed", role, path.name)
            remove(path)
            continue
        out[int(slot)] = KvRecord.from_json(int(slot), data)
    return out


def write_record(folder: Path, record: KvRecord) -> None:
    """``record`` as JSON in ``folder``: written to a ``.tmp`` file, fsynced, renamed over
    the record of its slot, the folder fsynced (a crash leaves the old record or the new)."""
    path = record_path(folder, record.slot)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        json.dump(record.as_json(), out, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove(path: Path) -> None:
    """Remove the file at ``path`` if it is there."""
    with contextlib.suppress(OSError):
        path.unlink()


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
