"""mlx_lm and llama.cpp roles on a Mac that declares no GPU share are held to Metal's default
one: never two resident together over it, evicted by it, named in the reason when one cannot
fit; a llama.cpp role there is placed on it (and so pinned) as on a declared share. Apple
hardware cannot run here: these are the planning and residency rules, no process."""

from __future__ import annotations

from rosterd.devices.pools import with_default_gpu_shares
from rosterd.fleet import Fleet, Node, Platform
from rosterd.placement import plan
from rosterd.placement.device_need import DeviceNeed
from rosterd.placement.devices import DevicePlan, place_on_devices
from rosterd.residency import Load, NodeState, decide, decide_by_pool
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.tokens import GB
from support.specs import spec

#: A 16 GiB MacBook Air: 14 GiB of host RAM for roles (2 GiB reserved), and Metal's
#: default share of 10.67 GiB: two 6 GiB mlx roles fit in RAM, not in the share.
AIR = Node(
    name="air",
    memory_bytes=16 * GB,
    reserved_bytes=2 * GB,
    platform=Platform.MACOS_ARM64,
    flavors=Platform.MACOS_ARM64.supported_flavors(),
)
SHARE = 16 * GB * 2 // 3


def _mlx(role: str, interactive: bool) -> InferenceSpec:
    return spec(role, 6, interactive=interactive, flavor=InferFlavor.MLX_LM)


def _place(specs: list[InferenceSpec]) -> tuple[Fleet, DevicePlan]:
    fleet = with_default_gpu_shares(Fleet(nodes=(AIR,)), {s.flavor for s in specs})
    needs = {s.role: DeviceNeed(s.memory.resident_bytes) for s in specs}
    node_plan = plan(specs, fleet, time_limit_s=0.2, device_needs=needs)
    return fleet, place_on_devices(specs, fleet, node_plan, needs)


def test_two_interactive_mlx_roles_over_the_default_share_one_is_placed_the_other_says_why() -> (
    None
):
    specs = [_mlx("writer", True), _mlx("planner", True)]
    # Host RAM alone (as before: no share) holds both.
    assert sorted(plan(specs, Fleet(nodes=(AIR,)), time_limit_s=0.2).placements) == [
        "planner",
        "writer",
    ]
    _, result = _place(specs)
    assert len(result.plan.placements) == 1
    (placed,) = result.plan.placements
    pool = result.pools["air"]["MTL0"]
    assert (pool.capacity_bytes, pool.source) == (SHARE, "default")
    assert pool.always_resident == (placed,)
    [(role, reason)] = result.plan.unplaced
    assert role != placed
    assert "no device on air has room for this interactive role" in reason
    assert "needs 6.00 GiB on one device" in reason
    assert f"MTL0: 4.67 GiB free of 10.67 GiB (held by {placed})" in reason
    assert "offload: partial" not in reason  # an mlx role has no layers to split
    assert "Metal's default for the Mac's memory: declare gpu_share_gb" in reason


def test_two_batch_mlx_roles_over_the_default_share_are_resident_one_at_a_time() -> None:
    specs = [_mlx("writer", False), _mlx("planner", False)]
    _, result = _place(specs)
    assert sorted(result.plan.placements) == ["planner", "writer"]
    pool = result.pools["air"]["MTL0"]
    assert pool.swappable == ("planner", "writer")
    assert pool.peak_bytes == 6 * GB
    # At run time, by pool: host RAM holds both; the GPU share one at a time, so loading
    # the second evicts the first, and the reason names the share.
    by_id = {s.role: s for s in specs}
    host = NodeState(14 * GB, by_id, frozenset({"writer"}), {}, ("writer",))
    on_host = decide(host, "planner")
    assert isinstance(on_host, Load)
    assert on_host.evict == ()
    share = NodeState(SHARE, by_id, frozenset({"writer"}), {}, ("writer",))
    decision = decide_by_pool(host, {"MTL0": share}, "planner")
    assert isinstance(decision, Load)
    assert decision.evict == ("writer",)
    assert "device MTL0" in decision.reason


def test_an_mlx_role_larger_than_the_default_share_is_kept_off_the_mac_and_told_why() -> None:
    specs = [spec("big", 12, flavor=InferFlavor.MLX_LM)]  # fits 14 GiB of RAM, not 10.67
    _, result = _place(specs)
    [(role, reason)] = result.plan.unplaced
    assert role == "big"
    assert "MTL0" in reason
    assert "10.67 GiB" in reason


def test_an_mlx_and_a_llamacpp_role_over_the_default_share_one_is_placed_the_other_says_why() -> (
    None
):
    # 6 + 5 GiB fit the 14 GiB of RAM, not the 10.67 GiB share: llama-server offloads every
    # layer to Metal, so chat counts there as the mlx role does.
    specs = [_mlx("writer", True), spec("chat", 5, interactive=True)]
    fleet, result = _place(specs)
    assert fleet.node("air").devices[0].default_share
    assert result.plan.placements == {"writer": "air"}  # the bigger one is taken first
    choice = result.device_of("writer", "air")
    assert choice is not None
    assert (choice.device, choice.device_bytes) == ("MTL0", 6 * GB)
    [(role, reason)] = result.plan.unplaced
    assert role == "chat"
    assert "no device on air has room for this interactive role" in reason
    assert "MTL0: 4.67 GiB free of 10.67 GiB (held by writer)" in reason
    assert "Metal's default for the Mac's memory: declare gpu_share_gb" in reason


def test_an_mlx_and_a_llamacpp_batch_role_over_the_default_share_swap_one_at_a_time() -> None:
    specs = [_mlx("writer", False), spec("chat", 5, interactive=False)]
    _, result = _place(specs)
    assert sorted(result.plan.placements) == ["chat", "writer"]
    pool = result.pools["air"]["MTL0"]
    assert pool.swappable == ("chat", "writer")
    assert pool.bytes_by_role == {"chat": 5 * GB, "writer": 6 * GB}
    assert pool.peak_bytes == 6 * GB
    # The llama.cpp role is placed on the share with every layer: pinned to it at launch
    # (--device MTL0 -ngl 999), as on a declared share.
    chat = result.device_of("chat", "air")
    assert chat is not None
    assert (chat.device, chat.gpu_layers, chat.partial) == ("MTL0", None, False)
    # At run time the share holds one of them: loading chat evicts writer.
    by_id = {s.role: s for s in specs}
    host = NodeState(14 * GB, by_id, frozenset({"writer"}), {}, ("writer",))
    share = NodeState(SHARE, by_id, frozenset({"writer"}), {}, ("writer",))
    decision = decide_by_pool(host, {"MTL0": share}, "chat")
    assert isinstance(decision, Load)
    assert decision.evict == ("writer",)
    assert "device MTL0" in decision.reason


def test_a_llamacpp_role_over_the_default_share_may_run_partly_on_it() -> None:
    # offload: partial, as on a declared share: the layers that fit, the rest on the CPU.
    chat = spec("chat", 12, interactive=True)
    fleet = with_default_gpu_shares(Fleet(nodes=(AIR,)), {InferFlavor.LLAMACPP})
    by_layers = tuple(i * GB for i in range(14))  # -ngl 0..13: 1 GiB more per layer
    needs = {"chat": DeviceNeed(13 * GB, by_layers, "partial")}
    node_plan = plan([chat], fleet, time_limit_s=0.2, device_needs=needs)
    choice = place_on_devices([chat], fleet, node_plan, needs).device_of("chat", "air")
    assert choice is not None
    assert (choice.device, choice.gpu_layers, choice.partial) == ("MTL0", 10, True)
