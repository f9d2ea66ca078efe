"""Backend logs rotate by size, lose nothing while rosterd is slow, and never block a backend.

Real child processes write through ``spawn_logged`` (the supervisor's own way to start a
backend); the log size is made small so that rotation shows in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from rosterd.supervisor import logs as backend_logs
from rosterd.supervisor.process import (
    REASON_CHARS,
    failure_reason,
    latest_run_output,
    output_tail,
    spawn_logged,
)
from support.backends import gone

#: A child that writes ``N`` numbered lines of about 100 bytes each, then exits.
WRITER = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "for i in range(n):\n"
    "    sys.stdout.write(f'line {i:07d} ' + 'x' * 88 + '\\n')\n"
    "sys.stdout.flush()\n"
)


async def _run_writer(log: Path, lines: int) -> asyncio.subprocess.Process:
    proc, _ = await spawn_logged("writer", [sys.executable, "-c", WRITER, str(lines)], {}, log)
    assert await proc.wait() == 0
    return proc


def _numbers(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("line ")]


async def _settled(log: Path) -> None:
    """Wait for the log reader to reach the end of the pipe (the child has exited)."""
    for _ in range(200):
        backend_logs.drain_log(log)
        if log not in backend_logs._open_logs:
            return
        await asyncio.sleep(0.01)


async def test_a_log_rotates_by_size_and_keeps_a_few_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend_logs, "LOG_MAX_BYTES", 20_000)
    monkeypatch.setattr(backend_logs, "LOG_BACKUPS", 2)
    log = tmp_path / "logs" / "writer.log"
    await _run_writer(log, 1000)  # about 100 KB: five files' worth
    await _settled(log)

    files = backend_logs.log_files(log)
    assert [f.name for f in files] == ["writer.log.2", "writer.log.1", "writer.log"]
    assert not (tmp_path / "logs" / "writer.log.3").exists()  # the oldest were dropped
    for f in files[:-1]:
        assert 19_000 < f.stat().st_size <= 20_000  # cut at a line end near the limit
    assert files[-1].stat().st_size <= 20_000
    kept = _numbers("".join(f.read_text() for f in files))
    assert kept[-1] == 999  # the newest line is there
    assert kept == list(range(kept[0], 1000))  # nothing lost or reordered within the kept files
    assert kept[0] > 0  # and the oldest really went


async def test_a_restart_appends_to_the_same_log_after_a_header(tmp_path: Path) -> None:
    log = tmp_path / "writer.log"
    await _run_writer(log, 3)
    await _run_writer(log, 2)
    await _settled(log)
    text = log.read_text()
    assert text.count("--- rosterd: starting writer at ") == 2
    assert _numbers(text) == [0, 1, 2, 0, 1]


async def test_a_backend_never_blocks_on_a_slow_rosterd(tmp_path: Path) -> None:
    """4 MiB of output, far more than a pipe holds, is written while rosterd's event loop
    does not run at all; the child still finishes, and every line reaches the log."""
    log = tmp_path / "loud.log"
    lines = 40_000
    proc, _ = await spawn_logged("loud", [sys.executable, "-c", WRITER, str(lines)], {}, log)
    deadline = time.monotonic() + 20
    while not gone(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # noqa: ASYNC251 - blocks the event loop, as a slow handler would
    assert gone(proc.pid), "the child blocked writing its output"
    assert await proc.wait() == 0
    await _settled(log)
    assert _numbers(log.read_text()) == list(range(lines))


async def test_a_start_error_quotes_the_last_lines_at_once(tmp_path: Path) -> None:
    """What a process wrote just before it exited is in its tail without waiting."""
    log = tmp_path / "crash.log"
    argv = [sys.executable, "-c", "import sys; print('loading'); print('bad magic', flush=True)"]
    for _ in range(20):  # the reader thread must never be behind the tail
        proc, offset = await spawn_logged("crash", argv, {}, log)
        await proc.wait()
        assert output_tail(log, offset)[-2:] == ("loading", "bad magic")
    await _settled(log)


def test_the_latest_runs_output_is_read_from_its_header_on_across_a_rotation(
    tmp_path: Path,
) -> None:
    # What a ready backend logged as it loaded (its buffers) is read from its own run's
    # part of the log: an earlier run's lines are not, a rotation since its start loses none.
    log = tmp_path / "chat.log"
    header = "--- rosterd: starting chat at 2026-01-0{day}T00:00:00+0000: llama-server -m m\n"
    (tmp_path / "chat.log.2").write_text(header.format(day=1) + "old run\n")
    (tmp_path / "chat.log.1").write_text("old run, more\n" + header.format(day=2) + "loading\n")
    log.write_text("loaded\nserving\n")
    assert latest_run_output(log, "chat") == "loading\nloaded\nserving\n"
    log.write_text(log.read_text() + header.format(day=3) + "restarted\n")
    assert latest_run_output(log, "chat") == "restarted\n"
    assert latest_run_output(tmp_path / "voice.log", "voice") == ""  # no log yet


def test_the_reason_of_a_failed_start_is_the_first_error_lines_bounded() -> None:
    """llama.cpp's error-level lines, first (the cause) and once each, without time stamps."""
    magic = "invalid magic characters: 'x\x1b[2J', expected 'GGUF'"
    llama = (
        "0.00.000.751 I srv  llama_server: initializing ...",
        "0.00.003.329 I srv    load_model: loading model 'tests_that_fail/model.gguf'",
        f"0.00.003.444 E gguf_init_from_reader: {magic}",
        "0.00.003.622 E llama_model_load: error loading model: failed to load model",
        f"0.00.003.671 E gguf_init_from_reader: {magic}",
        "0.00.003.683 E srv    load_model: failed to load model, 'model.gguf'",
        "0.00.003.955 E srv  llama_server: exiting due to model loading error",
    )
    assert failure_reason(llama) == (
        "gguf_init_from_reader: invalid magic characters: 'x?[2J', expected 'GGUF'; "
        "llama_model_load: error loading model: failed to load model; "
        "srv load_model: failed to load model, 'model.gguf'"
    )
    # Output without levels: the lines with an error word; else the last line.
    traceback = ("Traceback (most recent call last):", '  File "x.py"', "ValueError: no weights")
    assert failure_reason(traceback) == "ValueError: no weights"
    assert failure_reason(("starting", "listening on 8080", "")) == "listening on 8080"
    assert failure_reason(()) == ""
    long = failure_reason(tuple(f"error {i}: " + "x" * 200 for i in range(5)))
    assert len(long) == REASON_CHARS
    assert long.startswith("error 0: ")
    assert long.endswith("…")
