"""What a swap and a wedge cost: rosterd against llama.cpp's own router mode, in one run.

    .venv/bin/python bench/swap_bench.py [--rounds N] [--models 2|3] [--idle S] [--no-wedge]
        [--llama-wedge-wait S]

In one run it writes three tiny random GGUFs into one folder and starts, side by
side on the same files:

- ``rosterd up`` with its default flags (the KV cache kept) on a one-node fleet whose
  budget holds one of the three roles at a time (so every request for another role
  forces a swap: stop the resident backend, start the asked one);
- the same with ``keep_kv: false`` on every model (nothing saved, nothing restored);
- ``llama-server --models-dir D --models-max 1`` (llama.cpp's router mode: one
  child llama-server per model, at most one loaded; a request's ``model``, the
  file's name, picks it).

**Swap**: requests alternate over the first ``--models`` models (default 2: x, y,
x, y, ..., one person switching between a chat model and a coder), one token
each, alternating between the three servers, for ``--rounds`` rotations (default 4:
8 swaps), with ``--idle`` seconds (default 2) after each step, so the roles are idle
when they are evicted (past the 1.5 s after which rosterd saves an idle role's KV:
the swap finds it saved and only stops it). Two roles
evicting each other back and forth is what ``--min-busy-residency`` holds
only while the role has work: an idle role yields at once. Each request's time
is the swap as a client sees it (stop, load, first answer); medians and ranges
are printed, and each rosterd's median over the router's.

**Wedge**: a second ``rosterd up`` with short liveness flags
(``--probe-interval 1 --probe-timeout 1 --first-byte-timeout 2``) serves one
role; its backend is SIGSTOPped and a client sends a request, then another as
soon as one fails, until one is served: the time from the SIGSTOP to that
answer. The same is done to the loaded child of llama.cpp's router, bounded by
``--llama-wedge-wait`` seconds (it has no liveness check of its own).

Everything it starts is stopped by its own handle (SIGINT to rosterd, SIGTERM to
llama-server; the SIGSTOPped child gets SIGCONT and SIGKILL).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("swap-x", "swap-y", "swap-z")


def write_tiny_gguf(path: Path, seed: int) -> Path:
    """The project's tiny random llama GGUF (``scripts/make_tiny_gguf.py``)."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_gguf", ROOT / "scripts" / "make_tiny_gguf.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    writer = cast(Callable[[Path, int], Path], module.write_tiny_gguf)
    return writer(path, seed)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def llama_server() -> str:
    from rosterd.adapters.llamacpp import find_llama_server

    return str(find_llama_server())


def rosterd_argv() -> list[str]:
    script = Path(sys.executable).with_name("rosterd")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from rosterd.cli import main; raise SystemExit(main())"]


def start_rosterd(
    work: Path,
    name: str,
    roles: tuple[str, ...],
    capacity_gb: float,
    flags: list[str],
    *,
    keep_kv: bool = True,
) -> tuple[subprocess.Popen[bytes], str]:
    """``rosterd up`` serving ``roles`` (0.5 GiB each, one file each) on a node of
    ``capacity_gb`` (``keep_kv``: the fleet's ``keep_kv`` of every model); its process and
    URL once ``/health`` answers."""
    folder = work / name
    folder.mkdir()
    roster = {
        "roster": [
            {
                "id": role,
                "role": "swap benchmark",
                "name": role,
                "repo": f"local/{role}",
                "ram_gb": 0.5,
                "backend": "llama.cpp",
                "port": 18800 + i,
                "status": "live",
            }
            for i, role in enumerate(roles)
        ]
    }
    fleet = {
        "nodes": [
            {
                "name": "box",
                "memory_gb": capacity_gb + 1,
                "reserved_gb": 1,
                "platform": "linux-x86_64",
                "address": "127.0.0.1",
            }
        ],
        "models": {
            r: {"path": str(work / "models" / f"{r}.gguf"), "ctx_size": 256, "keep_kv": keep_kv}
            for r in roles
        },
        "model_roots": [str(work / "models")],
    }
    (folder / "roster.yaml").write_text(json.dumps(roster))
    (folder / "fleet.yaml").write_text(json.dumps(fleet))
    port = free_port()
    argv = [
        *rosterd_argv(),
        "up",
        str(folder / "roster.yaml"),
        "--fleet",
        str(folder / "fleet.yaml"),
    ]
    argv += ["--port", str(port), "--state-dir", str(folder / "state"), "--auto-backend-ports"]
    with (folder / "up.log").open("wb") as log:
        proc = subprocess.Popen([*argv, *flags], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc, folder / "up.log")
    return proc, url


