"""What ``rosterd up``, ``plan``, ``roster import``, ``ps/load/unload`` and ``--help`` print
when stdout is not a terminal (a pipe, a file, nohup): whole names, one line per message, no
trailing spaces, whatever width the environment claims."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import typer

from rosterd.cli import _register, app
from support.router_stand_ins import LIMITS, serve
from support.up import llama_entry, rosterd_argv, write_roster

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
        and line.endswith("(to run them too, serve the fleet on Ray: --ray-address)")
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


async def _run_piped(args: list[str]) -> tuple[int, str]:
    """``rosterd ARGS`` in a subprocess with stdout a pipe (no event-loop blocking)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = await asyncio.create_subprocess_exec(
        *rosterd_argv(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
        env=env,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def test_ps_load_unload_piped_have_no_trailing_spaces() -> None:
    async with serve(limits=LIMITS) as up:
        code, out = await _run_piped(["load", "slow-model", "--url", up.url])
        assert code == 0, out
        assert out.startswith("slow is resident on n1 at http://127.0.0.1:"), out
        code, out = await _run_piped(["ps", "--url", up.url])
        assert code == 0, out
        lines = out.splitlines()
        assert [line for line in lines if line != line.rstrip()] == [], out
        assert any(line.startswith("node n1:") for line in lines), out
        assert "KV kept" in out, out  # the column of the KV cache kept across swaps
        assert sum("ready" in line or "idle" in line for line in lines) >= 2, out
        assert any("slow" in line and "ready" in line for line in lines), out
        code, out = await _run_piped(["unload", "slow", "--url", up.url])
        assert code == 0, out
        assert out == "slow is no longer resident\n"


def _command_paths(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``command`` (a Click command or group), itself first."""
    paths = [path]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, (*path, name))
    return paths


def test_help_piped_keeps_every_option_name_whole(tmp_path: Path) -> None:
    _register()
    root = typer.main.get_command(app)
    paths = _command_paths(root)
    assert ("up",) in paths
    assert ("roster", "import") in paths
    for path in paths:
        code, out = _run([*path, "--help"], tmp_path)
        assert code == 0, out
        assert [line for line in out.splitlines() if line != line.rstrip()] == [], (path, out)
        assert "╭" not in out, out  # plain text, not panels sized to 80 columns
        command: Any = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            if param.param_type_name == "option":
                for opt in (*param.opts, *param.secondary_opts):
                    assert opt in re.findall(r"--?[\w-]+", out), (path, opt, out)
        if path == ():
            commands = out.split("Commands:", 1)[1].splitlines()
            assert [line for line in commands if line.endswith("...")] == [], out
    code, out = _run(["up", "--help"], tmp_path)
    assert "--max-concurrency" in re.findall(r"--?[\w-]+", out)


def test_the_old_min_residency_name_still_works_with_a_warning(tmp_path: Path) -> None:
    # renamed --min-busy-residency: it holds only a role with work (issue 22)
    code, out = _run(["up", str(tmp_path / "missing.yaml"), "--min-residency", "3"], tmp_path)
    assert code == 2, out  # the missing roster, read after the options
    assert "warning: --min-residency is deprecated; use --min-busy-residency" in out, out
