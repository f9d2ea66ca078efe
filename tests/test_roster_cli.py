"""``rosterd roster import`` as a user runs it: tables, JSON, exit codes, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "roster.yaml"
EXAMPLE_OVERLAY = ROOT / "examples" / "overlay.yaml"


def run(*args: str) -> tuple[int, str, str]:
    _register()
    result = CliRunner().invoke(app, ["roster", "import", *args])
    return result.exit_code, result.stdout, result.stderr


def test_tables_show_specs_skips_and_warnings() -> None:
    code, out, _ = run(str(EXAMPLE), "--overlay", str(EXAMPLE_OVERLAY))
    assert code == 0
    assert "Imported specs (15)" in out
    assert "Skipped entries (7)" in out
    for column in ("role", "flavor", "model", "port", "GiB", "latency", "sticky", "excludes"):
        assert column in out
    assert "chat-small" in out
    assert "alias of chat-small (same server, port and weights)" in out
    assert 'backend "mlx-audio" has no inference adapter' in out
    assert "warning: roster[21]" in out


def test_example_roster_has_the_llamacpp_roles_the_team_runs() -> None:
    code, out, _ = run(str(EXAMPLE), "--overlay", str(EXAMPLE_OVERLAY), "--json")
    assert code == 0
    specs = {s["role"]: s for s in json.loads(out)["specs"]}
    small = specs["chat-small"]
    assert (small["flavor"], small["model"], small["port"]) == ("llamacpp", "gemma-3-270m", 8301)
    assert (small["latency_class"], small["sticky"]) == ("batch", True)
    assert specs["voice-lite"]["latency_class"] == "interactive"
    assert specs["scratch-a"]["excludes"] == ["scratch-b"]
    assert specs["scratch-b"]["excludes"] == ["role:scratch-a"]
    assert specs["scratch-a"]["sticky"] is specs["scratch-b"]["sticky"] is False
    assert len(json.loads(out)["specs"]) + len(json.loads(out)["skipped"]) >= 20


def test_roster_text_is_never_rich_markup(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        'roster:\n  - id: m\n    backend: ollama\n    ram_gb: 1\n    status: "[red]x[/red]\\e"\n',
        encoding="utf-8",
    )
    code, out, _ = run(str(path))
    assert code == 0
    assert "[red]x[/red]" in out
    assert "\x1b" not in out.replace("\x1b[", "")  # the raw escape is shown escaped
    assert "\\u{1b}" in out


@pytest.mark.parametrize("as_json", [False, True])
def test_rejected_roster_exits_2_with_a_located_message(tmp_path: Path, as_json: bool) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("roster:\n  - id: m\n    port: '8080'\n", encoding="utf-8")
    code, out, err = run(str(path), *(["--json"] if as_json else []))
    assert code == 2
    expected = f"{path}:3:11: roster[0].port: found the quoted text '8080'"
    if as_json:
        message = json.loads(out)["error"]
        assert message.startswith(expected)
        assert err == ""
    else:
        assert out == ""
        assert err.startswith(f"rosterd: {expected}")
        assert "write the port without quotes" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: (tmp / "absent.yaml", None),
        lambda tmp: (tmp, None),
        lambda tmp: (EXAMPLE, tmp / "absent-overlay.yaml"),
    ],
)
def test_unreadable_files_get_a_clear_message(tmp_path: Path, make: object) -> None:
    roster, overlay = make(tmp_path)  # type: ignore[operator]
    args = [str(roster), *(["--overlay", str(overlay)] if overlay else [])]
    code, out, err = run(*args)
    assert code == 2
    assert "Traceback" not in out + err
    assert err.startswith("rosterd: ")
    assert str(overlay or roster) in err
    code, out, _ = run(*args, "--json")
    assert code == 2
    assert set(json.loads(out)) == {"error"}


def test_bad_overlay_names_the_overlay(tmp_path: Path) -> None:
    overlay = tmp_path / "o.yaml"
    overlay.write_text("sticky:\n  chat-small: no\n", encoding="utf-8")
    code, _, err = run(str(EXAMPLE), "--overlay", str(overlay))
    assert code == 2
    assert err.startswith(f"rosterd: {overlay}:2:15: sticky.chat-small: found `no`")


def test_invalid_utf8_roster_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"roster: []\n# \xff\n")
    code, _, err = run(str(path))
    assert code == 2
    assert f"{path}:2:3:" in err
    assert "UTF-8" in err
