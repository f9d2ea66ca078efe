"""The kept KV records live in the keeper's memory (issue 28): what ``/status`` shows of
them (``KvKeeper.kept``) reads no file and removes none; the files are read when the
keeper opens (``load``), before a restore and before a prune.

No server: the records are written as a save leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path

from rosterd.backends.kv_keep import KvKeeper
from rosterd.backends.kv_record import KvRecord, read_records


def saved(kv: KvKeeper, role: str, *, tokens: int, size: int, used_at: float) -> Path:
    """One slot saved for ``role`` as a save leaves it: its file and its record."""
    folder = kv.folder(role)
    (folder / "slot0-1.bin").write_bytes(b"x" * size)
    record = {"version": 1, "slot": 0, "file": "slot0-1.bin", "tokens": tokens,
              "file_bytes": size, "saved_at": used_at, "used_at": used_at,
              "identity": {"ctx": "512"}}  # fmt: skip
    (folder / "slot0.json").write_text(json.dumps(record))
    return folder


def test_status_reads_the_records_in_memory_and_removes_nothing(tmp_path: Path) -> None:
    kv = KvKeeper(tmp_path / "kv")
    folder = saved(kv, "chat", tokens=52, size=1000, used_at=100.0)
    kv.load()
    assert (kv.kept("chat").tokens, kv.kept("chat").file_bytes) == (52, 1000)

    # The record goes bad on disk: a status read neither sees it nor removes it.
    (folder / "slot0.json").write_text("{not json")
    assert (kv.kept("chat").tokens, kv.kept("chat").file_bytes) == (52, 1000)
    assert (folder / "slot0.json").read_text() == "{not json"
    assert kv.kept("never-saved").tokens == 0

    # The next read of the files (here the prune after a save) removes it, and says so.
    assert kv.prune() == []
    assert not (folder / "slot0.json").exists()
    assert kv.kept("chat").tokens == 0


def test_a_record_reads_back_as_the_value_it_was_written_from(tmp_path: Path) -> None:
    kv = KvKeeper(tmp_path / "kv")
    folder = saved(kv, "chat", tokens=52, size=1000, used_at=100.0)
    assert read_records(folder, "chat") == {
        0: KvRecord(
            slot=0,
            file="slot0-1.bin",
            tokens=52,
            file_bytes=1000,
            saved_at=100.0,
            used_at=100.0,
            identity={"ctx": "512"},
            version=1,
        )
    }
    record = read_records(folder, "chat")[0]
    assert KvRecord.from_json(0, record.as_json()) == record
