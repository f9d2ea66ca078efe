"""``rosterd plan``: tables and JSON from real files, exit codes, clear errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.tokens import GB
from support.up import prepare_example_models

_register()

ROSTER = """\
roster:
  - id: chat-small
    role: chat
    name: gemma-3-270m
    ram_gb: "~0.5"
    backend: llama-server
    port: 8301
    status: ready
  - id: voice-lite
    role: voice
    name: tiny-voice
    ram_gb: 0.1
    backend: llama.cpp
    port: 8310
    status: ready
  - id: planner
    role: planner
    name: big-planner
    ram_gb: 40
    backend: mlx_lm
    port: 8400
    status: ready
  - id: huge
    role: coder
    name: huge-coder
    ram_gb: 300
    backend: ollama
    port: 8401
    status: ready
"""

FLEET = """\
nodes:
  - name: box
    memory_gb: 3
    reserved_gb: 1
    platform: linux-x86_64
  - name: mac
    memory_gb: 64
    reserved_gb: 8
    platform: macos-arm64
    flavors: [mlx_lm]
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    roster = tmp_path / "roster.yaml"
    roster.write_text(ROSTER)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    return roster, fleet


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_json_has_placements_unplaced_and_nodes(files: tuple[Path, Path]) -> None:
    roster, fleet = files
    code, out, _ = run("plan", str(roster), "--fleet", str(fleet), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["placements"] == {"chat-small": "box", "voice-lite": "box", "planner": "mac"}
    [[role, reason]] = doc["unplaced"]
    assert role == "huge"
    assert "300.00 GiB" in reason
    assert doc["nodes"]["box"] == {
        "capacity_bytes": 2 * GB,
        "always_resident": ["voice-lite"],
        "swappable": ["chat-small"],
    }
    assert doc["nodes"]["mac"]["capacity_bytes"] == 56 * GB


def test_tables_show_residency_memory_bar_and_reasons(files: tuple[Path, Path]) -> None:
    roster, fleet = files
    code, out, _ = run("plan", str(roster), "--fleet", str(fleet))
    assert code == 0
    for text in ("box", "mac", "resident always", "swappable", "0.6 / 2.0 GiB", "unplaced", "huge"):
        assert text in out, text
    assert "█" in out


def test_bad_fleet_exits_2_naming_file_field_and_line(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    roster, _ = files
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: box\n    memory_gb: lots\n    platform: linux-x86_64\n")
    code, out, err = run("plan", str(roster), "--fleet", str(bad))
    assert code == 2
    assert f"{bad}:3:16: nodes[0].memory_gb" in err
    assert "lots" in err
    assert "Traceback" not in out + err
    code, out, _ = run("plan", str(roster), "--fleet", str(bad), "--json")
    assert code == 2
    assert "nodes[0].memory_gb" in json.loads(out)["error"]


def test_missing_roster_exits_2_with_json_error(tmp_path: Path) -> None:
    code, out, _ = run("plan", str(tmp_path / "nope.yaml"), "--json")
    assert code == 2
    assert "nope.yaml" in json.loads(out)["error"]


def test_without_fleet_plans_for_this_machine(files: tuple[Path, Path]) -> None:
    roster, _ = files
    code, out, _ = run("plan", str(roster), "--json", "--time-limit", "0.5")
    assert code == 0
    doc = json.loads(out)
    assert list(doc["nodes"]) == ["local"]
    assert doc["placements"]["voice-lite"] == "local"


def test_console_script_exit_code(files: tuple[Path, Path]) -> None:
    roster, fleet = files
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from rosterd.cli import main; raise SystemExit(main())",
            "plan",
            str(roster),
            "--fleet",
            str(fleet),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["placements"]["planner"] == "mac"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_example_lab_plan() -> None:
    code, out, _ = run(
        "plan",
        str(EXAMPLES / "roster.yaml"),
        "--overlay",
        str(EXAMPLES / "overlay.yaml"),
        "--fleet",
        str(EXAMPLES / "fleet-lab.yaml"),
        "--json",
    )
    assert code == 0
    doc = json.loads(out)
    placements = doc["placements"]
    # mlx_lm roles only on the Macs; the interactive ones stay resident.
    for role in ("planner", "coder", "writer", "realtime-assistant"):
        assert placements[role] in {"studio", "macbook"}
    always = {r for n in doc["nodes"].values() for r in n["always_resident"]}
    assert {"voice-lite", "coder", "realtime-assistant"} <= always
    # The 205 GiB coder cannot fit any Mac's capacity: reported with the numbers.
    [[role, reason]] = doc["unplaced"]
    assert role == "coder-large"
    # Its ram_gb is "~205", the operator's guess, and the roster's figure is what counts.
    assert "needs ~205.00 GiB (unmeasured; 220117073920 bytes) but" in reason
    assert "176.00 GiB" in reason
    assert doc["nodes"]["studio"]["capacity_bytes"] == 176 * GB


def test_roster_text_is_shown_literally_not_as_markup(tmp_path: Path) -> None:
    roster = tmp_path / "roster.yaml"
    roster.write_text(
        "roster:\n  - {id: odd, name: '[bold]x[/bold]', ram_gb: 1, backend: ollama, port: 9000}\n"
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    code, out, _ = run("plan", str(roster), "--fleet", str(fleet))
    assert code == 0
    assert "[bold]x[/bold]" in out


@pytest.mark.parametrize(
    "command", [["roster", "import"], ["plan"], ["up"]], ids=["roster-import", "plan", "up"]
)
def test_every_command_prefixes_its_errors_with_rosterd(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, out, err = run(*command, str(missing))
    assert code == 2
    assert out == ""
    assert err.startswith(f"rosterd: {missing}: cannot open the roster")


def test_json_keeps_stdout_one_document_and_warns_on_stderr(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    roster, fleet = files
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("sticky:\n  chat-smal: false\n")
    code, out, err = run(
        "plan", str(roster), "--fleet", str(fleet), "--overlay", str(overlay), "--json"
    )
    assert code == 0
    assert "placements" in json.loads(out)
    assert "chat-smal" in err
    assert err.startswith("warning:")


def _readme_plan_samples() -> list[str]:
    """The ``text`` blocks of the guide's "Planning" section: the samples of `rosterd plan`."""
    page = Path(__file__).resolve().parents[2] / "docs" / "fleet-file.md"
    readme = page.read_text(encoding="utf-8")
    section = readme.split("\n## Planning\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```text\n")[1:3]]


def _node_tables(text: str) -> list[str]:
    """The lines of ``text`` from the first node's line to the last before ``unplaced roles``."""
    lines = [line.rstrip() for line in text.splitlines()]
    first = next(i for i, line in enumerate(lines) if re.match(r"\S+ \((macos|linux)-", line))
    end = lines.index("unplaced roles") if "unplaced roles" in lines else len(lines)
    while end > first and not lines[end - 1]:
        end -= 1
    return lines[first:end]


def test_readme_plan_samples_are_what_plan_prints(tmp_path: Path) -> None:
    """The README's two samples, node tables with every memory column, from real runs on the
    bundled example (an empty state folder: nothing measured yet)."""
    prepare_example_models()  # the local fleet's estimates read the example's models
    lab, local = _readme_plan_samples()
    for sample, fleet in ((lab, "fleet-lab.yaml"), (local, "fleet.yaml")):
        result = CliRunner().invoke(
            app,
            [
                "plan",
                str(EXAMPLES / "roster.yaml"),
                "--overlay",
                str(EXAMPLES / "overlay.yaml"),
                "--fleet",
                str(EXAMPLES / fleet),
                "--state-dir",
                str(tmp_path / "state"),
            ],
        )
        assert result.exit_code == 0, result.output
        got = _node_tables(result.stdout)
        header = [cell.strip() for cell in got[2].split("┃")[1:-1]]
        assert header[-4:] == ["ram_gb", "estimate", "measured", "counts"]
        assert _node_tables(sample) == got, fleet


def test_a_role_placed_here_whose_weights_are_missing_is_said(tmp_path: Path) -> None:
    roster = tmp_path / "roster.yaml"
    roster.write_text(
        "roster:\n  - {id: gone, role: test, name: nothere, repo: local/nothere, ram_gb: 0.1,"
        " backend: llama.cpp, port: 18991, status: live}\n"
    )
    fleet = tmp_path / "fleet.yaml"
    missing = tmp_path / "nothere.gguf"
    fleet.write_text(
        json.dumps(
            {
                "nodes": [{"name": "box", "memory_gb": 4, "platform": "linux-x86_64"}],
                "models": {"gone": {"path": str(missing)}},
            }
        )
    )
    code, out, err = run(
        "plan", str(roster), "--fleet", str(fleet), "--state-dir", str(tmp_path / "s"), "--json"
    )
    assert code == 0
    assert json.loads(out)["placements"] == {"gone": "box"}  # planned all the same
    assert f"warning: role gone on node box: models: gone: {missing} does not exist" in err
