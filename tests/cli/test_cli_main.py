"""The ``rosterd`` entry point: ``main(argv)`` returns one exit status per kind of failure;
an unexpected fault is one line and exit 1, its traceback only with ``-v``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import rosterd.roster.importer
from rosterd.cli import main


def _explode(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("boom")


@pytest.fixture
def broken_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """The roster import raises an exception rosterd does not expect (a bug)."""
    monkeypatch.delenv("ROSTERD_DEBUG", raising=False)
    main(["--help"])  # the command modules are loaded (and bind their names) first
    monkeypatch.setattr(rosterd.roster.importer, "load_roster", _explode)


@pytest.mark.usefixtures("broken_import")
def test_unexpected_fault_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("rosterd: internal error (RuntimeError: boom)")
    assert len(err.splitlines()) == 1
    assert "-v" in err


@pytest.mark.usefixtures("broken_import")
def test_unexpected_fault_with_json_is_a_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roster", "import", "x.yaml", "--json"]) == 1
    out = capsys.readouterr().out
    assert json.loads(out)["error"].startswith("internal error (RuntimeError: boom)")


@pytest.mark.usefixtures("broken_import")
def test_verbose_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-v", "plan", "x.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert "RuntimeError: boom" in err
    assert err.splitlines()[-1].startswith("rosterd: internal error (RuntimeError: boom)")


@pytest.mark.usefixtures("broken_import")
def test_debug_variable_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROSTERD_DEBUG", "1")
    assert main(["plan", "x.yaml"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_exit_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert main(["plan", str(tmp_path / "nope.yaml")]) == 2  # bad input
    assert main(["ps", "--no-such-option"]) == 2  # a usage error, as Click says it
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    assert main(["ps", "--url", f"http://127.0.0.1:{port}"]) == 3  # no running rosterd
    err = capsys.readouterr().err
    assert f"rosterd: {tmp_path / 'nope.yaml'}" in err
    assert f"no rosterd up answers at http://127.0.0.1:{port}" in err


def test_console_script_exits_with_mains_status(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rosterd.cli import main; raise SystemExit(main())",
            *("plan", str(tmp_path / "nope.yaml"), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "nope.yaml" in json.loads(proc.stdout)["error"]
