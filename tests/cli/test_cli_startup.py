"""``rosterd --help``, ``--version``, ``ps``, ``load``, ``unload``, ``reload``, ``logs``,
``schema`` and ``roster import`` start at once: they import nothing they do not use (no
solver, no numpy, no HTTP server, no scheduler).
``roster import`` still loads pydantic: Typer checks its path arguments with it.

Each command runs in a fresh interpreter, as a user runs it; the modules it loaded are read
from ``sys.modules`` when it is done.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: What only `up` and `plan` need: the solver (and numpy/pandas with it), the HTTP
#: server, metrics, process tools, pydantic (Typer's checks of typed options) and
#: rosterd's run-time layers.
HEAVY = (
    "ortools",
    "numpy",
    "pandas",
    "uvicorn",
    "starlette",
    "prometheus_client",
    "psutil",
    "pydantic",
    "pydantic_core",
    "httpx",
    "rosterd.placement",
    "rosterd.supervisor",
    "rosterd.scheduler",
    "rosterd.router",
    "rosterd.up.runtime",
)

_PROBE = """
import json, sys
from rosterd.cli import main
status = main(sys.argv[1:])
heavy = json.loads(HEAVY)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy or m in heavy)
print(json.dumps({"status": status, "loaded": loaded}), file=sys.stderr)
"""


def _dead_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    return f"http://127.0.0.1:{port}"


def _loaded(args: list[str]) -> tuple[int, list[str]]:
    """Run ``rosterd ARGS`` in a new interpreter: its exit status and the heavy modules it
    imported."""
    code = _PROBE.replace("HEAVY", repr(json.dumps(HEAVY)))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return report["status"], report["loaded"]


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["--help"], 0),
        (["ps", "--url", "DEAD"], 3),
        (["load", "chat-small", "--url", "DEAD"], 3),
        (["unload", "chat-small", "--url", "DEAD"], 3),
        (["reload", "--url", "DEAD"], 3),
        (["logs", "chat-small", "-f", "-n", "5", "--url", "DEAD"], 3),
        (["ps", "--json", "--url", "DEAD"], 3),
        (["--version"], 0),
        (["schema", "roster"], 0),
        (["roster", "import", str(EXAMPLES / "roster.yaml"), "--json"], 0),
        (["roster", "import", str(EXAMPLES / "roster.yaml")], 0),
    ],
    ids=[
        "help",
        "ps",
        "load",
        "unload",
        "reload",
        "logs",
        "ps-json",
        "version",
        "schema",
        "roster-import-json",
        "roster-import",
    ],
)
def test_light_commands_import_nothing_heavy(args: list[str], status: int) -> None:
    dead = _dead_url()
    got, loaded = _loaded([dead if a == "DEAD" else a for a in args])
    assert got == status
    if args[0] == "roster":  # Typer checks Path options with pydantic
        loaded = [m for m in loaded if m.split(".")[0] not in ("pydantic", "pydantic_core")]
    assert loaded == []


def test_plan_does_load_the_solver() -> None:
    """The probe sees imports: ``plan`` needs OR-Tools, and it is listed."""
    status, loaded = _loaded(
        ["plan", str(EXAMPLES / "roster.yaml"), "--fleet", str(EXAMPLES / "fleet.yaml"), "--json"]
    )
    assert status == 0
    assert "ortools" in loaded
