"""``rosterd roster import`` as a user runs it: tables, JSON, exit codes, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app

ROOT = Path(__file__).resolve().parents[2]
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


def test_table_marks_an_unmeasured_ram_gb_and_json_keeps_the_number() -> None:
    """A ``"~N"`` ram_gb is the operator's guess: the table says so, ``--json`` (the
    reference's shape) keeps the plain number."""
    code, out, _ = run(str(EXAMPLE), "--overlay", str(EXAMPLE_OVERLAY))
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "~0.50 (unmeasured)" in rows["chat-small"]  # ram_gb: "~0.5"
    assert "~205.00 (unmeasured)" in rows["coder-large"]  # ram_gb: "~205"
    assert "unmeasured" not in rows["planner"]  # ram_gb: 17
    assert " 17.00 " in rows["planner"]
    code, out, _ = run(str(EXAMPLE), "--overlay", str(EXAMPLE_OVERLAY), "--json")
    assert code == 0
    assert "unmeasured" not in out
    assert "~" not in out
    specs = {s["role"]: s for s in json.loads(out)["specs"]}
    assert specs["chat-small"]["weights_bytes"] == 2**29


def test_example_roster_has_the_llamacpp_roles_the_team_runs() -> None:
    code, out, _ = run(str(EXAMPLE), "--overlay", str(EXAMPLE_OVERLAY), "--json")
    assert code == 0
    specs = {s["role"]: s for s in json.loads(out)["specs"]}
    small = specs["chat-small"]
    assert (small["flavor"], small["model"], small["port"]) == (
        "llamacpp",
        "SmolLM2-135M-Instruct",
        8301,
    )
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


def test_overlay_typos_reach_json_warnings_and_the_tables(tmp_path: Path) -> None:
    overlay = tmp_path / "o.yaml"
    overlay.write_text(
        "sticky:\n  chat-smal: false\n  translator: false\n  translator: true\n"
        "excludes:\n  scratch-a: [scratch-c]\n",
        encoding="utf-8",
    )
    code, out, _ = run(str(EXAMPLE), "--overlay", str(overlay), "--json")
    assert code == 0
    warnings = json.loads(out)["warnings"]
    assert warnings[1:] == [
        'overlay sticky.translator (lines 3 and 4): "translator" is given twice in `sticky`; '
        "the last (line 4) is used",
        'overlay sticky.chat-smal (line 2): no roster entry has the id "chat-smal"; '
        'this setting applies to nothing (did you mean "chat-small"?)',
        'overlay excludes.scratch-a (line 6): "scratch-c" names no roster entry; '
        'this exclusion applies to nothing (did you mean "scratch-b"?)',
    ]
    code, out, _ = run(str(EXAMPLE), "--overlay", str(overlay))
    assert code == 0
    flat = " ".join(out.split())
    assert "warning: overlay sticky.chat-smal (line 2)" in flat
    assert "warning: overlay sticky.translator (lines 3 and 4)" in flat
    assert "warning: overlay excludes.scratch-a (line 6)" in flat


def test_misspelt_roster_key_warns_in_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("rooster:\n  - id: m\n    backend: ollama\n    ram_gb: 1\n", encoding="utf-8")
    code, out, _ = run(str(path))
    assert code == 0
    assert "Imported specs (0)" in out
    assert f"warning: {path}:1: the file has no `roster:` key" in "".join(out.split("\n"))


# --- the import's warnings in `rosterd plan` and `rosterd up` ----------------------------


def _typo_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    roster = tmp_path / "roster.yaml"
    roster.write_text(
        "roster:\n  - {id: chat, backend: llama-server, ram_gb: 0.1, port: 18301}\n",
        encoding="utf-8",
    )
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("sticky:\n  chta: false\n", encoding="utf-8")
    fleet = tmp_path / "fleet.yaml"  # a node that is not this machine: up stops after the plan
    fleet.write_text(
        "nodes:\n  - {name: far, memory_gb: 4, platform: linux-x86_64, address: 192.0.2.1}\n",
        encoding="utf-8",
    )
    return roster, overlay, fleet


TYPO_WARNING = (
    'warning: overlay sticky.chta (line 2): no roster entry has the id "chta"; '
    'this setting applies to nothing (did you mean "chat"?)'
)


def test_plan_prints_the_import_warnings(tmp_path: Path) -> None:
    roster, overlay, fleet = _typo_files(tmp_path)
    _register()
    result = CliRunner().invoke(
        app, ["plan", str(roster), "--overlay", str(overlay), "--fleet", str(fleet)]
    )
    assert result.exit_code == 0
    assert TYPO_WARNING in result.stderr


