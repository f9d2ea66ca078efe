"""Helpers for the ``rosterd up`` tests: run it as a user does (a subprocess) or in this
event loop (:func:`serving`, an :class:`UpRun`), talk to it over real HTTP, stop it and
check that no backend is left; a fleet whose roles run the stand-in backend as llama-server
(:func:`stand_in`); the :func:`rosterd_up` fixture (registered by ``tests/conftest.py``).
No tests here."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from rich.console import Console

from rosterd.cli.up_report import ConsoleReporter
from rosterd.up.runtime import UpOptions, UpRun
from support.backends import FAKE_BACKEND, gone, pick_free_port
from support.polling import eventually_sync

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MODELS = EXAMPLES / "models"
GEMMA = MODELS / "gemma-3-270m-q4_k_m.gguf"
#: The example's chat-small: SmolLM2-135M-Instruct, instruction-tuned (``--jinja``).
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"


def example_extra_args(model: str) -> list[str]:
    """The example fleet's ``extra_args`` for ``model`` (SmolLM2's: ``--jinja``, its
    template, ``--temp 0``), so a test's own fleet serves it as the example does."""
    import yaml

    fleet = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text(encoding="utf-8"))
    return [str(arg) for arg in fleet["models"][model]["extra_args"]]


#: ``rosterd up``'s arguments for the example lab: its roster, overlay and fleet.
EXAMPLE_LAB = [
    str(EXAMPLES / "roster.yaml"),
    "--overlay",
    str(EXAMPLES / "overlay.yaml"),
    "--fleet",
    str(EXAMPLES / "fleet.yaml"),
]


def prepare_example_models() -> None:
    """Run ``scripts/prepare-example`` (idempotent: fast when the files exist)."""
    subprocess.run(["bash", str(ROOT / "scripts" / "prepare-example")], check=True, timeout=300)


def rosterd_argv() -> list[str]:
    """The ``rosterd`` command of this environment (the console script beside the interpreter)."""
    script = Path(sys.executable).with_name("rosterd")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from rosterd.cli import main; raise SystemExit(main())"]


@dataclass
class Up:
    """A running ``rosterd up``: its process, URL and output file."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str, **kwargs: Any) -> Any:
        r = httpx.get(self.url + path, timeout=30, trust_env=False, **kwargs)
        r.raise_for_status()
        return r.json()

    def backend_pids(self) -> set[int]:
        """Pids of the backends it runs now (from ``/status``) plus its child processes."""
        status = self.get("/status")
        pids = {
            info["pid"]
            for node in status["nodes"].values()
            for info in node["roles"].values()
            if info["pid"] is not None
        }
        with_children = set(pids)
        with contextlib.suppress(psutil.NoSuchProcess):
            with_children |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        return with_children

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout_s: float = 60.0) -> int:
        """Send ``sig`` and wait for the exit status."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)


def start_up(
    args: list[str],
    tmp: Path,
    port: int,
    *,
    ready_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    auto_backend_ports: bool = True,
) -> Up:
    """Start ``rosterd up ARGS --port PORT`` with its state in ``tmp``; wait for ``/health``.
    ``env``: variables added to the environment (e.g. ``ROSTERD_LLAMA_SERVER``);
    ``auto_backend_ports``: with ``--auto-backend-ports`` (so that test modules can run at
    once); ``False``: each backend on its roster port, as a user runs it."""
    log = tmp / "up.log"
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200", **(env or {}))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *rosterd_argv(),
                "up",
                *args,
                "--port",
                str(port),
                "--state-dir",
                str(tmp / "state"),
                *(["--auto-backend-ports"] if auto_backend_ports else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    up = Up(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"rosterd up exited with {proc.returncode}:\n{up.output()}")
        try:
            if httpx.get(up.url + "/health", timeout=1, trust_env=False).status_code == 200:
                return up
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"rosterd up did not answer /health:\n{up.output()}")


#: ``rosterd_up(args, **start_up_keywords)``: see :func:`rosterd_up`.
StartUp = Callable[..., Up]


