"""Memory by device on a real NVIDIA GPU: pools, pins, the per-device estimate and eviction.

Usage, in one call on a CUDA machine (nvcc, CMake, ninja and nvidia-ml-py installed; no
network needed)::

    python bench/gpu_bench.py --src llama-src.tar.gz [--work DIR] [--budget-gb 4]
        [--cuda-arch 90] [--jobs 16]

and, once, where the pip cache or the network has the llama-cpp-python sdist that
``scripts/build-llama-server`` builds from, the source to carry there::

    python bench/gpu_bench.py --prepare-src llama-src.tar.gz

(llama.cpp's source from that sdist, without its ``models``, ``docs``, ``benches`` and
``tests`` folders: about 15 MiB compressed.)

Steps, each printed with its figures and PASS or FAIL:

1. **build**: llama-server with ``-DGGML_CUDA=ON`` and the flags ``scripts/build-llama-server``
   uses (static, portable CPU part), for ``--cuda-arch`` only (an H200 is ``90``).
2. **devices**: ``llama-server --list-devices`` and NVML, read by ``rosterd.devices``; the
   node's pools with CUDA0 declared at ``--budget-gb`` (the GPU is far bigger: the budget
   is what makes two roles not fit together).
3. **models**: two random llama GGUFs of about 0.6 x the budget each
   (``scripts/make_tiny_gguf.py``), so one fits the budget and two do not.
4. **plan**: both batch roles on CUDA0, swapped one at a time (``place_on_devices``).
5. **pinned**: role A launched with the pins the plan gives (``--device CUDA0 -ngl 999
   --fit off``); NVML's bytes for its process against the estimate's device part (target
   within 10 %), and its process on CUDA0 alone; a CPU-pinned copy (``--device none``)
   holds nothing on the GPU.
6. **evict**: role B asked for: ``decide_by_pool`` evicts A (the device pool lacks room)
   instead of letting B load beside it; B then runs with every layer on the GPU (its log
   says so) and its tokens per second are measured.
7. **router mode**: llama-server's own router (``--models-dir``) on the same GPU and models
   with ``--fit on`` and ``--fit-target`` set so it too has only the budget: A then B
   asked for; B's tokens per second and the layers it offloaded, for comparison (llama.cpp
   fits B beside A by spilling layers to the CPU).

Exit status 1 when a check fails. Nothing here runs on a machine without an NVIDIA GPU:
step 2 says so and the script stops.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx

from rosterd.adapters.llamacpp import LlamaCppAdapter, help_lists_fit, pinned_args
from rosterd.devices.listing import parse_list_devices
from rosterd.devices.nvml import NvmlDevice, read_nvml
from rosterd.devices.pools import node_pools
from rosterd.fleet import Fleet, Node, Platform
from rosterd.fleet.model import DeviceSpec
from rosterd.memory.split import ALL_LAYERS, PoolEstimate
from rosterd.model_facts.reader import read_model_facts
from rosterd.placement import plan
from rosterd.placement.device_need import DeviceNeed
from rosterd.placement.devices import place_on_devices
from rosterd.residency import Load, NodeState, decide_by_pool
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.supervisor import Supervisor
from rosterd.tokens import GB
from rosterd.weights import ResolvedWeights

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # as scripts/build-llama-server pins it
CTX = 4096
PROMPT = "Write a long story about a lighthouse keeper and a storm at sea. " * 8
TRIMMED = ("models", "docs", "benches", "tests", ".github", "media", "gguf-py/tests")


@dataclass
class Checks:
    """PASS/FAIL lines as they come; ``failed`` once any check failed."""

    failed: bool = False

    def check(self, ok: bool, what: str) -> None:
        self.failed |= not ok
        print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)


def prepare_src(out: Path) -> None:
    """Write the trimmed llama.cpp source of the pinned sdist to ``out`` (a .tar.gz)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                tmp,
            ],
            check=True,
        )
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        src = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
        for name in TRIMMED:
            shutil.rmtree(src / name, ignore_errors=True)
        with tarfile.open(out, "w:gz") as archive:
            archive.add(src, arcname="llama.cpp")
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


