"""The supervisor against real processes: a small stand-in backend (tests/support/fake_backend.py)
that starts in a fraction of a second, so every lifecycle rule is checked quickly.
The same rules are checked against a real llama-server in test_llamacpp_real.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from rosterd.adapters.base import Launch, one_token_completion
from rosterd.supervisor import (
    BackendAlreadySupervisedError,
    BackendEvent,
    BackendNameError,
    BackendNotReadyError,
    BackendNotSupervisedError,
    BackendStartError,
    BackendStoppedError,
    PortInUseError,
    StateDirLockedError,
    Supervisor,
    backoff_delay,
    lock_state_dir,
    ready_timeout_for,
    tree_rss_bytes,
)
from rosterd.tokens import GB
from support.backends import (
    gone,
    kill_rosterd_child,
    port_is_free,
    run_rosterd_child,
    wait_gone,
    wait_port_free,
)

FakeLaunch = Callable[..., Launch]


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_delay(n, 0.5, 4.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff_delay(10_000, 0.5, 30.0) == 30.0


def test_ready_deadline_grows_with_weights() -> None:
    small, big = ready_timeout_for(0), ready_timeout_for(8 * GB)
    assert small == 30.0
    assert big > small
    assert ready_timeout_for(10_000 * GB) == 3600.0


async def test_start_waits_for_readiness_then_stop_frees_port(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    # /health answers 503 for 0.6 s, as llama-server does while it loads.
    launch = make_fake_launch(free_port, load_s=0.6)
    began = time.monotonic()
    backend = await supervisor.start("chat", launch)
    assert time.monotonic() - began >= 0.5
    assert backend.ready
    assert backend.base_url == f"http://127.0.0.1:{free_port}"
    async with httpx.AsyncClient() as client:
        answer = await client.get(backend.base_url + "/health")
    assert answer.status_code == 200
    assert (supervisor.state_dir / "run" / "chat.json").is_file()
    assert "fake backend listening" in supervisor.log_path("chat").read_text()

    await supervisor.stop("chat")
    assert gone(backend.pid)  # stop returns only after exit: memory is free now
    assert port_is_free(free_port)
    assert supervisor.backend("chat") is None
    assert not (supervisor.state_dir / "run" / "chat.json").exists()
    # Its load time outlives the record: the next run's expected total reads it.
    (load_s,) = supervisor.past_loads_s("chat")
    assert 0.5 <= load_s < 10


async def test_stop_kills_the_whole_process_group(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch, tmp_path: Path
) -> None:
    child_file = tmp_path / "child.pid"
    backend = await supervisor.start("grp", make_fake_launch(free_port, child_pid_file=child_file))
    child = int(child_file.read_text())
    assert not gone(child)
    await supervisor.stop("grp")
    assert gone(backend.pid)
    assert await wait_gone(child)


async def test_exit_during_load_reports_code_and_stderr_tail(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    began = time.monotonic()
    with pytest.raises(BackendStartError) as info:
        await supervisor.start("broken", make_fake_launch(free_port, "crash", load_s=0.2))
    assert time.monotonic() - began < 10  # aborted at once, not at the 30 s deadline
    err = info.value
    assert err.exit_code == 3
    assert any("could not load model" in line for line in err.output_tail)
    assert "exited with code 3" in str(err)
    assert "could not load model" in str(err)
    assert supervisor.backend("broken") is None
    assert supervisor.past_loads_s("broken") == ()  # a failed load is no load time


async def test_not_ready_before_deadline_is_killed(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    with pytest.raises(BackendNotReadyError) as info:
        await supervisor.start("slow", make_fake_launch(free_port, load_s=60), ready_timeout_s=1.0)
    assert "not ready within 1 s" in str(info.value)
    assert gone(info.value.pid)
    assert port_is_free(free_port)


async def test_port_held_by_another_process_names_the_holder(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port))
        holder.listen()
        with pytest.raises(PortInUseError) as info:
            await supervisor.start("clash", make_fake_launch(free_port))
    message = str(info.value)
    assert f"port {free_port}" in message
    assert f"pid {os.getpid()}" in message
    assert supervisor.backend("clash") is None


async def test_backend_ignoring_sigterm_is_killed_after_grace(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    sup = Supervisor(tmp_path / "state", grace_s=0.7)
    backend = await sup.start("stubborn", make_fake_launch(free_port, "ignore-term"))
    began = time.monotonic()
    await sup.stop("stubborn")
    took = time.monotonic() - began
    assert 0.6 <= took < 5.0
    assert gone(backend.pid)
    assert port_is_free(free_port)


async def test_a_backend_that_needs_a_longer_grace_gets_it_and_a_sigkill_says_why(
    tmp_path: Path,
    free_port: int,
    make_fake_launch: FakeLaunch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As an mlx_lm.server's launch says (Launch.stop_grace_s, sigkill_note): the larger of
    # --grace and its own least grace applies, and the SIGKILL names what it costs.
    sup = Supervisor(tmp_path / "state", grace_s=0.2)
    launch = dataclasses.replace(
        make_fake_launch(free_port, "ignore-term"),
        stop_grace_s=1.0,
        sigkill_note="its wired memory may stay held",
    )
    await sup.start("metal", launch)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rosterd"):
        await sup.stop("metal")
    assert time.monotonic() - began >= 0.9  # its own 1 s, not --grace's 0.2 s
    assert "SIGKILL (its wired memory may stay held)" in caplog.text


async def test_wedged_server_fails_the_generation_probe(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    await supervisor.start("wedged", make_fake_launch(free_port, "wedged"))
    result = await supervisor.probe("wedged", one_token_completion("fake"), timeout_s=1.0)
    assert not result.ok
    assert "no answer within 1 s" in result.detail


async def test_healthy_server_passes_the_generation_probe(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    await supervisor.start("fine", make_fake_launch(free_port))
    result = await supervisor.probe("fine", one_token_completion("fake"), timeout_s=5.0)
    assert result.ok
    assert result.status == 200


async def test_crashed_backend_is_restarted_with_backoff(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    events: list[BackendEvent] = []
    sup = Supervisor(
        tmp_path / "state",
        grace_s=1.0,
        initial_backoff_s=0.2,
        max_backoff_s=0.4,
        on_event=events.append,
    )
    try:
        first = await sup.start("phoenix", make_fake_launch(free_port))
        pids = [first.pid]
        for _ in range(3):
            os.kill(pids[-1], signal.SIGKILL)
            new_pid = await _wait_restarted(sup, "phoenix", pids[-1])
            pids.append(new_pid)
        assert len(set(pids)) == 4
        snapshot = sup.backend("phoenix")
        assert snapshot is not None
        assert snapshot.restarts == 3
        delays = [e.delay_s for e in events if e.kind == "restarting"]
        assert delays == [0.2, 0.4, 0.4]  # doubling, capped at max_backoff_s
        exits = [e.exit_code for e in events if e.kind == "exited"]
        assert exits == [-signal.SIGKILL] * 3
    finally:
        await sup.stop_all()
    assert all(gone(pid) for pid in pids)


async def _wait_restarted(sup: Supervisor, name: str, old_pid: int) -> int:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        backend = sup.backend(name)
        if backend is not None and backend.pid != old_pid and backend.ready:
            return backend.pid
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} was not restarted")


async def test_backoff_resets_after_a_healthy_period(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    events: list[BackendEvent] = []
    sup = Supervisor(
        tmp_path / "state",
        initial_backoff_s=0.1,
        max_backoff_s=5.0,
        healthy_reset_s=0.5,
        on_event=events.append,
    )
    try:
        pid = (await sup.start("steady", make_fake_launch(free_port))).pid
        for _ in range(2):
            await asyncio.sleep(0.7)  # longer than healthy_reset_s: counts as healthy
            os.kill(pid, signal.SIGKILL)
            pid = await _wait_restarted(sup, "steady", pid)
    finally:
        await sup.stop_all()
    assert [e.delay_s for e in events if e.kind == "restarting"] == [0.1, 0.1]


async def test_start_refuses_bad_or_duplicate_names_and_probe_unknown_ones(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    with pytest.raises(BackendNameError, match="not a plain token"):
        await supervisor.start("../evil", make_fake_launch(free_port))
    await supervisor.start("once", make_fake_launch(free_port))
    with pytest.raises(BackendAlreadySupervisedError, match="already supervised"):
        await supervisor.start("once", make_fake_launch(free_port))
    with pytest.raises(BackendNotSupervisedError, match="no backend named ghost"):
        await supervisor.probe("ghost", one_token_completion("fake"), timeout_s=1.0)


async def test_reap_leftovers_stops_an_earlier_runs_backend(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    state = tmp_path / "state"
    earlier = Supervisor(state)
    backend = await earlier.start("left", make_fake_launch(free_port), restart=False)
    # The rosterd that wrote the record is gone (a finished process stands in for it).
    gone_owner = await asyncio.create_subprocess_exec("true")
    await gone_owner.wait()
    record_path = state / "run" / "left.json"
    record = json.loads(record_path.read_text())
    assert record["owner_pid"] == os.getpid()
    record_path.write_text(json.dumps({**record, "owner_pid": gone_owner.pid}))
    later = Supervisor(state, grace_s=2.0)  # a new rosterd run on the same state folder
    assert await later.reap_leftovers() == [backend.pid]
    assert await wait_gone(backend.pid)
    assert not (state / "run" / "left.json").exists()
    await earlier.stop_all()


async def test_reap_leftovers_never_touches_someone_elses_process(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sup = Supervisor(state)
    stranger = await asyncio.create_subprocess_exec("sleep", "30")
    try:
        created = psutil.Process(stranger.pid).create_time()
        records = {
            # pid reused by another program: the command line differs
            "reused": {"pid": stranger.pid, "create_time": created, "cmdline": ["llama-server"]},
            # same command line, but started at another time: not the recorded process
            "older": {
                "pid": stranger.pid,
                "create_time": created - 100,
                "cmdline": ["sleep", "30"],
            },
            "junk": "not a record",
        }
        for name, record in records.items():
            (state / "run" / f"{name}.json").write_text(json.dumps(record))
        assert await sup.reap_leftovers() == []
        assert stranger.returncode is None
        assert not gone(stranger.pid)
        assert list((state / "run").glob("*.json")) == []
    finally:
        stranger.kill()
        await stranger.wait()


async def test_no_backend_survives_kill_9_of_rosterd(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    state = tmp_path / "state"
    rosterd, backend_pid = await run_rosterd_child(state, make_fake_launch(free_port), 30)
    assert not gone(backend_pid)
    await kill_rosterd_child(rosterd)
    assert await wait_gone(backend_pid), "the backend outlived the rosterd that started it"
    assert await wait_port_free(free_port)
    # The next run finds the record, sees its process is gone, and cleans it up.
    assert (state / "run" / "orphan.json").is_file()
    assert await Supervisor(state).reap_leftovers() == []
    assert not (state / "run" / "orphan.json").exists()


@pytest.mark.parametrize("after_s", [0.0, 0.5])  # before the process exists; while it loads
async def test_stop_while_starting_ends_the_start(
    supervisor: Supervisor, free_port: int, make_fake_launch: FakeLaunch, after_s: float
) -> None:
    starting = asyncio.create_task(supervisor.start("late", make_fake_launch(free_port, load_s=30)))
    await asyncio.sleep(after_s)
    await supervisor.stop("late")
    with pytest.raises(BackendStoppedError, match="was stopped before it was ready") as info:
        await starting
    assert gone(info.value.pid)
    assert supervisor.backend("late") is None
    assert port_is_free(free_port)


async def test_reap_leftovers_spares_a_running_rosterds_backends(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    # Another rosterd (a live process) runs a backend recorded in the same state folder.
    state = tmp_path / "state"
    other, backend_pid = await run_rosterd_child(state, make_fake_launch(free_port), 30)
    try:
        record = json.loads((state / "run" / "orphan.json").read_text())
        assert record["owner_pid"] == other.pid
        assert await Supervisor(state, grace_s=1.0).reap_leftovers() == []
        assert not gone(backend_pid)
        assert (state / "run" / "orphan.json").is_file()
    finally:
        await kill_rosterd_child(other)
    assert await wait_gone(backend_pid)


def test_state_dir_lock_is_exclusive_between_processes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from rosterd.supervisor import "
            "lock_state_dir; lock = lock_state_dir(Path(sys.argv[1])); print('locked', "
            "flush=True); time.sleep(60)",
            str(state),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateDirLockedError, match=f"pid {holder.pid}") as info:
            lock_state_dir(state)
        assert info.value.owner_pid == holder.pid
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    with lock_state_dir(state):  # free once its holder is gone
        assert (state / "rosterd.lock").read_text().strip() == str(os.getpid())


async def test_restarts_give_up_after_max_restart_failures(
    tmp_path: Path, free_port: int, make_fake_launch: FakeLaunch
) -> None:
    events: list[BackendEvent] = []
    gave_up = asyncio.Event()

    def on_event(event: BackendEvent) -> None:
        events.append(event)
        if event.final:
            gave_up.set()

    sup = Supervisor(
        tmp_path / "state",
        grace_s=1.0,
        initial_backoff_s=0.3,
        max_backoff_s=0.3,
        max_restart_failures=2,
        on_event=on_event,
    )
    try:
        pid = (await sup.start("doomed", make_fake_launch(free_port))).pid
        os.kill(pid, signal.SIGKILL)
        assert await wait_gone(pid)
        with socket.socket() as squatter:  # every restart now finds its port taken
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", free_port))
            squatter.listen(1)
            await asyncio.wait_for(gave_up.wait(), 10)
        failed = [e for e in events if e.kind == "restart_failed"]
        assert [e.final for e in failed] == [False, True]
        assert "gave up after 2 failed restart(s)" in failed[-1].detail
        assert sup.backend("doomed") is None
        assert sup.names() == ()
        assert list((sup.state_dir / "run").glob("*.json")) == []
    finally:
        await sup.stop_all()


# A parent whose child holds 64 MiB it has written to (so the pages are resident).
RSS_TREE_PARENT = """
import subprocess, sys, time
child = subprocess.Popen(
    [sys.executable, "-c",
     "import time; block = b'x' * (64 << 20); print('ready', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True,
)
assert child.stdout is not None and child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(60)
"""


async def test_tree_rss_bytes_counts_a_process_and_its_children() -> None:
    held = 64 << 20
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RSS_TREE_PARENT, stdout=asyncio.subprocess.PIPE
    )
    child_pid: int | None = None
    try:
        assert parent.stdout is not None
        child_pid = int(await asyncio.wait_for(parent.stdout.readline(), 30))
        parent_rss = psutil.Process(parent.pid).memory_info().rss
        tree = tree_rss_bytes(parent.pid)
        assert tree is not None
        assert tree >= parent_rss + held, "the child's memory counts in its parent's tree"
        child = tree_rss_bytes(child_pid)
        assert child is not None
        assert held <= child < tree
        # Memory counts as free once the process has exited, even before it is reaped.
        os.kill(child_pid, signal.SIGKILL)
        assert await wait_gone(child_pid)
        assert tree_rss_bytes(child_pid) is None
        after = tree_rss_bytes(parent.pid)
        assert after is not None
        assert after < parent_rss + held
    finally:
        if child_pid is not None and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)
        await kill_rosterd_child(parent)  # SIGKILL, reap, close its pipe
    assert tree_rss_bytes(parent.pid) is None


def test_the_holder_of_a_port_is_named_with_whole_arguments() -> None:
    from rosterd.supervisor.ports import _short_command

    argv = ["llama-server", "-m", "/models/" + "x" * 100 + ".gguf", "--host", "127.0.0.1"]
    assert _short_command(argv) == "llama-server -m …"  # never a cut argument
    assert _short_command(["ollama", "serve"]) == "ollama serve"
