"""The ``rosterd`` entry point: an unexpected fault is one line and exit 1, never a traceback."""

from __future__ import annotations

import pytest

import rosterd.cli
from rosterd.cli import main


def _explode(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("boom")


def test_unexpected_fault_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ROSTERD_DEBUG", raising=False)
    rosterd.cli._register()  # the command modules bind the real app first
    monkeypatch.setattr(rosterd.cli, "app", _explode)
    monkeypatch.setattr("sys.argv", ["rosterd", "plan", "x.yaml"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("rosterd: internal error (RuntimeError: boom)")
    assert "ROSTERD_DEBUG=1" in err


def test_debug_variable_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROSTERD_DEBUG", "1")
    rosterd.cli._register()  # the command modules bind the real app first
    monkeypatch.setattr(rosterd.cli, "app", _explode)
    with pytest.raises(RuntimeError, match="boom"):
        main()
