"""``rosterd up`` on a fleet declaring a small GPU (issue 29: a GPU's memory is a budget of
its own): two llama.cpp roles that each need most of the device swap on it, one resident at
a time, though host RAM holds both; each is launched pinned (``--device CUDA0 -ngl 999
--fit off``); ``/status``, ``/metrics`` and ``rosterd ps`` show the device's pool.

This machine has no GPU: the device is declared, so ``up`` warns once that no probe sees
it. The ``llama-server`` that ``up`` runs is a wrapper standing in for a CUDA build: it
logs the argv rosterd built and runs the real llama-server with ``--device none`` (a
CPU-only build refuses a device it does not list), so the test checks rosterd's argv and
residency, not llama-server's behaviour on a GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from support.devices import chat, cuda_stand_in, gpu_box_fleet, tiny_llama_entry, tiny_model
from support.up import prepare_example_models, rosterd_text, start_up, write_roster

GIB = 2**30

pytestmark = pytest.mark.slow


#: Two roles of the example's two tiny models.
TWO_ROLES = [tiny_llama_entry("x", "tiny-a"), tiny_llama_entry("y", "tiny-b")]
TWO_MODELS = {"tiny-a": tiny_model("tiny-a"), "tiny-b": tiny_model("tiny-b")}


def ask(url: str, model: str) -> None:
    answer = chat(url, model)
    assert answer.status_code == 200, answer.text


def test_a_second_role_on_a_full_gpu_evicts_the_first_and_both_run_pinned(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    argv_log = tmp_path / "argv.log"
    binary = cuda_stand_in(tmp_path, llama_server_binary, argv_log)
    roster = write_roster(tmp_path / "roster.yaml", TWO_ROLES)
    fleet = gpu_box_fleet(tmp_path / "fleet.yaml", TWO_MODELS, 0.8)
    up = start_up(
        [str(roster), "--fleet", str(fleet), "--min-busy-residency", "0"],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(binary)},
    )
    try:
        ask(up.url, "tiny-a")
        ask(up.url, "tiny-b")
        status = up.get("/status")
        roles = status["nodes"]["box"]["roles"]
        resident = sorted(r for r, info in roles.items() if info["phase"] != "stopped")
        events = up.get("/rosterd/events")["events"]
        metrics = httpx.get(up.url + "/metrics", timeout=30, trust_env=False).text
        ps = rosterd_text("ps", "--url", up.url)
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert resident == ["y"], json.dumps(status)
    gpu = status["nodes"]["box"]["pools"]["CUDA0"]
    assert gpu["declared_bytes"] == gpu["capacity_bytes"] == int(0.8 * GIB)
    assert gpu["probed_total_bytes"] == 24 * GIB  # as the stand-in build lists it
    assert sorted(gpu["roles"]) == ["x", "y"]
    assert gpu["resident_bytes"] == gpu["roles"]["y"]
    gauges = dict(
        line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("rosterd_pool_")
    )
    cuda = 'rosterd_pool_capacity_bytes{device="CUDA0",node="box"}'
    assert float(gauges[cuda]) == gpu["capacity_bytes"], gauges
    assert 'rosterd_pool_resident_bytes{device="host",node="box"}' in gauges
    assert "CUDA0: " in ps, ps
    assert "declared 0.80 GiB; probed 24.00 GiB" in ps, ps
    stopped = [e for e in events if e.get("kind") == "stopped" and e.get("role") == "x"]
    assert stopped, events
    assert "no probe sees it" not in up.output(), up.output()
    launches = [line for line in argv_log.read_text().splitlines() if " -m " in f" {line}"]
    assert len(launches) == 2, launches
    for line in launches:
        assert "--device CUDA0 -ngl 999 --fit off" in line, line


def test_a_reload_that_declares_a_smaller_gpu_evicts_at_once_and_says_why(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    binary = cuda_stand_in(tmp_path, llama_server_binary, tmp_path / "argv.log")
    roster = write_roster(tmp_path / "roster.yaml", TWO_ROLES)
    fleet = gpu_box_fleet(tmp_path / "fleet.yaml", TWO_MODELS, 1.6)  # both fit together
    up = start_up(
        [str(roster), "--fleet", str(fleet), "--min-busy-residency", "0"],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(binary)},
    )
    try:
        ask(up.url, "tiny-a")
        ask(up.url, "tiny-b")
        before = up.get("/status")["nodes"]["box"]["roles"]
        gpu_box_fleet(fleet, TWO_MODELS, 0.8)  # one of them only
        reloaded = rosterd_text("reload", "--url", up.url, timeout_s=120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            roles = up.get("/status")["nodes"]["box"]["roles"]
            resident = sorted(r for r, info in roles.items() if info["phase"] != "stopped")
            if len(resident) == 1:
                break
            time.sleep(0.2)
        gpu = up.get("/status")["nodes"]["box"]["pools"]["CUDA0"]
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert sorted(r for r, info in before.items() if info["phase"] == "ready") == ["x", "y"]
    assert resident == ["y"], up.output()  # x, the least recently used, left at once
    assert gpu["capacity_bytes"] == int(0.8 * GIB)
    assert gpu["resident_bytes"] <= gpu["capacity_bytes"]
    said = up.output()
    assert "device CUDA0: capacity is now 0.80 GiB" in said, said
    assert "stopping x" in said, said
    assert "device CUDA0's capacity is now 0.80 GiB" in said, said
    assert "reloaded: node box: device CUDA0 capacity 1.60 -> 0.80 GiB" in said, said
    assert "node box: device CUDA0 capacity 1.60 -> 0.80 GiB" in reloaded, reloaded


def test_a_declared_gpu_this_machines_llama_server_lacks_still_serves_on_the_cpu(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    """A fleet written for a GPU machine, run where llama-server lists no such device (this
    machine's build lists none): the role placed on the GPU runs on the CPU (``--device
    none``), counted on the device as declared, and one warning says so; before, every
    load failed on llama-server's ``invalid device: CUDA0``."""
    prepare_example_models()
    roster = write_roster(tmp_path / "roster.yaml", TWO_ROLES[:1])
    fleet = gpu_box_fleet(tmp_path / "fleet.yaml", {"tiny-a": tiny_model("tiny-a")}, 0.8)
    up = start_up(
        [str(roster), "--fleet", str(fleet)],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(llama_server_binary)},
    )
    try:
        ask(up.url, "tiny-a")
        gpu = up.get("/status")["nodes"]["box"]["pools"]["CUDA0"]
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert sorted(gpu["roles"]) == ["x"]  # counted on the device it was placed on
    said = up.output()
    warning = (
        "node box: device CUDA0 is declared in the fleet file but no probe sees it "
        "(llama-server --list-devices, NVML); it is used as declared; the node's "
        "llama-server lists no such device, so the roles placed on it run on the CPU "
        "(--device none)"
    )
    assert said.count(warning) == 1, said
    assert "invalid device" not in said, said
