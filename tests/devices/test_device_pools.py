"""Devices declared in the fleet file, and a node's pools from what is declared and what
the probes (llama-server's listing, NVML through a stand-in) found."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from rosterd.devices.listing import parse_list_devices
from rosterd.devices.nvml import NvmlDevice
from rosterd.devices.pools import HOST, node_pools, with_counted_devices
from rosterd.errors import FleetError
from rosterd.fleet.model import DeviceSpec
from rosterd.fleet.reader import parse_fleet

GiB = 1 << 30
MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data" / "list_devices"

GPU_BOX = """
nodes:
  - name: box
    memory_gb: 128
    reserved_gb: 8
    platform: linux-x86_64
    devices:
      - {id: CUDA0, memory_gb: 24, reserved_gb: 1}
      - {id: CUDA1, memory_gb: 24}
models:
  big: {path: /m/big.gguf, offload: partial}
"""

MAC = """
nodes:
  - name: studio
    memory_gb: 128
    platform: macos-arm64
    devices:
      - {id: MTL0, gpu_share: 0.75}
"""


def test_a_gpu_box_declares_its_devices_each_with_memory_and_reserve() -> None:
    fleet = parse_fleet(GPU_BOX)
    node = fleet.node("box")
    assert node.devices == (
        DeviceSpec("CUDA0", 24 * GiB, 1 * GiB),
        DeviceSpec("CUDA1", 24 * GiB, 0),
    )
    assert node.devices[0].capacity_bytes == 23 * GiB
    assert node.capacity_bytes == 120 * GiB  # host RAM as before
    assert fleet.models["big"].offload == "partial"


def test_a_mac_declares_its_gpu_share_as_a_fraction_or_in_gib() -> None:
    (share,) = parse_fleet(MAC).node("studio").devices
    assert share == DeviceSpec("MTL0", 96 * GiB, 0, gpu_share=True)
    gb = parse_fleet(MAC.replace("gpu_share: 0.75", "gpu_share_gb: 107.5"))
    assert gb.node("studio").devices[0].memory_bytes == round(107.5 * GiB)


def test_a_fleet_without_devices_reads_as_before() -> None:
    fleet = parse_fleet("nodes: [{name: a, memory_gb: 16, platform: linux-x86_64}]")
    assert fleet.nodes[0].devices == ()
    pools = node_pools(fleet.nodes[0], probed=False)
    assert [(p.id, p.capacity_bytes) for p in pools.pools] == [
        (HOST, fleet.nodes[0].capacity_bytes)
    ]


BAD_DEVICES = [
    ("devices: [{memory_gb: 24}]", "nodes[0].devices[0].id", "missing required key 'id'"),
    ("devices: [{id: 'CUDA 0', memory_gb: 24}]", "nodes[0].devices[0].id", "device name"),
    ("devices: [{id: CUDA0}]", "nodes[0].devices[0].memory_gb", "missing required key 'memory_gb'"),
    ("devices: [{id: CUDA0, memory_gb: 0}]", "nodes[0].devices[0].memory_gb", "> 0"),
    (
        "devices: [{id: CUDA0, memory_gb: 24, reserved_gb: 24}]",
        "nodes[0].devices[0].reserved_gb",
        "no capacity",
    ),
    (
        "devices: [{id: CUDA0, memory_gb: 8}, {id: CUDA0, memory_gb: 8}]",
        "nodes[0].devices[1].id",
        "duplicate device 'CUDA0'",
    ),
    (
        "devices: [{id: CUDA0, memory_gb: 8, vram_gb: 8}]",
        "nodes[0].devices[0].vram_gb",
        "unknown key 'vram_gb'",
    ),
    (
        "devices: [{id: CUDA0, gpu_share: 0.5}]",
        "nodes[0].devices[0].gpu_share",
        "share of a Mac's unified memory",
    ),
    ("devices: {id: CUDA0}", "nodes[0].devices", "a list of devices"),
]


@pytest.mark.parametrize(("yaml_devices", "path", "words"), BAD_DEVICES)
def test_a_wrong_device_names_file_field_line_and_column(
    yaml_devices: str, path: str, words: str
) -> None:
    text = (
        "nodes:\n  - name: box\n    memory_gb: 64\n    platform: linux-x86_64\n"
        f"    {yaml_devices}\n"
    )
    with pytest.raises(FleetError) as info:
        parse_fleet(text, file="fleet.yaml")
    err = info.value
    assert (err.file, err.path) == ("fleet.yaml", path)
    assert err.line == 5, str(err)
    assert err.column is not None
    assert err.column > 4
    assert words in str(err)


BAD_MAC = [
    ("{id: MTL0, memory_gb: 96}", "nodes[0].devices[0].memory_gb", "shares the node's memory"),
    ("{id: MTL0}", "nodes[0].devices[0].gpu_share", "missing the GPU's share"),
    ("{id: MTL0, gpu_share: 1.5}", "nodes[0].devices[0].gpu_share", "at most 1"),
    ("{id: MTL0, gpu_share_gb: 200}", "nodes[0].devices[0].gpu_share_gb", "more than the node's"),
    ("{id: MTL0, gpu_share_gb: 9, gpu_share: 0.5}", "nodes[0].devices[0].gpu_share", "not both"),
]


@pytest.mark.parametrize(("device", "path", "words"), BAD_MAC)
def test_a_wrong_mac_gpu_share_is_refused(device: str, path: str, words: str) -> None:
    text = (
        "nodes:\n  - name: m\n    memory_gb: 128\n    platform: macos-arm64\n"
        f"    devices: [{device}]\n"
    )
    with pytest.raises(FleetError) as info:
        parse_fleet(text, file="fleet.yaml")
    assert info.value.path == path
    assert info.value.line == 5
    assert words in str(info.value)


def test_offload_is_full_or_partial() -> None:
    text = (
        "nodes: [{name: a, memory_gb: 8, platform: linux-x86_64}]\n"
        "models:\n  m: {path: /m.gguf, offload: most}\n"
    )
    with pytest.raises(FleetError) as info:
        parse_fleet(text, file="fleet.yaml")
    assert info.value.path == "models.m.offload"
    assert (info.value.line, info.value.column) == (3, 31)
    assert "full, partial" in str(info.value)


def test_a_declared_device_no_probe_sees_is_used_as_declared_with_one_warning() -> None:
    node = parse_fleet(GPU_BOX).node("box")
    pools = node_pools(node, listed=(), nvml=())
    assert [(p.id, p.capacity_bytes, p.source) for p in pools.pools] == [
        (HOST, 120 * GiB, "host"),
        ("CUDA0", 23 * GiB, "declared"),
        ("CUDA1", 24 * GiB, "declared"),
    ]
    assert len(pools.warnings) == 2
    assert "device CUDA0 is declared" in pools.warnings[0]
    assert "used as declared" in pools.warnings[0]
    # Planning from the fleet file alone runs no probe: nothing to warn about.
    assert node_pools(node, probed=False).warnings == ()


def test_memory_other_processes_hold_lowers_what_rosterd_may_use() -> None:
    node = parse_fleet(GPU_BOX).node("box")
    listed = parse_list_devices(
        "Available devices:\n"
        "  CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB, 20468 MiB free)\n"
        "  CUDA1: NVIDIA GeForce RTX 4090 (24564 MiB, 24564 MiB free)\n"
    )
    pools = node_pools(node, listed)
    cuda0 = pools.pools[1]
    assert cuda0.others_bytes == 4096 * MiB
    assert cuda0.capacity_bytes == 24 * GiB - 1 * GiB - 4 * GiB
    assert (cuda0.probed_total_bytes, cuda0.source) == (24564 * MiB, "declared, probed")
    assert pools.warnings == ()


def test_nvml_tells_rosterds_own_backends_from_other_processes() -> None:
    node = parse_fleet(GPU_BOX).node("box")
    gpu = NvmlDevice(
        index=0,
        name="NVIDIA GeForce RTX 4090",
        pci_bus_id="0:1:0.0",
        total_bytes=24 * GiB,
        free_bytes=14 * GiB,
        used_bytes=10 * GiB,
        processes={100: 8 * GiB, 200: 2 * GiB},
    )
    pools = node_pools(node, nvml=[gpu], own_pids=frozenset({100}))
    assert pools.pools[1].others_bytes == 2 * GiB
    assert pools.pools[1].capacity_bytes == 21 * GiB


def test_a_probed_device_not_declared_is_a_pool_of_its_listed_size() -> None:
    node = parse_fleet("nodes: [{name: a, memory_gb: 64, platform: linux-x86_64}]").nodes[0]
    listed = parse_list_devices((DATA / "cuda_two_gpus.txt").read_text(encoding="utf-8"))
    pools = node_pools(node, listed)
    assert [(p.id, p.source, p.capacity_bytes) for p in pools.devices()] == [
        ("CUDA0", "probed", 11650 * MiB),
        ("CUDA1", "probed", 23795 * MiB),
    ]
    counted = with_counted_devices(node, pools)
    assert [(d.id, d.capacity_bytes) for d in counted.devices] == [
        ("CUDA0", 11650 * MiB),
        ("CUDA1", 23795 * MiB),
    ]


def test_a_macs_gpu_share_subtracts_nothing_for_other_processes() -> None:
    node = parse_fleet(MAC).node("studio")
    listed = parse_list_devices((DATA / "metal_m4_max.txt").read_text(encoding="utf-8"))
    # The recorded Mac lists its GPU as `Metal` (older builds), the fleet declares `MTL0`
    # (newer builds' name): the same GPU, one pool, the declared share.
    pools = node_pools(node, listed)
    assert [(p.id, p.kind, p.capacity_bytes) for p in pools.devices()] == [
        ("MTL0", "gpu-share", 96 * GiB)
    ]
    assert pools.warnings == ()
    same = node_pools(
        node,
        parse_list_devices(
            "Available devices:\n  MTL0: Apple M4 Max (98304 MiB, 50000 MiB free)\n"
        ),
    )
    assert same.pools[1].others_bytes == 0
    assert same.pools[1].capacity_bytes == 96 * GiB


def _fleet_schema() -> dict[str, object]:
    path = Path(__file__).resolve().parents[2] / "src" / "rosterd" / "schemas" / "fleet.schema.json"
    loaded: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def test_the_fleet_schema_takes_declared_devices_and_offload() -> None:
    validator = jsonschema.Draft7Validator(_fleet_schema())
    for text in (GPU_BOX, MAC):
        assert list(validator.iter_errors(yaml.safe_load(text))) == []
    bad = yaml.safe_load(GPU_BOX.replace("reserved_gb: 1}", "reserved_gb: 1, vram: 2}"))
    assert list(validator.iter_errors(bad)) != []


def test_a_declared_device_the_nodes_llama_server_does_not_list_is_run_on_the_cpu() -> None:
    # A fleet written for a GPU box, probed where llama-server lists no device (a CPU-only
    # build, recorded here): its --device would refuse CUDA0, so the pools say the device
    # is unlisted, and a warning says its roles run on the CPU.
    node = parse_fleet(GPU_BOX).node("box")
    cpu_only = parse_list_devices((DATA / "cpu_only_this_build.txt").read_text())
    pools = node_pools(node, cpu_only, listing_ran=True)
    assert pools.unlisted == ("CUDA0", "CUDA1")
    assert not pools.lists("cuda0")
    assert not pools.lists("CUDA1")
    assert all(w.endswith("run on the CPU (--device none)") for w in pools.warnings)
    # NVML sees CUDA0 (a driver) but this llama-server is no CUDA build: still unlisted, and
    # the warning says only that.
    gpu = NvmlDevice(0, "RTX", "00:01.0", 24 * GiB, 24 * GiB, 0)
    seen = node_pools(node, cpu_only, [gpu], listing_ran=True)
    assert seen.unlisted == ("CUDA0", "CUDA1")
    assert seen.warnings[0] == (
        "node box: device CUDA0; the node's llama-server lists no such device, so the roles "
        "placed on it run on the CPU (--device none)"
    )
    # Where no listing ran (no llama-server found, or plan time), nothing is unlisted.
    assert node_pools(node, (), [gpu]).unlisted == ()
    assert node_pools(node, probed=False).lists("CUDA0")
    # A CUDA build lists both: pinned to them as declared.
    listed = parse_list_devices((DATA / "cuda_two_gpus.txt").read_text())
    assert node_pools(node, listed, listing_ran=True).unlisted == ()
    # A misspelt id on a CUDA build: the warning names what the build does list.
    misspelt = parse_fleet(GPU_BOX.replace("id: CUDA1", "id: GPU-1")).node("box")
    told = node_pools(misspelt, listed, listing_ran=True)
    assert told.unlisted == ("GPU-1",)
    (warning,) = told.warnings
    assert "device GPU-1 is declared in the fleet file but no probe sees it" in warning
    assert "lists no such device (it lists CUDA0, CUDA1), so the roles" in warning
