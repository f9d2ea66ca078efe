"""What ``rosterd up``, ``plan`` and ``roster import`` print when stdout is not a terminal
(a pipe, a file, nohup): whole names, one line per message, no trailing spaces, whatever
width the environment claims."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from test_up_support import llama_entry, rosterd_argv, write_roster

LONG_MODEL = "gemma-3-270m-it-a-rather-long-model-name-for-a-narrow-terminal-Q4_K_M"


def _lab(tmp_path: Path) -> list[str]:
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("chat-small-with-a-long-role-id", LONG_MODEL, 0.5, 8301),
            llama_entry("too-big", "huge", 500.0, 8302),
        ],
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(  # a remote node only: `up` prints the plan, then stops (exit 2)
        "nodes:\n"
        "  - {name: far-away-linux-box, memory_gb: 8, reserved_gb: 1, platform: linux-x86_64,"
        " flavors: [llamacpp], address: 192.0.2.1}\n"
    )
    return [str(roster), "--fleet", str(fleet)]


def _run(args: list[str], tmp_path: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [*rosterd_argv(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    return proc.returncode, proc.stdout


def _assert_readable(out: str) -> list[str]:
    lines = out.splitlines()
    assert [line for line in lines if line != line.rstrip()] == []
    assert any(LONG_MODEL in line for line in lines), out
    assert "…" not in out
    return lines


def test_up_piped_keeps_names_and_lines_whole(tmp_path: Path) -> None:
    code, out = _run(["up", *_lab(tmp_path), "--state-dir", str(tmp_path / "state")], tmp_path)
    assert code == 2, out
    lines = _assert_readable(out)
    assert any("chat-small-with-a-long-role-id" in line for line in lines)
    assert any(
        line.startswith("node far-away-linux-box at 192.0.2.1 is not this machine")
        and line.endswith("(remote nodes are not run yet)")
        for line in lines
    ), out
    (unplaced,) = [line for line in lines if line.strip().startswith("too-big:")]
    assert unplaced.endswith("reserved)")  # the whole reason on one line


def test_plan_and_roster_import_piped_keep_names_whole(tmp_path: Path) -> None:
    code, out = _run(["plan", *_lab(tmp_path)], tmp_path)
    assert code == 0, out
    _assert_readable(out)
    code, out = _run(["roster", "import", _lab(tmp_path)[0]], tmp_path)
    assert code == 0, out
    _assert_readable(out)
