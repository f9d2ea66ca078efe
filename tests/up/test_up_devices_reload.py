"""A run's devices are found again when a reload's fleet declares others (``RunDevices``):
the probe (llama-server's listing and NVML, stood in for here: this machine has no GPU)
runs at the first plan, not again for the same fleet, and again for a changed one, told
which processes are this run's own backends (their GPU memory is not others')."""

from __future__ import annotations

from pathlib import Path

import pytest

import rosterd.up.devices as run_devices
from rosterd.devices.pools import NodePools, node_pools
from rosterd.errors import AdapterError
from rosterd.fleet import Fleet
from rosterd.fleet.model import Node
from rosterd.fleet.reader import parse_fleet
from rosterd.up.devices import RunDevices

GiB = 1 << 30

FLEET = """
nodes:
  - name: box
    address: 127.0.0.1
    memory_gb: 64
    platform: linux-x86_64
    devices:
      - {{id: CUDA0, memory_gb: {gpu_gb}}}
"""


def test_a_changed_declaration_is_probed_again_and_the_same_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probed: list[str] = []
    told: list[frozenset[int]] = []

    def probe(
        node: Node, binary: Path | None, own_pids: frozenset[int]
    ) -> tuple[NodePools, tuple[str, ...]]:
        probed.append(node.name)
        told.append(own_pids)
        return node_pools(node, probed=False), ()

    def no_server() -> Path:
        raise AdapterError("no llama-server in this test")

    monkeypatch.setattr(run_devices, "probe_pools", probe)
    monkeypatch.setattr(run_devices, "find_llama_server", no_server)
    devices = RunDevices()

    def fleet(gpu_gb: int) -> Fleet:
        return parse_fleet(FLEET.format(gpu_gb=gpu_gb), file="fleet.yaml")

    def gpu_capacity() -> int:
        assert devices.pools is not None
        (pool,) = devices.pools["box"].devices()
        return pool.capacity_bytes

    devices.find_pools(fleet(24))
    assert (probed, gpu_capacity()) == (["box"], 24 * GiB)
    devices.find_pools(fleet(24))
    assert probed == ["box"]  # a reload that changed no device probes nothing
    devices.find_pools(fleet(16), frozenset({4242}))
    assert (probed, gpu_capacity()) == (["box", "box"], 16 * GiB)
    # This run's own backends are not others': what they hold stays theirs to count.
    assert told == [frozenset(), frozenset({4242})]
