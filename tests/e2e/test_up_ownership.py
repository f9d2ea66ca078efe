"""Two ``rosterd up`` on one state folder: the second is refused and the first keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from support.backends import pick_free_port
from support.up import EXAMPLE_LAB, StartUp, rosterd_argv

EXAMPLE = [*EXAMPLE_LAB, "--no-warm-up"]


def test_second_up_on_the_same_state_dir_exits_2_naming_the_first(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    first = rosterd_up(EXAMPLE)
    try:
        assert (tmp_path / "state" / "rosterd.lock").read_text().strip() == str(first.proc.pid)
        second = subprocess.run(
            [
                *rosterd_argv(),
                "up",
                *EXAMPLE,
                "--port",
                str(pick_free_port()),
                "--state-dir",
                str(tmp_path / "state"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, NO_COLOR="1", COLUMNS="300"),
        )
        assert second.returncode == 2, second.stdout + second.stderr
        message = " ".join(second.stderr.split())
        assert f"another rosterd (pid {first.proc.pid}) is running" in message
        assert "--state-dir" in message
        assert "Traceback" not in second.stderr
        assert first.get("/health") is not None  # the first one still serves
        assert first.proc.poll() is None
    finally:
        assert first.stop(signal.SIGINT) == 0
    # The lock dies with its owner: the folder is usable again.
    again = rosterd_up(EXAMPLE)
    assert again.stop(signal.SIGINT) == 0
