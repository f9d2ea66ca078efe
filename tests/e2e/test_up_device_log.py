"""``rosterd up`` counts what a llama.cpp backend logged allocating on its device as it loaded
(issue 29, item 4): the role pinned to the device runs with ``-lv 4``, ``up`` reads its log's
load lines once it is ready, and where they pass the bytes counted for the role on the device
the pool counts them from then on, with one warning.

This machine has no GPU: the device is declared, and the ``llama-server`` that ``up`` runs is
a wrapper standing in for a CUDA build (``support.devices.logging_gpu_stand_in``): it logs a
CUDA build's load line for the device, then runs the real llama-server on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.devices import chat, gpu_box_fleet, logging_gpu_stand_in, tiny_llama_entry, tiny_model
from support.polling import eventually_sync
from support.up import prepare_example_models, start_up, write_roster

MIB = 2**20

pytestmark = pytest.mark.slow

#: What a CUDA build logs as it loads the model on the device (the form of llama.cpp's
#: ``load_tensors:`` line; the figure is this test's).
LOAD_LINE = "load_tensors:        CUDA0 model buffer size =   700.00 MiB"


def test_a_backends_logged_device_buffers_are_counted_in_the_devices_pool(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    argv_log = tmp_path / "argv.log"
    binary = logging_gpu_stand_in(tmp_path, llama_server_binary, argv_log, LOAD_LINE)
    roster = write_roster(tmp_path / "roster.yaml", [tiny_llama_entry("x", "tiny-a")])
    fleet = gpu_box_fleet(tmp_path / "fleet.yaml", {"tiny-a": tiny_model("tiny-a")}, 2)
    up = start_up(
        [str(roster), "--fleet", str(fleet)],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(binary)},
    )
    try:
        answer = chat(up.url, "tiny-a")
        assert answer.status_code == 200, answer.text
        counted_before = up.get("/status")["nodes"]["box"]["pools"]["CUDA0"]["roles"]["x"]

        def counted() -> bool:
            gpu = up.get("/status")["nodes"]["box"]["pools"]["CUDA0"]
            return bool(gpu["roles"] == {"x": 700 * MIB})

        # the recorder reads every 10 s
        eventually_sync(
            counted, what="CUDA0 counting the logged 700 MiB", timeout_s=30, interval_s=1.0
        )
    finally:
        code = up.stop()
    assert code == 0, up.output()
    assert counted_before < 700 * MIB  # the estimate of the tiny model's device part
    warnings = [line for line in up.output().splitlines() if "on device CUDA0" in line]
    assert len(warnings) == 1, up.output()
    assert "role x holds 700 MiB on device CUDA0" in warnings[0]
    (launch,) = [line for line in argv_log.read_text().splitlines() if " -m " in f" {line}"]
    assert "--device CUDA0 -ngl 999 --fit off -lv 4" in launch, launch