def start_llama_router(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``llama-server --models-dir D --models-max 1`` on the same files; process and URL."""
    port = free_port()
    argv = [llama_server(), "--models-dir", str(work / "models"), "--models-max", "1"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "-c", "256", "-np", "1"]
    with (work / "llama-router.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_health(url, proc, work / "llama-router.log")
    return proc, url


def wait_health(
    url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer /health")


def complete(client: httpx.Client, url: str, model: str) -> float:
    """One one-token completion of ``model``; seconds it took. Raises on a non-200."""
    began = time.perf_counter()
    body = {"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    response = client.post(url + "/v1/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{url} {model}: {response.status_code} {response.text[:300]}")
    return time.perf_counter() - began


def llama_model_ids(client: httpx.Client, url: str) -> dict[str, str]:
    """Our model name -> the id llama.cpp's router gives the file."""
    data = client.get(url + "/v1/models").json()["data"]
    ids = [str(m["id"]) for m in data]
    return {name: next(i for i in ids if name in i) for name in MODELS}


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    return (
        f"{label:<28} median {statistics.median(ms):7.1f} ms   "
        f"min {ms[0]:7.1f}   max {ms[-1]:7.1f}   (n={len(ms)})"
    )


KEPT = "rosterd (KV kept)"
NOT_KEPT = "rosterd (keep_kv: false)"
ROUTER = "llama.cpp router"


def swap_round_trip(args: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    models = MODELS[: args.models]
    kept, kept_url = start_rosterd(work, "swap", models, 0.6, [])  # default flags
    not_kept, not_kept_url = start_rosterd(work, "swap-no-kv", models, 0.6, [], keep_kv=False)
    router, router_url = start_llama_router(work)
    times: dict[str, list[float]] = {KEPT: [], NOT_KEPT: [], ROUTER: []}
    try:
        with httpx.Client(timeout=120, trust_env=False) as client:
            ids = llama_model_ids(client, router_url)
            own = {m: m for m in models}
            urls = {KEPT: (kept_url, own), NOT_KEPT: (not_kept_url, own), ROUTER: (router_url, ids)}
            for url, names in urls.values():  # each starts with x resident
                complete(client, url, names[MODELS[0]])
            time.sleep(args.idle)
            for _ in range(args.rounds):
                for model in (*models[1:], models[0]):
                    for label, (url, names) in urls.items():
                        times[label].append(complete(client, url, names[model]))
                    if args.verbose:
                        said = ", ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in times.items())
                        print(f"  {model}: {said}")
                    time.sleep(args.idle)
    finally:
        for proc in (kept, not_kept):
            proc.send_signal(signal.SIGINT)
        router.terminate()
        for proc in (kept, not_kept):
            proc.wait(60)
        router.wait(30)
    return times


def served_after_wedge(url: str, model: str, pid: int, give_up_s: float) -> float | None:
    """SIGSTOP ``pid``, then request ``model`` until one is served; seconds from the SIGSTOP
    to that answer, or ``None`` if none was within ``give_up_s``. SIGCONT after."""
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        with httpx.Client(trust_env=False) as client:
            while (left := give_up_s - (time.monotonic() - began)) > 0:
                client.timeout = httpx.Timeout(max(0.1, left))
                with contextlib.suppress(httpx.HTTPError, RuntimeError):
                    complete(client, url, model)
                    return time.monotonic() - began
                time.sleep(0.05)
        return None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def rosterd_wedge(work: Path) -> float | None:
    flags = ["--probe-interval", "1", "--probe-timeout", "1", "--first-byte-timeout", "2"]
    proc, url = start_rosterd(work, "wedge", MODELS[:1], 2.0, flags)
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            complete(client, url, MODELS[0])
            pid = client.get(url + "/status").json()["nodes"]["box"]["roles"][MODELS[0]]["pid"]
        return served_after_wedge(url, MODELS[0], int(pid), 60.0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def llama_router_wedge(work: Path, give_up_s: float) -> float | None:
    proc, url = start_llama_router(work)
    children: list[psutil.Process] = []
    try:
        with httpx.Client(timeout=60, trust_env=False) as client:
            model = llama_model_ids(client, url)[MODELS[0]]
            complete(client, url, model)
        children = psutil.Process(proc.pid).children(recursive=True)
        return served_after_wedge(url, model, children[0].pid, give_up_s)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rotations over the models")
    parser.add_argument(
        "--models", type=int, choices=(2, 3), default=2, help="how many models to alternate"
    )
    parser.add_argument(
        "--idle", type=float, default=2.0, help="seconds idle after each step of the swap"
    )
    parser.add_argument("--no-wedge", action="store_true", help="measure only the swap")
    parser.add_argument(
        "--llama-wedge-wait", type=float, default=20.0, help="seconds to wait on llama.cpp"
    )
    parser.add_argument("--verbose", action="store_true", help="print every request's time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rosterd-swap-bench-") as tmp:
        work = Path(tmp)
        (work / "models").mkdir()
        for seed, name in enumerate(MODELS):
            write_tiny_gguf(work / "models" / f"{name}.gguf", seed + 11)
        times = swap_round_trip(args, work)
        print("request that forces a swap of two idle roles (stop + load + 1 token):")
        for label, seconds in times.items():
            print("  " + summary(label, seconds))
        router = statistics.median(times[ROUTER])
        for label in (KEPT, NOT_KEPT):
            ratio = statistics.median(times[label]) / router
            print(f"  {label} / {ROUTER} (medians): {ratio:.2f}x")
        if args.no_wedge:
            return 0
        wedge = rosterd_wedge(work)
        llama = llama_router_wedge(work, args.llama_wedge_wait)
        print("time from SIGSTOP of the backend to the first request served again:")
        print(f"  rosterd (probe 1 s, first byte 2 s)   {_secs(wedge)}")
        print(f"  llama.cpp router                      {_secs(llama, args.llama_wedge_wait)}")
    return 0


def _secs(value: float | None, gave_up_s: float = 60.0) -> str:
    return f"{value:.2f} s" if value is not None else f"not served within {gave_up_s:g} s"


if __name__ == "__main__":
    sys.exit(main())
