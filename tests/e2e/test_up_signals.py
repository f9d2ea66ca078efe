"""Ctrl-C on ``rosterd up`` as a user presses it: the process started from a shell (default
SIGINT, not a new session), SIGINT sent to its pid at several moments right after it says
"rosterd serving", while the warm-up is still loading the example's roles. Every stop is
clean: exit 0 after the drain, no traceback, no backend left, and a load the shutdown cut
short is no ``load_failed`` warning. A second Ctrl-C during the drain says that rosterd
is already stopping, and every backend is still stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.up import EXAMPLE_LAB, prepare_example_models, rosterd_argv

pytestmark = pytest.mark.slow


class Run:
    """One ``rosterd up`` on the example lab, its output read as it comes."""

    def __init__(self, tmp: Path, port: int) -> None:
        env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
        self.proc = subprocess.Popen(
            [
                *rosterd_argv(),
                "up",
                *EXAMPLE_LAB,
                "--port",
                str(port),
                "--state-dir",
                str(tmp / "state"),
                "--auto-backend-ports",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        self.lines: list[str] = []
        self.serving = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if "rosterd serving" in line:
                self.serving.set()

    def wait_serving(self, timeout_s: float = 60.0) -> None:
        if not self.serving.wait(timeout_s):
            self.proc.kill()
            self.finish()
            raise AssertionError("rosterd up did not say it serves:\n" + self.output())

    def finish(self, timeout_s: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code

    def output(self) -> str:
        return "".join(self.lines)


def clean_stop(output: str) -> None:
    assert "Traceback" not in output, output
    assert "load_failed" not in output, output
    assert "WARNING" not in output, output
    assert "rosterd stopped; no backend left running" in output, output


@pytest.mark.parametrize("delay_s", [0.0, 0.3, 0.7, 1.2])
def test_ctrl_c_right_after_serving_stops_cleanly(
    tmp_path: Path, llama_server_binary: Path, free_port: int, delay_s: float
) -> None:
    prepare_example_models()
    up = Run(tmp_path, free_port)
    up.wait_serving()
    time.sleep(delay_s)
    up.proc.send_signal(signal.SIGINT)
    code = up.finish()
    output = up.output()
    assert code == 0, output
    clean_stop(output)
    assert not list((tmp_path / "state").glob("run/*.json")), output  # no backend record left


def test_a_second_ctrl_c_while_stopping_stops_now_and_still_stops_every_backend(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    up = Run(tmp_path, free_port)
    up.wait_serving()
    time.sleep(0.3)
    up.proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    while "stopping: draining" not in up.output() and time.monotonic() < deadline:
        time.sleep(0.02)
    up.proc.send_signal(signal.SIGINT)
    code = up.finish()
    output = up.output()
    assert code == 0, output
    clean_stop(output)
    said = " ".join(output.split())
    assert "stopping now: requests in flight are cut; every backend stops" in said, output
    assert not list((tmp_path / "state").glob("run/*.json")), output


def test_ctrl_c_while_planning_ends_in_one_line_or_a_clean_stop(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    # The roster's import warning comes before the plan: a Ctrl-C then used to be
    # taken by asyncio's own handler and land once serving had begun, as tracebacks
    # through uvicorn's lifespan and exit 130.
    prepare_example_models()
    up = Run(tmp_path, free_port)
    deadline = time.monotonic() + 60
    while not up.lines and time.monotonic() < deadline:
        time.sleep(0.005)
    up.proc.send_signal(signal.SIGINT)
    code = up.finish()
    output = up.output()
    assert "Traceback" not in output, output
    assert "WARNING" not in output, output
    if code == 130:
        assert "interrupted before serving; nothing was started" in output, output
        assert "rosterd serving" not in output, output
    else:
        assert code == 0, output
        clean_stop(output)
    assert not list((tmp_path / "state").glob("run/*.json")), output


def test_a_second_ctrl_c_cuts_a_stream_the_drain_would_wait_for(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    up = Run(tmp_path, free_port)
    up.wait_serving()
    got: list[str] = []

    def stream() -> None:  # a long generation: the 30 s drain would wait for all of it
        body = {"model": "chat-small", "prompt": "Once upon a time", "max_tokens": 4000}
        with httpx.stream(
            "POST",
            f"http://127.0.0.1:{free_port}/v1/completions",
            json={**body, "stream": True, "ignore_eos": True},
            timeout=120,
            trust_env=False,
        ) as answer:
            for line in answer.iter_lines():
                got.append(line)

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(got) >= 3, up.output()  # it streams
    up.proc.send_signal(signal.SIGINT)
    while "stopping: draining" not in up.output() and time.monotonic() < deadline:
        time.sleep(0.02)
    cut_at = time.monotonic()
    up.proc.send_signal(signal.SIGINT)
    code = up.finish()
    stopped_s = time.monotonic() - cut_at
    reader.join(timeout=30)
    output = up.output()
    assert code == 0, output
    clean_stop(output)
    assert stopped_s < 20.0, output  # not the 30 s drain: the second Ctrl-C cut it
    assert any('"shutting_down"' in line for line in got), got[-3:]
