"""``llama-server --list-devices`` as recorded from llama.cpp's issues and docs (each file
names its source), read by rosterd.devices.listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rosterd.devices.listing import ListedDevice, parse_list_devices

DATA = Path(__file__).resolve().parents[1] / "data" / "list_devices"
MiB = 1 << 20


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_every_recorded_text_output_names_its_source() -> None:
    for path in DATA.glob("*.txt"):
        assert path.read_text(encoding="utf-8").startswith("# source:"), path.name


def test_cuda_one_gpu_free_above_total_is_capped_at_the_total() -> None:
    # llama.cpp#17536: a discrete GPU misread as unified memory lists the host's free RAM.
    assert parse_list_devices(_read("cuda_one_gpu_uma_misread.txt")) == (
        ListedDevice("CUDA0", "NVIDIA GeForce RTX 5090", 32106 * MiB, 32106 * MiB),
    )


def test_cuda_two_gpus_in_order_with_log_lines_around_the_block() -> None:
    devices = parse_list_devices(_read("cuda_two_gpus.txt"))
    assert [(d.id, d.total_bytes, d.free_bytes) for d in devices] == [
        ("CUDA0", 11909 * MiB, 11650 * MiB),
        ("CUDA1", 24026 * MiB, 23795 * MiB),
    ]
    assert devices[1].description == "NVIDIA RTX PRO 4000 Blackwell SFF Edition"
    assert {d.kind for d in devices} == {"CUDA"}


def test_rpc_devices_are_another_machines_memory_and_left_out() -> None:
    devices = parse_list_devices(_read("cuda_two_gpus_rpc.txt"))
    assert [d.id for d in devices] == ["CUDA0", "CUDA1"]


def test_rocm_one_gpu() -> None:
    (device,) = parse_list_devices(_read("rocm_one_gpu.txt"))
    assert (device.id, device.kind, device.description) == (
        "ROCm0",
        "ROCm",
        "AMD Radeon Graphics",
    )
    assert device.total_bytes == 120000 * MiB
    assert device.free_bytes == device.total_bytes


def test_metal_lists_the_gpu_and_not_the_blas_device_without_memory() -> None:
    assert parse_list_devices(_read("metal_m4_max.txt")) == (
        ListedDevice("Metal", "Apple M4 Max", 98304 * MiB, 98303 * MiB),
    )


def test_vulkan_one_gpu() -> None:
    assert parse_list_devices(_read("vulkan_one_gpu.txt")) == (
        ListedDevice("Vulkan0", "NVIDIA GeForce RTX 2060", 6144 * MiB, 5136 * MiB),
    )


@pytest.mark.parametrize("name", ["cpu_only_no_metal.txt", "cpu_only_this_build.txt"])
def test_a_cpu_only_build_lists_no_device(name: str) -> None:
    assert parse_list_devices(_read(name)) == ()


def test_a_description_with_parentheses_keeps_them() -> None:
    text = (
        "Available devices:\n"
        "  Vulkan1: llvmpipe (LLVM 17.0.6, 256 bits) (32000 MiB, 31000 MiB free)\n"
    )
    (device,) = parse_list_devices(text)
    assert device.description == "llvmpipe (LLVM 17.0.6, 256 bits)"


def test_the_json_form_gives_bytes_as_listed() -> None:
    devices = parse_list_devices(_read("cuda_two_gpus.json"))
    assert [(d.id, d.total_bytes, d.free_bytes) for d in devices] == [
        ("CUDA0", 33670758400, 33124450304),
        ("CUDA1", 33661911040, 33040105472),
    ]


def test_the_json_form_leaves_out_cpu_and_malformed_entries() -> None:
    text = json.dumps(
        {
            "devices": [
                {"name": "CPU", "type": "CPU", "memory_total": 8 << 30, "memory_free": 1},
                {"name": "CUDA0", "memory_total": "many"},
                {"name": "CUDA1", "type": "GPU", "memory_total": 1 << 30, "memory_free": 1 << 29},
            ]
        }
    )
    assert [d.id for d in parse_list_devices(text)] == ["CUDA1"]
    assert parse_list_devices("{not json") == ()


def test_text_without_the_block_lists_nothing() -> None:
    assert parse_list_devices("  CUDA0: NVIDIA (100 MiB, 50 MiB free)\n") == ()
