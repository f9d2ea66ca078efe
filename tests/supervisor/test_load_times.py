"""The load times the run records keep across runs (``rosterd.supervisor.run_records``), which
a load's expected total reads (``rosterd.router.load_progress.expected_load_s``)."""

from __future__ import annotations

import json
from pathlib import Path

from rosterd.router.load_progress import expected_load_s
from rosterd.supervisor.run_records import (
    KEPT_LOADS,
    load_times_path,
    past_loads_s,
    reap_leftovers,
    record_load,
)


def test_a_load_recorded_by_one_run_is_what_the_next_run_expects(tmp_path: Path) -> None:
    run_dir = tmp_path / "state" / "run"
    # The first run: three loads of chat, one of embed.
    for load_s in (12.0, 10.0, 11.0):
        record_load(run_dir, "chat", load_s)
    record_load(run_dir, "embed", 2.0)
    # The next run reads the folder afresh: nothing of the first run is in memory.
    past = past_loads_s(run_dir, "chat")
    assert past == (12.0, 10.0, 11.0)
    assert expected_load_s("chat", [], None, past) == 11.0
    assert past_loads_s(run_dir, "embed") == (2.0,)
    assert past_loads_s(run_dir, "never-loaded") == ()


def test_only_the_last_loads_are_kept(tmp_path: Path) -> None:
    for load_s in range(KEPT_LOADS + 3):
        record_load(tmp_path, "chat", float(load_s))
    assert past_loads_s(tmp_path, "chat") == tuple(float(s) for s in range(3, KEPT_LOADS + 3))


def test_a_folder_of_an_older_run_or_a_damaged_file_has_no_past_loads(tmp_path: Path) -> None:
    # An older rosterd's run folder: a backend's record, no load times.
    (tmp_path / "chat.json").write_text(json.dumps({"name": "chat", "pid": 1, "cmdline": []}))
    assert past_loads_s(tmp_path, "chat") == ()
    path = load_times_path(tmp_path, "chat")
    path.parent.mkdir()
    for damaged in ("{not json", "[1, 2]", '{"loads_s": "fast"}'):
        path.write_text(damaged)
        assert past_loads_s(tmp_path, "chat") == ()
    path.write_text('{"loads_s": [3.5, "x", -1, true, 4]}')
    assert past_loads_s(tmp_path, "chat") == (3.5, 4.0)
    record_load(tmp_path, "chat", 5.0)  # a damaged file is added to, not refused
    assert past_loads_s(tmp_path, "chat") == (3.5, 4.0, 5.0)


async def test_the_reaper_leaves_the_load_times_alone(tmp_path: Path) -> None:
    record_load(tmp_path, "chat", 9.0)
    assert await reap_leftovers(tmp_path, keep=(), grace_s=0.1) == []
    assert past_loads_s(tmp_path, "chat") == (9.0,)