@pytest.fixture
def rosterd_up(tmp_path: Path) -> Iterator[StartUp]:
    """Start ``rosterd up ARGS`` as a user does (:func:`start_up`: a free router port,
    ``--auto-backend-ports``, its state under the test's ``tmp_path``; keywords go to
    :func:`start_up`) and get its :class:`Up` once it answers ``/health``. Every one
    started and still running at the end is stopped by its handle (SIGINT, as Ctrl-C)
    and must exit 0; a test that checks its exit or its last words stops it itself."""
    started: list[Up] = []

    def start(args: list[str], **keywords: Any) -> Up:
        up = start_up(args, tmp_path, pick_free_port(), **keywords)
        started.append(up)
        return up

    yield start
    for up in started:
        if up.proc.poll() is None:
            assert up.stop(signal.SIGINT) == 0, up.output()


def wait_resident(up: Up, roles: set[str], timeout_s: float = 60.0) -> None:
    """Wait until every role in ``roles`` is ready (the warm-up loads)."""

    def resident() -> bool:
        ready = {
            role
            for node in up.get("/status")["nodes"].values()
            for role, info in node["roles"].items()
            if info["phase"] == "ready"
        }
        return roles <= ready

    eventually_sync(
        resident,
        what=f"{sorted(roles)} resident",
        timeout_s=timeout_s,
        context=lambda: json.dumps(up.get("/status")),
    )


