"""Kept KV caches on this machine (DESIGN.md layer 6, beside the local backends): save a
role's slots while it is idle or when its backend stops, restore them when it starts again.

Every stop of a role's backend throws away what it computed for each slot, so the next
request pays the whole prefill again (gemma-3 270M here: a 3,710-token prompt took
9.6-22 s after a swap, 0.14 s once restored). A flavor whose server can save its slots
declares :class:`rosterd.adapters.base.SlotKeeping`; :class:`KvKeeper` does the rest:

- **where**: ``<state folder>/kv/<role>/``, the server's ``--slot-save-path``; per slot
  ``slot<N>-<stamp>.bin`` (written by the server) and ``slot<N>.json``, the record
  beside it: the file, its tokens and bytes, when it was saved and last used, and the
  identity that must match for a restore (the weights file's path, size and mtime, the
  adapter's :meth:`~rosterd.adapters.base.SlotKeeping.identity`, the backend's version).
- **atomic**: the server writes a new file under a new name; only once it answered is
  the record replaced (written to ``.tmp``, fsynced, renamed), and only then the older
  file removed. A crash or a ``kill -9`` at any point leaves the older save or none,
  and the next start says which (an unfinished file no record names is removed).
- **when**: while the role is idle (:meth:`KvKeeper.save_idle`: the node machine's
  ``SaveKv``, ``kv_idle_save_s`` after its last request, no lease granted meanwhile),
  so that its stop finds the slots saved and only stops the process; in the stop
  (:meth:`KvKeeper.stopping`) when no idle save came since the start, or a request was
  granted after it (:meth:`KvKeeper.changing`). One role's saves run one at a
  time (a stop waits for an idle save under way).
- **restore**: before the role's first request (the start returns after it), into the
  same slot ids; a record that does not match is refused with one line naming the
  difference, and removed with its file.
- **budget**: ``disk_budget_bytes`` over every role's files; the least recently used
  (saved or restored) go first.
- **in memory**: the records are :class:`~rosterd.backends.kv_record.KvRecord` values the
  keeper keeps; the files are read when it opens (:meth:`KvKeeper.load`), before a
  restore and before a prune, so what ``/status`` shows (:meth:`KvKeeper.kept`) reads no
  disk and removes nothing.

The server runs on this machine (its files are local), so a node agent runs its own
keeper on its node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx

from rosterd.adapters import Launch, SlotKeeping
from rosterd.backends.kv_record import (
    RECORD_VERSION,
    KvRecord,
    read_records,
    record_path,
    remove,
    write_record,
)
from rosterd.backends.values import RestoreOutcome
from rosterd.errors import AdapterError
from rosterd.supervisor.backend_http import backend_client
from rosterd.tokens import GB

log = logging.getLogger("rosterd.kv")

#: The disk kept KV files may take, over every role, unless ``--kv-disk-gb`` says otherwise.
DEFAULT_KV_DISK_BYTES: Final[int] = 10 * GB

#: How long one slot's save or restore may take, seconds (an 8B model at 32K tokens
#: writes about 4 GiB; the server's own time for 18 MiB here was 5 ms).
SLOT_CALL_TIMEOUT_S: Final[float] = 300.0


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """The last restore of a role: ``outcome`` is ``restored`` (some slots came back),
    ``none`` (nothing was kept), ``refused`` (a record did not match; removed) or
    ``failed`` (the server refused the file); ``tokens`` restored in all; ``detail``
    the line that was logged; ``took_s`` the backend's time (seconds)."""

    outcome: RestoreOutcome
    tokens: int = 0
    detail: str = ""
    took_s: float = 0.0


@dataclass(slots=True)
class KeptTotals:
    """What the keeper did for one role since it started, for metrics: counts and bytes."""

    saves: int = 0
    restores: int = 0
    refusals: int = 0
    failures: int = 0
    saved_bytes: int = 0
    restored_bytes: int = 0
    pruned_bytes: int = 0


@dataclass(frozen=True, slots=True)
class KeptRole:
    """What is kept of one role now: ``tokens`` over its slots, ``file_bytes`` on disk."""

    tokens: int
    file_bytes: int


@dataclass(slots=True)
class _Running:
    keeping: SlotKeeping
    base_url: str
    identity: dict[str, str]
    slots: int


