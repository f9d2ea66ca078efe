"""Every reference case through the real ``rosterd roster import --json`` command.

The cases (roster files byte-exact, with the reference's outputs in
``expected.jsonl``) live in ``tests/data/roster-cases``. For each case the
command must give the same ``specs`` and ``skipped`` lists, or reject the file
exactly when the reference does (the error wording is rosterd's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "roster-cases"
#: The team's upstream copy of the cases, beside the repository (optional).
UPSTREAM_CASES = ROOT.parent / "shared" / "roster-cases"


def _load_cases() -> list[dict[str, Any]]:
    lines = (CASES / "expected.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


CASE_LIST = _load_cases()


def _case_id(case: dict[str, Any]) -> str:
    name = str(case["case"])
    return name + (f"+{case['overlay']}" if case["overlay"] else "")


def _run(args: list[str]) -> tuple[int, str, str]:
    _register()
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_there_are_cases() -> None:
    assert len(CASE_LIST) >= 50


@pytest.mark.parametrize("case", CASE_LIST, ids=_case_id)
def test_case_matches_reference(case: dict[str, Any]) -> None:
    args = ["roster", "import", str(CASES / "cases" / case["case"]), "--json"]
    if case["overlay"]:
        args += ["--overlay", str(CASES / "cases" / case["overlay"])]
    code, out, err = _run(args)
    got = json.loads(out)
    expected = case["output"]
    if "error" in expected:
        assert code == 2, f"reference rejects {case['case']}, rosterd read it: {got}"
        assert set(got) == {"error"}
        assert isinstance(got["error"], str)
        assert got["error"]
        return
    assert code == 0, got
    assert got["specs"] == expected["specs"]
    assert got["skipped"] == expected["skipped"]
    assert isinstance(got["warnings"], list)
    assert "Traceback" not in out + err


def test_spec_json_has_exactly_the_reference_keys() -> None:
    code, out, _ = _run(
        ["roster", "import", str(CASES / "cases" / "realistic_queue.yaml"), "--json"]
    )
    assert code == 0
    got = json.loads(out)
    assert set(got) == {"specs", "skipped", "warnings"}
    for spec in got["specs"]:
        assert list(spec) == [
            "role",
            "flavor",
            "model",
            "port",
            "weights_bytes",
            "sticky",
            "latency_class",
            "excludes",
            "repo",
            "status",
        ]


def test_console_script_runs_a_case_in_a_real_process() -> None:
    """The installed entry point, as a user runs it: JSON on stdout, exit 0."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rosterd.cli import main; raise SystemExit(main())",
            *("roster", "import", str(CASES / "cases" / "basic_valid.yaml"), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = next(c for c in CASE_LIST if c["case"] == "basic_valid.yaml")["output"]
    got = json.loads(proc.stdout)
    assert got["specs"] == expected["specs"]


def test_repo_copy_matches_upstream_cases() -> None:
    """The repository's copy of the cases is byte-identical to the upstream set."""
    if not UPSTREAM_CASES.is_dir():
        pytest.skip(f"no upstream roster cases beside the repository ({UPSTREAM_CASES})")
    upstream = {p.name: p.read_bytes() for p in (UPSTREAM_CASES / "cases").iterdir()}
    ours = {p.name: p.read_bytes() for p in (CASES / "cases").iterdir()}
    assert ours == upstream
    assert (CASES / "expected.jsonl").read_bytes() == (
        UPSTREAM_CASES / "expected.jsonl"
    ).read_bytes()