def all_gone(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    """The pids among ``pids`` still running after ``timeout_s`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if not gone(pid)}
        time.sleep(0.05)
    return alive


def write_roster(path: Path, entries: list[dict[str, object]]) -> Path:
    """A roster file with ``entries`` (JSON is valid YAML)."""
    path.write_text(json.dumps({"roster": entries}, indent=1))
    return path


def write_box_fleet(
    path: Path,
    models: dict[str, dict[str, object]],
    *,
    memory_gb: float = 4,
    reserved_gb: float = 1,
    flavors: list[str] | None = None,
    address: str | None = None,
    max_concurrency: int | None = None,
    devices: list[dict[str, object]] | None = None,
) -> Path:
    """A fleet file of one linux-x86_64 node ``box`` (with ``flavors``, ``address``,
    ``max_concurrency`` and ``devices`` when given), the fleet's ``models`` map and
    ``MODELS`` as its model root (JSON is valid YAML)."""
    node: dict[str, object] = {
        "name": "box",
        "memory_gb": memory_gb,
        "reserved_gb": reserved_gb,
        "platform": "linux-x86_64",
    }
    if flavors is not None:
        node["flavors"] = flavors
    if address is not None:
        node["address"] = address
    if max_concurrency is not None:
        node["max_concurrency"] = max_concurrency
    if devices is not None:
        node["devices"] = devices
    path.write_text(json.dumps({"nodes": [node], "models": models, "model_roots": [str(MODELS)]}))
    return path


def llama_entry(role: str, name: str, ram_gb: float, port: int) -> dict[str, object]:
    """A llama.cpp roster entry."""
    return {
        "id": role,
        "role": "test",
        "name": name,
        "repo": f"local/{name}",
        "ram_gb": ram_gb,
        "backend": "llama.cpp",
        "port": port,
        "status": "live",
    }


def rosterd_text(*args: str, timeout_s: float = 60.0) -> str:
    """What ``rosterd ARGS`` prints, as a user's plain terminal of 200 columns shows it
    (``NO_COLOR``). Raises ``CalledProcessError`` where it exits non-zero."""
    return subprocess.run(
        [*rosterd_argv(), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="200"),
        check=True,
    ).stdout


def text_console(width: int = 300) -> Console:
    """A console that records what is printed (read it with :func:`console_text`)."""
    return Console(file=io.StringIO(), width=width, highlight=False)


def console_text(console: Console) -> str:
    """What was printed on ``console`` (``""`` unless it prints into a ``StringIO``)."""
    stream = console.file
    return stream.getvalue() if isinstance(stream, io.StringIO) else ""


@dataclass
class InProcessUp:
    """A ``rosterd up`` serving in this event loop (from :func:`serving`): the run, the
    router's ``http://HOST:PORT`` and the consoles it prints on."""

    up: UpRun
    url: str
    out: Console
    err: Console


@contextlib.asynccontextmanager
async def serving(
    options: UpOptions,
    *,
    out: Console | None = None,
    err: Console | None = None,
    ready_timeout_s: float = 60.0,
    stop_timeout_s: float = 90.0,
) -> AsyncIterator[InProcessUp]:
    """Run ``rosterd up`` with ``options`` in this event loop while the body runs.

    Yields once the router listens. On the way out, also when the body raised, the run is
    stopped by its handle and awaited (it drains and stops every backend). ``out`` and
    ``err`` default to :func:`text_console` consoles.

    Raises:
        Exception: the run's own error (e.g. ``RosterdError``) if it ended before it
            served, or if it raised while serving or stopping.
        AssertionError: it did not serve within ``ready_timeout_s`` seconds, ended before
            it served without an error, or did not stop within ``stop_timeout_s``.
    """
    out = out if out is not None else text_console()
    err = err if err is not None else text_console()
    up = UpRun(options, ConsoleReporter(out, err))
    run = asyncio.create_task(up.run(), name="rosterd-up-in-test")
    try:
        url = await _until_serving(up, run, ready_timeout_s)
    except BaseException:
        up.stop()
        if not run.done():  # a run that ended raised its error already
            await _until_ended(run, stop_timeout_s)
        raise
    try:
        yield InProcessUp(up, url, out, err)
    finally:
        up.stop()
        await _until_ended(run, stop_timeout_s)


async def _until_serving(up: UpRun, run: asyncio.Task[None], timeout_s: float) -> str:
    """The run's URL once it serves; its own error if it ended first."""
    ready = asyncio.ensure_future(up.serving())
    try:
        await asyncio.wait({ready, run}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ready.cancel()
    if ready.done() and not ready.cancelled() and ready.exception() is None:
        return ready.result()
    said = up.reporter
    assert isinstance(said, ConsoleReporter)
    if run.done():
        run.result()  # raises the run's own error
        raise AssertionError(f"rosterd up ended before it served:\n{console_text(said.out)}")
    raise AssertionError(
        f"rosterd up did not serve within {timeout_s} s:\n{console_text(said.out)}"
        f"{console_text(said.err)}"
    )


async def _until_ended(run: asyncio.Task[None], timeout_s: float) -> None:
    """Wait for a stopped run to end (raising its error); cancel it after ``timeout_s``."""
    await asyncio.wait({run}, timeout=timeout_s)
    if not run.done():
        run.cancel()  # its own clean-up still stops every backend
        with contextlib.suppress(asyncio.CancelledError):
            await run
        raise AssertionError(f"rosterd up did not stop within {timeout_s} s of its stop()")
    run.result()


WRAPPER = """#!{python}
import json, os, sys
argv = sys.argv[1:]
model = argv[argv.index("-m") + 1]
extra = json.loads(open(model + ".args").read()) if os.path.exists(model + ".args") else []
os.execv({python!r}, [{python!r}, {fake!r}, *argv, *extra])
"""


def stand_in(
    tmp: Path, models: dict[str, list[str]], *, memory_gb: float = 4
) -> tuple[Path, dict[str, str]]:
    """A fleet whose roles (one per key) run the stand-in with the given extra options, and
    the environment that makes rosterd run it as llama-server."""
    wrapper = tmp / "llama-server"
    wrapper.write_text(WRAPPER.format(python=sys.executable, fake=str(FAKE_BACKEND)))
    wrapper.chmod(0o755)
    entries: dict[str, object] = {}
    for role, options in models.items():
        gguf = tmp / f"{role}.gguf"
        gguf.write_bytes(b"GGUF stand-in")
        Path(f"{gguf}.args").write_text(json.dumps(options))
        entries[role] = {"path": str(gguf), "grace_s": 0.5}
    fleet = tmp / "fleet.yaml"
    node = {"name": "box", "memory_gb": memory_gb, "reserved_gb": 1, "platform": "linux-x86_64"}
    fleet.write_text(json.dumps({"nodes": [node], "models": entries, "model_roots": [str(tmp)]}))
    return fleet, {"ROSTERD_LLAMA_SERVER": str(wrapper)}


def role_info(up: Up, role: str) -> dict[str, object]:
    return dict(up.get("/status")["nodes"]["box"]["roles"][role])


def event_kinds(up: Up, role: str) -> list[str]:
    return [e["kind"] for e in up.get("/rosterd/events")["events"] if e["role"] == role]


def post(up: Up, body: dict[str, object], timeout_s: float = 30.0) -> httpx.Response:
    return httpx.post(up.url + "/v1/completions", json=body, timeout=timeout_s, trust_env=False)


def console() -> Console:
    return Console(file=io.StringIO(), width=200, highlight=False)


def listener_of(base_url: str) -> psutil.Process:
    """The process listening at ``base_url``'s address and port."""
    parts = urlsplit(base_url)
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.pid is None:
            continue
        if (conn.laddr.ip, conn.laddr.port) == (parts.hostname, parts.port):
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens at {base_url}")