def test_up_prints_the_import_warnings(tmp_path: Path) -> None:
    roster, overlay, fleet = _typo_files(tmp_path)
    _register()
    result = CliRunner().invoke(
        app,
        [
            "up",
            str(roster),
            "--overlay",
            str(overlay),
            "--fleet",
            str(fleet),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        env={"ROSTERD_API_KEY": None},
    )
    assert result.exit_code == 2  # no node of this fleet is this machine
    assert TYPO_WARNING in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


def test_roster_typos_get_a_did_you_mean_in_import_and_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the temporary path must not fold mid-word
    roster = tmp_path / "roster.yaml"
    roster.write_text(
        "roster:\n"
        "  - {id: chat, backend: lama.cpp, ram_gb: 0.1, port: 18301}\n"
        "  - id: big\n    backend: llama.cpp\n    ramgb: 4\n    port: 18302\n",
        encoding="utf-8",
    )
    key_hint = (
        f'warning: {roster}:5: roster[1] (id "big", line 3): unknown key "ramgb" is ignored; '
        "did you mean `ram_gb`?"
    )
    backend_hint = (
        f'warning: {roster}:2: roster[0] (id "chat", line 2): backend "lama.cpp" names no '
        "inference adapter, so the entry is skipped; did you mean `llama.cpp`?"
    )
    code, out, _ = run(str(roster))
    assert code == 0
    flat = " ".join(out.split())
    assert key_hint in flat
    assert backend_hint in flat
    code, out, _ = run(str(roster), "--json")
    assert code == 0
    doc = json.loads(out)
    assert [role for role, _ in doc["skipped"]] == ["chat", "big"]  # skipped as the reference
    assert [f"warning: {w}" for w in doc["warnings"]] == [key_hint, backend_hint]
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n  - {name: far, memory_gb: 4, platform: linux-x86_64, address: 192.0.2.1}\n",
        encoding="utf-8",
    )
    _register()
    result = CliRunner().invoke(app, ["plan", str(roster), "--fleet", str(fleet)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stderr.split())
    assert key_hint in flat
    assert backend_hint in flat


# --- the README's roster format ------------------------------------------------------------


def test_readme_roster_and_overlay_examples_import_as_documented(tmp_path: Path) -> None:
    """The annotated roster and overlay in the guide's "Importing the roster" are real files."""
    readme = (ROOT / "docs" / "roster.md").read_text(encoding="utf-8")
    section = readme.split("## Importing the roster", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    roster_text, overlay_text = blocks[:2]
    assert roster_text.startswith("roster:")
    for field_name in ("id", "role", "name", "repo", "ram_gb", "backend", "port", "status"):
        assert f"    {field_name}: " in roster_text or f"- {field_name}: " in roster_text
    for section_name in ("excludes:", "latency_class:", "sticky:"):
        assert section_name in overlay_text
    (tmp_path / "roster.yaml").write_text(roster_text, encoding="utf-8")
    (tmp_path / "overlay.yaml").write_text(overlay_text, encoding="utf-8")
    code, out, _ = run(
        str(tmp_path / "roster.yaml"), "--overlay", str(tmp_path / "overlay.yaml"), "--json"
    )
    assert code == 0
    doc = json.loads(out)
    specs = {s["role"]: s for s in doc["specs"]}
    assert set(specs) == {"chat-small", "voice-lite"}
    assert specs["chat-small"]["flavor"] == specs["voice-lite"]["flavor"] == "llamacpp"
    assert specs["chat-small"]["excludes"] == ["voice-lite"]
    assert specs["chat-small"]["latency_class"] == "interactive"
    assert specs["voice-lite"]["latency_class"] == "interactive"  # "voice" in its id
    assert specs["voice-lite"]["sticky"] is False
    assert doc["skipped"] == [["vision", 'backend "mlx-vlm" has no inference adapter']]
    assert doc["warnings"] == []


def test_import_and_plan_count_an_alias_the_fleet_serves_apart_alike(tmp_path: Path) -> None:
    """The import calls ``b`` an alias of ``a`` (same backend, port and repo) and counts it
    skipped; the fleet gives ``b`` other weights, so ``plan`` plans it as a role of its own.
    Both now count the same skipped entry, and each says what the other does with it."""
    entry = "role: chat, ram_gb: 0.1, backend: llama.cpp, status: live"
    roster = tmp_path / "roster.yaml"
    roster.write_text(f"roster:\n  - {{id: a, {entry}}}\n  - {{id: b, {entry}}}\n")
    for name in ("one.gguf", "two.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n  - {name: box, memory_gb: 8, reserved_gb: 1, platform: linux-x86_64, "
        "address: 127.0.0.1}\n"
        f"models:\n  a: {{path: {tmp_path / 'one.gguf'}}}\n  b: {{path: {tmp_path / 'two.gguf'}}}\n"
    )
    code, out, _ = run(str(roster))
    assert code == 0
    assert "Skipped entries (1)" in out
    assert "alias of a (same server, port and weights)" in out
    assert "serve it as a role of its own when the fleet file's models: gives it" in " ".join(
        out.split()
    )
    _register()
    planned = CliRunner().invoke(app, ["plan", str(roster), "--fleet", str(fleet)])
    assert planned.exit_code == 0, planned.output
    said = " ".join(planned.stdout.split())
    assert "1 roles imported, 1 roster entry skipped (see `rosterd roster import`)" in said
    assert "1 (b) planned as roles of their own" in said