@dataclass
class KvKeeper:
    """Saves and restores the slots of the roles of one machine under ``root``
    (``<state folder>/kv``) within ``disk_budget_bytes`` (see the module)."""

    root: Path
    disk_budget_bytes: int = DEFAULT_KV_DISK_BYTES
    last_restore: dict[str, RestoreResult] = field(default_factory=dict)
    totals: dict[str, KeptTotals] = field(default_factory=dict)
    _running: dict[str, _Running] = field(default_factory=dict)
    #: Role -> slot -> its record: what is kept now, as the files said when last read.
    _kept: dict[str, dict[int, KvRecord]] = field(default_factory=dict)
    #: Roles saved while idle with no request granted since: their stop saves nothing.
    _saved: set[str] = field(default_factory=set)
    #: Role -> the lock its saves take: an idle save and a stop never write at once.
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    #: Roles whose backend did not report its version (no ``/props``: said once, at debug).
    _unversioned: set[str] = field(default_factory=set)

    def _totals(self, role: str) -> KeptTotals:
        return self.totals.setdefault(role, KeptTotals())

    def folder(self, role: str) -> Path:
        """``root/role``, made if missing (``role`` is a plain token: the spec checked it).

        Raises:
            OSError: the folder cannot be made.
        """
        path = self.root / role
        path.mkdir(parents=True, exist_ok=True)
        return path

    def load(self) -> None:
        """Read every role's records under ``root`` into memory (see the module), removing
        those that do not read; blocking file I/O (``rosterd up`` runs it in a thread)."""
        on_disk = {p.name for p in self.root.glob("*") if p.is_dir()}  # none: no folder
        for role in sorted({*self._kept, *on_disk}):
            self._read(role)

    def _read(self, role: str) -> dict[int, KvRecord]:
        """``role``'s records read from its folder into memory; the dict kept (updated in
        place: a restore under way holds it while another role's prune reads the files)."""
        records = self._kept.setdefault(role, {})
        fresh = read_records(self.root / role, role)
        records.clear()
        records.update(fresh)
        return records

    def kept(self, role: str) -> KeptRole:
        """The tokens and bytes kept for ``role`` now (zero when nothing is), from the
        records in memory: no disk I/O."""
        records = self._kept.get(role, {}).values()
        return KeptRole(sum(r.tokens for r in records), sum(r.file_bytes for r in records))

    async def started(
        self,
        role: str,
        keeping: SlotKeeping,
        launch: Launch,
        base_url: str,
        weights: Path,
    ) -> RestoreResult:
        """The role's backend is up (at ``base_url``, launched by ``launch``, serving the
        file ``weights``): restore what was kept into the same slot ids, before it serves.
        Never raises: a failure is logged, its files removed, and the result says so."""
        slots = int(keeping.identity(launch).get("slots", "1") or 1)
        async with backend_client(base_url=base_url) as client:
            try:
                version = await keeping.version(client, timeout_s=30.0)
            except AdapterError as exc:
                # A backend without a version (no /props: a stand-in, an older build) has
                # nothing a restore could be checked against, on every load: no warning,
                # one debug line per role.
                result = RestoreResult("failed", detail=f"role {role}: no restore: {exc}")
                if role not in self._unversioned:
                    self._unversioned.add(role)
                    log.debug("%s", result.detail)
                self.last_restore[role] = result
                return result
            identity = {
                "weights": _weights_identity(weights),
                **keeping.identity(launch),
                "backend_version": version,
            }
            result = await self._restore(role, keeping, client, identity, slots)
        # Only now: a stop during the restore (a shutdown) saves nothing half-restored,
        # and the files it restores from stay for the next start.
        self._running[role] = _Running(keeping, base_url, identity, slots)
        # A new run: its stop saves, unless an idle save comes first. Backends whose grants
        # never reach this keeper (a node agent's, over Ray) get no idle save either, so
        # their stops always save.
        self._saved.discard(role)
        self.last_restore[role] = result
        return result

    def changing(self, role: str) -> None:
        """A request was granted on ``role``: its slots change, so its next idle save or
        its stop saves them."""
        self._saved.discard(role)

    async def save_idle(self, role: str) -> None:
        """Save every slot of the idle ``role`` that holds tokens, now (the node machine
        grants it no lease meanwhile), so that its stop has nothing left to save. A
        no-op for a role not started through :meth:`started` or saved already. Never
        raises: a failed slot is logged, and the stop tries again."""
        async with self._lock(role):
            running = self._running.get(role)
            if running is None or role in self._saved:
                return
            if await self._save_slots(role, running):
                self._saved.add(role)
            self.prune()

    async def stopping(self, role: str) -> None:
        """The role's backend is about to stop: save every slot that holds tokens, unless
        they were saved while it was idle and served nothing since (then nothing is
        written: the stop only stops). Waits for an idle save under way. A no-op for a
        role not started through :meth:`started`. Never raises."""
        async with self._lock(role):
            running = self._running.pop(role, None)
            if running is None:
                return
            if role in self._saved:
                self._saved.discard(role)
                log.debug("role %s: KV saved while idle; nothing to save at the stop", role)
                return
            await self._save_slots(role, running)
            self.prune()

    def _lock(self, role: str) -> asyncio.Lock:
        return self._locks.setdefault(role, asyncio.Lock())

    async def _save_slots(self, role: str, running: _Running) -> bool:
        """Save each of ``running``'s slots; whether every one was saved (or empty)."""
        folder = self.folder(role)
        saved = True
        async with backend_client(base_url=running.base_url) as client:
            for slot in range(running.slots):
                saved = await self._save_slot(role, folder, slot, running, client) and saved
        return saved

    def forget(self, role: str) -> None:
        """The role's backend is gone without a stop we asked for (a crash, a restart):
        there is nothing left to save."""
        self._running.pop(role, None)
        self._saved.discard(role)

    def prune(self) -> list[str]:
        """Remove the least recently used saves until every role's files fit
        ``disk_budget_bytes``; the files removed (``role/file``)."""
        self.load()  # the files as they are: the budget counts what is on disk
        entries = sorted(
            (record.used_at, role, record.file_bytes, slot, record.file)
            for role, records in self._kept.items()
            for slot, record in records.items()
        )
        total = sum(e[2] for e in entries)
        removed: list[str] = []
        for _used, role, size, slot, name in entries:
            if total <= self.disk_budget_bytes:
                break
            folder = self.root / role
            file_path = folder / name
            remove(record_path(folder, slot))
            remove(file_path)
            self._kept[role].pop(slot, None)
            self._saved.discard(role)  # running, its stop saves what it holds again
            total -= size
            self._totals(role).pruned_bytes += size
            removed.append(f"{role}/{file_path.name}")
            log.info(
                "role %s: kept KV %s removed (%s): the kept files pass --kv-disk-gb %.1f",
                role,
                file_path.name,
                _mib(size),
                self.disk_budget_bytes / GB,
            )
        return removed

    # ---- one slot ------------------------------------------------------------------

    async def _save_slot(
        self, role: str, folder: Path, slot: int, running: _Running, client: httpx.AsyncClient
    ) -> bool:
        """Save ``slot`` under a new name, then its record, then remove the older file;
        whether it was saved (or held nothing)."""
        name = f"slot{slot}-{time.time_ns():x}.bin"
        try:
            saved = await running.keeping.save(client, slot, name, timeout_s=SLOT_CALL_TIMEOUT_S)
        except AdapterError as exc:
            self._totals(role).failures += 1
            remove(folder / name)
            log.warning("role %s: KV of slot %d not saved: %s", role, slot, exc)
            return False
        if saved.tokens == 0:
            remove(folder / name)  # an empty slot: the older save, if any, stays
            return True
        path = folder / name
        _fsync(path)
        kept = self._kept.setdefault(role, {})
        old = kept.get(slot)
        now = time.time()
        record = KvRecord(
            slot=slot,
            file=name,
            tokens=saved.tokens,
            file_bytes=saved.file_bytes or path.stat().st_size,
            saved_at=now,
            used_at=now,
            identity=running.identity,
            version=RECORD_VERSION,
        )
        write_record(folder, record)
        kept[slot] = record
        if old is not None and old.file != name:
            remove(folder / old.file)
        self._totals(role).saves += 1
        self._totals(role).saved_bytes += saved.file_bytes
        log.info(
            "role %s: KV of slot %d saved (%d tokens, %s) in %.0f ms",
            role,
            slot,
            saved.tokens,
            _mib(saved.file_bytes),
            saved.took_s * 1000,
        )
        return True

    async def _restore(
        self,
        role: str,
        keeping: SlotKeeping,
        client: httpx.AsyncClient,
        identity: dict[str, str],
        slots: int,
    ) -> RestoreResult:
        folder = self.folder(role)
        records = self._read(role)  # the files, as they are now
        notes = self._remove_unfinished(role, folder, records)
        lines: list[str] = []
        tokens = 0
        took = 0.0
        outcome: RestoreOutcome = "none"
        for slot, record in sorted(records.items()):
            file_path = folder / record.file
            refusal = _refusal(record, identity, slot, slots, file_path)
            if refusal is not None:
                remove(record_path(folder, slot))
                remove(file_path)
                records.pop(slot, None)
                self._totals(role).refusals += 1
                line = f"role {role}: kept KV of slot {slot} refused: {refusal}; removed"
                log.warning("%s", line)
                lines.append(line)
                outcome = "refused" if outcome == "none" else outcome
                continue
            try:
                back = await keeping.restore(
                    client, slot, file_path.name, timeout_s=SLOT_CALL_TIMEOUT_S
                )
            except AdapterError as exc:
                remove(record_path(folder, slot))
                remove(file_path)
                records.pop(slot, None)
                self._totals(role).failures += 1
                line = f"role {role}: kept KV of slot {slot} not restored: {exc}; removed"
                log.warning("%s", line)
                lines.append(line)
                outcome = "failed" if outcome != "restored" else outcome
                continue
            records[slot] = record.used(time.time())
            write_record(folder, records[slot])
            self._totals(role).restores += 1
            self._totals(role).restored_bytes += back.file_bytes
            tokens += back.tokens
            took += back.took_s
            outcome = "restored"
            line = (
                f"role {role}: KV of slot {slot} restored from the save of "
                f"{_when(record.saved_at)} ({back.tokens} tokens, "
                f"{_mib(back.file_bytes)}) in {back.took_s * 1000:.0f} ms"
            )
            log.info("%s", line)
            lines.append(line)
        if not lines:
            line = f"role {role}: no kept KV to restore"
            log.info("%s", line)
            lines.append(line)
        return RestoreResult(outcome, tokens, "; ".join([*notes, *lines]), took)

    @staticmethod
    def _remove_unfinished(role: str, folder: Path, records: dict[int, KvRecord]) -> list[str]:
        """Remove the files a save cut short left in ``folder`` (a ``.tmp`` record, a file
        none of ``records`` names); one line for each, saying which save remains."""
        named = {r.file for r in records.values()}
        notes: list[str] = []
        for path in sorted(folder.glob("*.tmp")):
            remove(path)
        for path in sorted(folder.glob("slot*.bin")):
            if path.name in named:
                continue
            remove(path)
            slot = path.name.removeprefix("slot").split("-", 1)[0]
            kept = records.get(int(slot)) if slot.isdigit() else None
            remains = (
                f"the older save of {_when(kept.saved_at)} remains"
                if kept is not None
                else "no older save remains"
            )
            line = f"role {role}: an unfinished KV save ({path.name}) was removed; {remains}"
            log.warning("%s", line)
            notes.append(line)
        return notes


