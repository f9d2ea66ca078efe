"""A Mac's default GPU share: Metal's default rule for a Mac that declares none, in a fleet
whose roster has roles that run on a Mac's GPU (llama.cpp, mlx_lm); a probe's figure over the
rule, a declared one over both. Apple hardware cannot run here: the listing is a recorded
one."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rosterd.devices.listing import parse_list_devices
from rosterd.devices.pools import (
    METAL_DEVICE,
    metal_default_share_bytes,
    node_pools,
    with_counted_devices,
    with_default_gpu_shares,
)
from rosterd.fleet import Fleet
from rosterd.fleet.model import DeviceSpec
from rosterd.fleet.reader import parse_fleet
from rosterd.spec import InferFlavor

GiB = 1 << 30
MiB = 1 << 20
DATA = Path(__file__).resolve().parents[1] / "data" / "list_devices"

LAB = """
nodes:
  - {name: air, memory_gb: 16, platform: macos-arm64}
  - {name: studio, memory_gb: 128, platform: macos-arm64}
  - {name: raised, memory_gb: 128, platform: macos-arm64,
     devices: [{id: MTL0, gpu_share_gb: 112}]}
  - {name: box, memory_gb: 64, platform: linux-x86_64}
  - {name: llama-mac, memory_gb: 32, platform: macos-arm64, flavors: [llamacpp]}
  - {name: ollama-mac, memory_gb: 32, platform: macos-arm64, flavors: [ollama]}
"""

MLX_AND_LLAMA = {InferFlavor.MLX_LM, InferFlavor.LLAMACPP}


def _with_shares(flavors: set[InferFlavor]) -> Fleet:
    return with_default_gpu_shares(parse_fleet(LAB), flavors)


def test_the_rule_gives_the_figures_macs_report() -> None:
    # 10.67 GiB of 16 GiB (issue 29); 96 GiB of 128 GiB (an M4 Max's listing, recorded).
    assert metal_default_share_bytes(16 * GiB) == 16 * GiB * 2 // 3
    assert round(metal_default_share_bytes(16 * GiB) / GiB, 2) == 10.67
    assert metal_default_share_bytes(36 * GiB) == 24 * GiB
    assert metal_default_share_bytes(64 * GiB) == 48 * GiB
    listed = parse_list_devices((DATA / "metal_m4_max.txt").read_text(encoding="utf-8"))
    assert metal_default_share_bytes(128 * GiB) == listed[0].total_bytes == 96 * GiB


@given(st.integers(min_value=1 * GiB, max_value=2048 * GiB))
def test_the_default_share_is_within_metals_band(memory: int) -> None:
    share = metal_default_share_bytes(memory)
    assert 0.66 * memory <= share <= 0.84 * memory


@given(
    st.integers(min_value=1 * GiB, max_value=2048 * GiB),
    st.integers(min_value=0, max_value=512 * GiB),
)
def test_more_memory_never_gives_a_smaller_share(memory: int, more: int) -> None:
    assert metal_default_share_bytes(memory) <= metal_default_share_bytes(memory + more)


def test_a_mac_that_declares_no_share_gets_the_default_one_for_its_gpu_roles() -> None:
    fleet = _with_shares(MLX_AND_LLAMA)
    (air,) = fleet.node("air").devices
    assert air == DeviceSpec(METAL_DEVICE, 16 * GiB * 2 // 3, 0, gpu_share=True, default_share=True)
    assert fleet.node("studio").devices[0].memory_bytes == 96 * GiB
    # The declared figure (a lab that raised iogpu.wired_limit_mb) overrides the rule.
    assert fleet.node("raised").devices == (DeviceSpec("MTL0", 112 * GiB, 0, gpu_share=True),)
    # A Mac that runs llama.cpp alone gets it too: llama-server offloads every layer to
    # Metal by default there, wiring the same memory as mlx_lm.
    (llama,) = fleet.node("llama-mac").devices
    assert (llama.id, llama.memory_bytes, llama.default_share) == ("MTL0", 32 * GiB * 2 // 3, True)
    # A Linux node, and a Mac that runs neither (ollama sizes its GPU use itself), are as
    # they were.
    assert fleet.node("box").devices == ()
    assert fleet.node("ollama-mac").devices == ()
    # Host RAM is untouched: the share is a pool beside it.
    assert fleet.node("air").capacity_bytes == parse_fleet(LAB).node("air").capacity_bytes


def test_a_roster_of_llamacpp_roles_gives_the_macs_that_run_them_the_share() -> None:
    fleet = _with_shares({InferFlavor.LLAMACPP})
    for name in ("air", "studio", "llama-mac"):
        assert fleet.node(name).devices[0].default_share
    assert fleet.node("ollama-mac").devices == ()
    assert fleet.node("box").devices == ()


def test_a_roster_without_llamacpp_or_mlx_roles_leaves_every_mac_as_it_was() -> None:
    assert _with_shares({InferFlavor.OLLAMA}) == parse_fleet(LAB)
    assert _with_shares(set()) == parse_fleet(LAB)


def test_the_default_pool_says_where_its_figure_comes_from_and_warns_of_nothing() -> None:
    air = _with_shares(MLX_AND_LLAMA).node("air")
    for probed in (False, True):  # no listing: a Mac without llama.cpp, or a plan
        pools = node_pools(air, probed=probed)
        (share,) = pools.devices()
        assert (share.id, share.kind, share.source) == ("MTL0", "gpu-share", "default")
        assert share.capacity_bytes == 16 * GiB * 2 // 3
        assert (share.declared_bytes, share.probed_total_bytes) == (None, None)
        assert pools.warnings == ()  # not declared: nothing to warn of


def test_a_probed_figure_wins_over_the_rule_and_a_declared_one_over_both() -> None:
    fleet = _with_shares(MLX_AND_LLAMA)
    # This Mac's llama.cpp lists Metal's own recommendedMaxWorkingSetSize (raised here by
    # iogpu.wired_limit_mb): it wins over the rule's 96 GiB.
    raised = parse_list_devices(
        "Available devices:\n  MTL0: Apple M4 Max (110080 MiB, 90000 MiB free)\n"
    )
    pools = node_pools(fleet.node("studio"), raised)
    (share,) = pools.devices()
    assert (share.source, share.capacity_bytes) == ("probed", 110080 * MiB)
    assert (share.declared_bytes, share.probed_total_bytes) == (None, 110080 * MiB)
    assert share.others_bytes == 0  # a cap, not memory others hold
    # An older build names it `Metal`: the same GPU, under the name that build's
    # `--device` takes.
    older = parse_list_devices((DATA / "metal_m4_max.txt").read_text(encoding="utf-8"))
    (old_share,) = node_pools(fleet.node("studio"), older).devices()
    assert (old_share.id, old_share.source) == (older[0].id, "probed")
    # Declared: the fleet file's figure over the probe's.
    declared = node_pools(fleet.node("raised"), raised).devices()[0]
    assert (declared.source, declared.capacity_bytes) == ("declared, probed", 112 * GiB)
    # As counted at run time, the share stays the default one (its figure not declared).
    counted = with_counted_devices(fleet.node("studio"), pools)
    assert counted.devices == (
        DeviceSpec("MTL0", 110080 * MiB, 0, gpu_share=True, default_share=True),
    )
    assert with_counted_devices(fleet.node("raised"), node_pools(fleet.node("raised"))).devices[
        0
    ] == DeviceSpec("MTL0", 112 * GiB, 0, gpu_share=True)
