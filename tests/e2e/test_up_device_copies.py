"""``rosterd up`` with ``replicas: 2`` on one node declaring two GPUs (issue 29, item 5): one
copy per device, each its own llama-server process launched with its own ``--device`` pin
(``chat`` on ``CUDA0``, its further copy ``chat~2`` on ``CUDA1``), requests reaching both,
and a SIGKILL of one copy's pid failing no request (the other copy serves them).

This machine has no GPU: the devices are declared, so ``up`` warns that no probe sees them.
The ``llama-server`` that ``up`` runs is a wrapper standing in for a CUDA build
(``support.devices.cuda_stand_in``): it logs the argv rosterd built and runs the real
llama-server with ``--device none``, so the test checks rosterd's placement, argv and
routing, not llama-server's behaviour on a GPU. The run is stopped by its handle.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.backends import pick_free_port
from support.devices import chat, cuda_stand_in, gpu_box_fleet, tiny_llama_entry, tiny_model
from support.up import prepare_example_models, rosterd_text, start_up, write_roster

pytestmark = pytest.mark.slow


def ask(url: str, prompt: str) -> int:
    return chat(url, "chat", prompt, max_tokens=2).status_code


def copy_requests(url: str) -> dict[str, float]:
    """Copy key -> requests sent to it (``rosterd_copy_requests_total``)."""
    text = httpx.get(url + "/metrics", timeout=30, trust_env=False).text
    found = re.findall(r'rosterd_copy_requests_total\{node="([^"]+)",role="chat"\} (\S+)', text)
    return {key: float(value) for key, value in found}


def test_replicas_2_on_two_declared_gpus_run_one_pinned_copy_per_device_and_fail_over(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    argv_log = tmp_path / "argv.log"
    two_gpus = (
        "Available devices:\n"
        "  CUDA0: Stand-in GPU (24576 MiB, 24576 MiB free)\n"
        "  CUDA1: Stand-in GPU (24576 MiB, 24576 MiB free)\n"
    )
    binary = cuda_stand_in(tmp_path, llama_server_binary, argv_log, listing=two_gpus)
    # The roster gives the role a port, as labs' rosters do: both copies take it from the
    # role's entry, so the second to start must listen on another.
    roster_port = pick_free_port()
    entry = tiny_llama_entry("chat", "chat") | {"port": roster_port}
    roster = write_roster(tmp_path / "roster.yaml", [entry])
    source = tiny_model("tiny-a", replicas=2, grace_s=2, extra_args=["-t", "1"])
    fleet = gpu_box_fleet(tmp_path / "fleet.yaml", {"chat": source}, 0.8, 0.8)
    up = start_up(
        [str(roster), "--fleet", str(fleet)],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(binary)},
        auto_backend_ports=False,
    )
    try:
        statuses = [ask(up.url, f"Prompt number {i} about {i * 7}") for i in range(16)]
        roles: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            roles = up.get("/status")["nodes"]["box"]["roles"]
            if all(roles.get(u, {}).get("phase") == "ready" for u in ("chat", "chat~2")):
                break
            statuses.append(ask(up.url, f"Warm {time.monotonic()}"))
        status = up.get("/status")
        sent = copy_requests(up.url)
        models = httpx.get(up.url + "/v1/models", timeout=30, trust_env=False).json()
        unknown = httpx.post(
            up.url + "/v1/chat/completions",
            json={"model": "chat~2", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
            trust_env=False,
        ).status_code
        ps = rosterd_text("ps", "--url", up.url)
        killed = roles["chat~2"]["pid"]
        os.kill(killed, signal.SIGKILL)
        after = [ask(up.url, f"After the kill {i}") for i in range(8)]
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert set(statuses) == {200}, up.output()
    assert "not loaded at start" not in up.output()  # the warm-up loads chat, both copies
    assert set(after) == {200}, up.output()
    assert roles["chat"]["pid"] != roles["chat~2"]["pid"], "two copies, two processes"
    ports = {int(roles[unit]["base_url"].rsplit(":", 1)[1]) for unit in ("chat", "chat~2")}
    assert len(ports) == 2, ports
    assert roster_port in ports, ports  # one copy keeps the roster's port, the other a free one
    pools = status["nodes"]["box"]["pools"]
    assert list(pools["CUDA0"]["roles"]) == ["chat"]
    assert list(pools["CUDA1"]["roles"]) == ["chat~2"]
    assert status["replicas"] == {"chat": ["box (CUDA0)", "box (CUDA1)"]}
    assert roles["chat"]["copies"] == ["box (CUDA0)", "box (CUDA1)"]
    assert sent.get("box", 0) > 0, sent
    assert sent.get("box/chat~2", 0) > 0, sent
    assert [m["id"] for m in models["data"]].count("chat") == 1
    assert "chat~2" not in [m["id"] for m in models["data"]]
    assert unknown == 404
    assert "one of 2 copies, on box (CUDA0), box (CUDA1)" in " ".join(ps.split()), ps
    launches = [line for line in argv_log.read_text().splitlines() if " -m " in f" {line}"]
    pins = {("CUDA0" if "--device CUDA0 " in line else "CUDA1") for line in launches}
    assert pins == {"CUDA0", "CUDA1"}, launches
    for line in launches:
        assert re.search(r"--device CUDA[01] -ngl 999 --fit off", line), line
    logs = sorted(p.name for p in (tmp_path / "state" / "logs").glob("chat*.log"))
    assert logs == ["chat@box.log", "chat~2@box.log"], logs