def _refusal(
    record: KvRecord, identity: dict[str, str], slot: int, slots: int, file_path: Path
) -> str | None:
    """Why ``record`` cannot be restored into slot ``slot`` of a run of ``identity``
    (``None``: it can)."""
    if record.version != RECORD_VERSION:
        return f"its record's format is {record.version!r}, not {RECORD_VERSION}"
    if slot >= slots:
        return f"the role has {slots} slot(s) now"
    saved = record.identity
    different = [
        f"{key} was {saved.get(key)!r}, is now {value!r}"
        for key, value in identity.items()
        if saved.get(key) != value
    ]
    if different:
        return ", ".join(different)
    try:
        size = file_path.stat().st_size
    except OSError:
        return f"its file {file_path.name} is missing"
    if size != record.file_bytes:
        said = record.file_bytes
        return f"its file {file_path.name} has {size} bytes, its record says {said}"
    return None


def _weights_identity(path: Path) -> str:
    """The weights file as a restore must find it again: path, size and mtime."""
    try:
        stat = path.stat()
    except OSError:
        return f"{path} (unreadable)"
    return f"{path} ({stat.st_size} bytes, mtime {stat.st_mtime_ns})"


def _fsync(path: Path) -> None:
    with contextlib.suppress(OSError), path.open("rb") as f:
        os.fsync(f.fileno())


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _when(at: object) -> str:
    if not isinstance(at, int | float):
        return "an unknown time"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