def build(src_tar: Path, work: Path, arch: str, jobs: int) -> Path:
    """llama-server built with CUDA from ``src_tar``; returns the binary."""
    with tarfile.open(src_tar) as archive:
        archive.extractall(work, filter="data")
    src, out = work / "llama.cpp", work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DGGML_NATIVE=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={arch}",
    ]
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), *generator, *flags], check=True)
    subprocess.run(
        ["cmake", "--build", str(out), "--target", "llama-server", "-j", str(jobs)], check=True
    )
    (binary,) = [p for p in out.rglob("llama-server") if p.is_file() and os.access(p, os.X_OK)]
    return binary


def make_models(work: Path, budget_bytes: int) -> tuple[Path, Path]:
    """Two random llama GGUFs of about 0.6 x ``budget_bytes`` of F32 weights each."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_gguf", ROOT / "scripts" / "make_tiny_gguf.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    write_tiny_gguf = cast(Callable[..., Path], module.write_tiny_gguf)
    embd, ff = 1024, 4096
    per_block = (4 * embd * embd + 3 * embd * ff) * 4
    blocks = max(2, int(budget_bytes * 0.6) // per_block)
    paths = (work / "a.gguf", work / "b.gguf")
    for seed, path in enumerate(paths):
        write_tiny_gguf(path, seed=seed, blocks=blocks, embd=embd, heads=16, ff=ff)
    return paths


def process_bytes(pid: int) -> dict[str, int]:
    """CUDA id -> bytes NVML attributes to ``pid`` (only devices where it holds some)."""
    return {gpu.cuda_id: gpu.processes[pid] for gpu in read_nvml().devices if pid in gpu.processes}


async def tokens_per_s(base_url: str, model: str) -> float:
    """llama-server's own generation speed for one 128-token completion."""
    async with httpx.AsyncClient(timeout=600) as client:
        answer = await client.post(
            base_url + "/completion",
            json={"model": model, "prompt": PROMPT, "n_predict": 128, "temperature": 0.0},
        )
        answer.raise_for_status()
        return float(answer.json()["timings"]["predicted_per_second"])


def offloaded(log_text: str) -> str:
    """llama.cpp's ``offloaded N/M layers to GPU`` from a backend's log, or ``?``."""
    found = re.findall(r"offloaded (\d+/\d+) layers to GPU", log_text)
    return found[-1] if found else "?"


@dataclass
class Setup:
    """What the synchronous steps (1-4) give the measured ones (5-7)."""

    checks: Checks
    work: Path
    binary: Path
    node: Node
    budget: int
    fit_flag: bool
    gpus: tuple[NvmlDevice, ...]
    adapter: LlamaCppAdapter
    weights: dict[str, ResolvedWeights]
    splits: dict[str, PoolEstimate]
    specs: list[InferenceSpec]


