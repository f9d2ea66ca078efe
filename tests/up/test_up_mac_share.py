"""``rosterd up`` on a Mac that declares no GPU share: the files read give it Metal's default
share for the roster's llama.cpp and mlx_lm roles, the run's probe (a recorded Metal listing
stands in for the Mac this machine is not) puts Metal's own figure in its place, and the
node machine holds both kinds to that pool: the mlx roles unpinned, the llama.cpp roles
pinned to it (``--device MTL0 -ngl 999 --fit off``) as on a declared share."""

from __future__ import annotations

from pathlib import Path

import pytest

import rosterd.up.devices as run_devices
from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.cli.client_cmd import _pool_lines
from rosterd.devices.listing import parse_list_devices
from rosterd.devices.pools import NodePools, node_pools
from rosterd.fleet.model import Node
from rosterd.fleet_scheduler.values import NodeServing
from rosterd.placement import plan
from rosterd.up import config as up_config
from rosterd.up.options import UpOptions
from rosterd.weights import ResolvedWeights

GiB = 1 << 30
MiB = 1 << 20
#: What the Mac's llama-server lists: Metal's recommendedMaxWorkingSetSize, raised by
#: iogpu.wired_limit_mb above the rule's 96 GiB of 128 GiB.
LISTING = "Available devices:\n  MTL0: Apple M4 Max (110080 MiB, 110079 MiB free)\n"


def _files(tmp_path: Path, backend: str) -> UpOptions:
    roster = tmp_path / "roster.yaml"
    roster.write_text(
        "roster:\n"
        + "".join(
            f"  - {{id: {role}, role: chat, name: {role}, ram_gb: 60, backend: {backend}, "
            f"port: {port}, status: live}}\n"
            for role, port in (("writer", 18601), ("planner", 18602))
        )
        + "  - {id: chat, role: chat, name: chat, ram_gb: 1, backend: llama.cpp, "
        "port: 18603, status: live}\n"
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n  - {name: studio, memory_gb: 128, reserved_gb: 4, platform: macos-arm64, "
        "address: 127.0.0.1}\n"
    )
    return UpOptions(roster, fleet_path=fleet)


def test_up_holds_mlx_and_llamacpp_roles_to_the_share_the_macs_probe_lists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roster, fleet = up_config.read_files(_files(tmp_path, "mlx_lm"))
    (share,) = fleet.node("studio").devices
    assert (share.id, share.memory_bytes, share.default_share) == ("MTL0", 96 * GiB, True)

    def probe(
        node: Node, binary: Path | None, own_pids: frozenset[int] = frozenset()
    ) -> tuple[NodePools, tuple[str, ...]]:
        return node_pools(node, parse_list_devices(LISTING)), ()

    def mac_server() -> Path:
        return tmp_path / "llama-server"  # never run: the probe and --help are stand-ins

    monkeypatch.setattr(run_devices, "probe_pools", probe)
    monkeypatch.setattr(run_devices, "find_llama_server", mac_server)
    monkeypatch.setattr(run_devices, "server_lists_fit", lambda binary: True)
    devices = run_devices.RunDevices()
    assert devices.find_pools(fleet) == ()  # not declared: nothing to warn of
    counted = devices.counted(fleet)
    config = up_config.gather(roster, fleet, tmp_path / "state")
    specs = [s.spec for s in roster.specs]
    needs = devices.needs(config.memory, counted, specs)
    assert needs is not None
    placed = devices.place(specs, counted, plan(specs, counted, time_limit_s=0.2), needs)
    # Two 60 GiB mlx roles: host RAM (124 GiB) holds both, the share (107.5 GiB) one at a
    # time: both placed, swapped in it.
    assert sorted(placed.placements) == ["chat", "planner", "writer"]
    by_id = {s.role: s for s in specs}
    serving = devices.serving(NodeServing("studio", 124 * GiB, by_id))
    pool = serving.devices["MTL0"]
    assert (pool.source, pool.capacity_bytes) == ("probed", 110080 * MiB)
    assert (pool.declared_bytes, pool.probed_total_bytes) == (None, 110080 * MiB)
    assert pool.bytes_by_role == {"chat": 1 * GiB, "planner": 60 * GiB, "writer": 60 * GiB}
    # chat (llama.cpp) is pinned to the share, as on a declared one; mlx roles have no pins.
    pins = devices.pins(serving)
    # (-lv 4: builds with --fit log what they allocate per device at trace level only)
    assert pins == {"chat": ("--device", "MTL0", "-ngl", "999", "--fit", "off", "-lv", "4")}
    # Its launch command carries them last, so they win over the fleet entry's args.
    adapter = LlamaCppAdapter(server_binary=tmp_path / "llama-server")
    weights = ResolvedWeights(path=tmp_path / "chat.gguf", extra_args=("-ngl", "10"))
    argv = adapter.launch(by_id["chat"], weights, host="127.0.0.1", port=18603, pins=pins["chat"])
    assert argv.argv[-8:] == pins["chat"]


def test_up_with_llamacpp_roles_alone_gives_the_mac_the_share(tmp_path: Path) -> None:
    _, fleet = up_config.read_files(_files(tmp_path, "llama.cpp"))
    (share,) = fleet.node("studio").devices
    assert (share.id, share.default_share) == ("MTL0", True)


def test_up_with_ollama_roles_alone_leaves_the_mac_as_it_was(tmp_path: Path) -> None:
    options = _files(tmp_path, "ollama")
    options.roster_path.write_text(options.roster_path.read_text().replace("llama.cpp", "ollama"))
    _, fleet = up_config.read_files(options)
    assert fleet.node("studio").devices == ()


def test_ps_says_where_a_default_share_comes_from() -> None:
    pool = {"capacity_bytes": 96 * GiB, "resident_bytes": 0, "roles": {"writer": 60 * GiB}}
    default = {"declared_bytes": None, "probed_total_bytes": None, "source": "default"}
    probed = {"declared_bytes": None, "probed_total_bytes": 96 * GiB, "source": "probed"}
    (line,) = _pool_lines({"pools": {"MTL0": {**pool, **default}}})
    assert "(Metal's default share); placed there: writer 60.00" in line
    (line,) = _pool_lines({"pools": {"MTL0": {**pool, **probed}}})
    assert "(probed 96.00 GiB)" in line