def setup(args: argparse.Namespace) -> Setup | None:
    """Steps 1-4: build, devices, models, plan; ``None`` without an NVIDIA GPU."""
    checks = Checks()
    work = Path(args.work or tempfile.mkdtemp(prefix="rosterd-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work: {work}")
    if not read_nvml().devices:
        print(f"no NVIDIA GPU here ({read_nvml().unavailable}); this bench needs one")
        return None
    t0 = time.monotonic()
    binary = build(Path(args.src), work, args.cuda_arch, args.jobs)
    print(f"1. build: {binary} in {time.monotonic() - t0:.0f} s")

    listing = subprocess.run(
        [str(binary), "--list-devices"], capture_output=True, text=True, check=False
    )
    listed = parse_list_devices(listing.stdout + listing.stderr)
    reading = read_nvml()
    print(f"2. devices: listed {[(d.id, d.total_bytes // 2**20) for d in listed]} MiB")
    if not reading.devices:
        print(f"   NVML: {reading.unavailable}; this bench needs an NVIDIA GPU")
        return None
    budget = int(args.budget_gb * GB)
    node = Node(
        name="gpu",
        memory_bytes=64 * GB,
        reserved_bytes=8 * GB,
        platform=Platform.LINUX_X86_64,
        flavors=frozenset({InferFlavor.LLAMACPP}),
        devices=(DeviceSpec("CUDA0", budget),),
    )
    pools = node_pools(node, listed, reading.devices, frozenset({os.getpid()}))
    for pool in pools.pools:
        print(f"   pool {pool.id}: capacity {pool.capacity_bytes / GB:.2f} GiB ({pool.source})")
    checks.check(any(d.id == "CUDA0" for d in listed), "llama-server lists CUDA0")
    fit_flag = help_lists_fit(
        subprocess.run([str(binary), "--help"], capture_output=True, text=True).stdout
    )
    checks.check(fit_flag, "this build's --help lists --fit")

    path_a, path_b = make_models(work, budget)
    facts = {name: read_model_facts(p) for name, p in (("a", path_a), ("b", path_b))}
    print(f"3. models: {path_a.stat().st_size / GB:.2f} GiB each, {facts['a'].block_count} layers")

    adapter = LlamaCppAdapter(server_binary=binary)
    weights = {
        name: ResolvedWeights(path=p, ctx_size=CTX, parallel=1)
        for name, p in (("a", path_a), ("b", path_b))
    }
    splits = {
        name: adapter.split_memory(
            f, ctx_size=CTX, parallel=1, extra_args=(), gpu_layers=ALL_LAYERS
        )
        for name, f in facts.items()
    }
    specs = [
        InferenceSpec(
            role=name,
            flavor=InferFlavor.LLAMACPP,
            model=name,
            memory=MemorySpec(weights_bytes=splits[name].host_bytes),
        )
        for name in ("a", "b")
    ]
    needs = {name: DeviceNeed(splits[name].device_bytes) for name in ("a", "b")}
    fleet = Fleet(nodes=(node,))
    device_plan = place_on_devices(specs, fleet, plan(specs, fleet, device_needs=needs), needs)
    cuda0 = device_plan.pools["gpu"]["CUDA0"]
    print(f"4. plan: CUDA0 swaps {cuda0.swappable}, peak {cuda0.peak_bytes / GB:.2f} GiB")
    checks.check(cuda0.swappable == ("a", "b"), "both roles on CUDA0, swapped one at a time")
    return Setup(
        checks,
        work,
        binary,
        node,
        budget,
        fit_flag,
        reading.devices,
        adapter,
        weights,
        splits,
        specs,
    )


async def measure(run: Setup) -> int:
    """Steps 5-7: pinned, evict, router mode."""
    checks, work, binary, node, budget = run.checks, run.work, run.binary, run.node, run.budget
    adapter, weights, splits, specs, fit_flag = (
        run.adapter,
        run.weights,
        run.splits,
        run.specs,
        run.fit_flag,
    )
    state = work / "state"
    sup = Supervisor(state, grace_s=10.0)
    by_id = {s.role: s for s in specs}
    device_specs = {
        s.role: InferenceSpec(
            role=s.role,
            flavor=s.flavor,
            memory=MemorySpec(weights_bytes=splits[s.role].device_bytes),
        )
        for s in specs
    }
    try:
        pins = pinned_args("CUDA0", None, fit_flag=fit_flag)
        launch_a = adapter.launch(
            by_id["a"], weights["a"], host="127.0.0.1", port=free_port(), pins=pins
        )
        backend_a = await sup.start("a", launch_a, ready_timeout_s=600)
        await tokens_per_s(backend_a.base_url, "a")
        held = process_bytes(backend_a.pid)
        estimate = splits["a"].device_bytes
        on_gpu = held.get("CUDA0", 0)
        ratio = estimate / on_gpu if on_gpu else float("inf")
        print(
            f"5. pinned: NVML {on_gpu / 2**20:.0f} MiB for A's process, estimate "
            f"{estimate / 2**20:.0f} MiB (ratio {ratio:.3f})"
        )
        checks.check(abs(ratio - 1) <= 0.10, "estimate within 10 % of NVML's per-process figure")
        checks.check(set(held) == {"CUDA0"}, f"A holds memory on CUDA0 alone ({held})")
        cpu_launch = adapter.launch(
            by_id["b"],
            weights["b"],
            host="127.0.0.1",
            port=free_port(),
            pins=pinned_args(None, None, fit_flag=fit_flag),
        )
        cpu_backend = await sup.start("cpu-b", cpu_launch, ready_timeout_s=600)
        checks.check(
            process_bytes(cpu_backend.pid) == {}, "a CPU-pinned role holds nothing on the GPU"
        )
        await sup.stop("cpu-b")

        host = NodeState(node.capacity_bytes, by_id, frozenset({"a"}), {}, ("a",))
        gpu_pool = NodeState(budget, device_specs, frozenset({"a"}), {}, ("a",))
        decision = decide_by_pool(host, {"CUDA0": gpu_pool}, "b")
        print(f"6. evict: {decision}")
        checks.check(isinstance(decision, Load) and decision.evict == ("a",), "B evicts A")
        await sup.stop("a")
        launch_b = adapter.launch(
            by_id["b"], weights["b"], host="127.0.0.1", port=free_port(), pins=pins
        )
        backend_b = await sup.start("b", launch_b, ready_timeout_s=600)
        speed_b = await tokens_per_s(backend_b.base_url, "b")
        log_b = _log_text(state, "b")
        layers = offloaded(log_b)
        print(f"   B: {speed_b:.1f} tokens/s, offloaded {layers}")
        checks.check(
            layers.split("/")[0] == layers.split("/")[-1], "B runs with every layer on the GPU"
        )
        await sup.stop("b")
    finally:
        await sup.stop_all()

    speed_router, layers_router = await router_mode(binary, work, budget, run.gpus)
    print(
        f"7. router mode (--fit on, same budget): B {speed_router:.1f} tokens/s, offloaded "
        f"{layers_router}; rosterd's B {speed_b:.1f} tokens/s"
    )
    return 1 if checks.failed else 0


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_text(state: Path, name: str) -> str:
    """Everything the supervisor logged for backend ``name`` (``<state>/logs/<name>.log*``)."""
    return "\n".join(
        p.read_text(errors="replace") for p in sorted((state / "logs").glob(f"{name}.log*"))
    )


async def router_mode(
    binary: Path, work: Path, budget: int, gpus: tuple[NvmlDevice, ...]
) -> tuple[float, str]:
    """B's tokens/s and offloaded layers under llama-server's router, A loaded first, with
    ``--fit on`` and a margin that leaves it ``budget`` bytes of CUDA0."""
    models = work / "router-models"
    models.mkdir(exist_ok=True)
    for name in ("a", "b"):
        target = models / f"{name}.gguf"
        if not target.exists():
            target.symlink_to(work / f"{name}.gguf")
    margin_mib = max((gpus[0].free_bytes - budget) // 2**20, 0)
    port = free_port()
    log = work / "router.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            "--models-dir",
            str(models),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(CTX),
            "--fit",
            "on",
            "--fit-target",
            str(margin_mib),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=600) as client:
            for _ in range(600):
                try:
                    if (await client.get(base + "/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(1)
            await tokens_per_s(base, "a")
            speed = await tokens_per_s(base, "b")
        return speed, offloaded(log.read_text(errors="replace"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--prepare-src", type=Path, help="write the trimmed llama.cpp source")
    parser.add_argument("--src", help="the trimmed llama.cpp source (.tar.gz)")
    parser.add_argument("--work", help="working folder (default: a new temporary one)")
    parser.add_argument("--budget-gb", type=float, default=4.0, help="CUDA0's declared GiB")
    parser.add_argument("--cuda-arch", default="90", help="CMAKE_CUDA_ARCHITECTURES")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = parser.parse_args(argv)
    if args.prepare_src is not None:
        prepare_src(args.prepare_src)
        return 0
    if args.src is None:
        parser.error("--src (from --prepare-src) is needed to build llama-server with CUDA")
    prepared = setup(args)
    if prepared is None:
        return 1
    return asyncio.run(measure(prepared))


if __name__ == "__main__":
    sys.exit(main())
