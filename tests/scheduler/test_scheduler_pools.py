"""The node machine holds roles to every pool they use (issue 29): host RAM and the device a
role is placed on, each a budget of its own. Driven on ``Bench`` with an explicit ``now``
(no sleeps); a device here is a declared one (no GPU is needed: the machine only counts).
"""

from __future__ import annotations

from rosterd.errors import RoleRefusedError
from rosterd.scheduler.events import (
    LogNote,
    MeasuredPeak,
    Reconfigure,
    Reconfigured,
    RevokeLeases,
)
from rosterd.scheduler.machine import NodeMachine
from rosterd.scheduler.values import DevicePool
from support.node_bench import LIMITS, MIB, Bench, assert_failed, spec


def gpu_bench(device_mib: int, on_device: dict[str, int], host_roles: dict[str, int]) -> Bench:
    """A node with 10 GiB of host RAM and one device ``CUDA0`` of ``device_mib`` MiB;
    ``on_device``: role -> MiB it holds there (each role counts 100 MiB on the host too);
    ``host_roles``: role -> MiB of roles on the CPU alone."""
    specs = [spec(r, 100, sticky=False) for r in on_device]
    specs += [spec(r, mib, sticky=False) for r, mib in host_roles.items()]
    bench = Bench(specs, 10_240)
    pool = DevicePool(device_mib * MIB, {r: mib * MIB for r, mib in on_device.items()})
    bench.machine = NodeMachine(bench.capacity, bench.specs, LIMITS, devices={"CUDA0": pool})
    return bench


def serve(bench: Bench, role: str) -> None:
    ticket = bench.acquire(role)
    bench.settle()
    bench.release(ticket)


def test_a_second_role_on_a_full_device_evicts_the_first_though_the_host_has_room() -> None:
    bench = gpu_bench(1000, {"a": 700, "b": 700}, {})
    serve(bench, "a")
    serve(bench, "b")
    assert bench.starts() == ["a", "b"]
    assert bench.stops() == ["a"]  # the device lacked room, not the host
    assert bench.machine.resident() == ("b",)
    assert bench.violations == []


def test_roles_that_fit_the_device_together_stay_resident_together() -> None:
    bench = gpu_bench(1000, {"a": 400, "b": 400}, {})
    serve(bench, "a")
    serve(bench, "b")
    assert bench.stops() == []
    assert bench.machine.resident() == ("a", "b")


def test_a_host_role_takes_no_room_on_the_device() -> None:
    bench = gpu_bench(1000, {"a": 900}, {"cpu": 500})
    serve(bench, "a")
    serve(bench, "cpu")
    assert bench.stops() == []
    assert bench.machine.resident() == ("a", "cpu")


def test_a_role_larger_than_its_device_is_refused_naming_the_device() -> None:
    bench = gpu_bench(1000, {"huge": 1500}, {})
    ticket = bench.acquire("huge")
    reason = assert_failed(bench, ticket, RoleRefusedError, "device CUDA0")
    assert bench.starts() == []
    assert "CUDA0" in reason


def test_the_pools_come_whole_with_a_reconfigure() -> None:
    # Level-based: a Reconfigure without devices leaves host RAM the only pool.
    bench = gpu_bench(1000, {"a": 700, "b": 700}, {})
    serve(bench, "a")
    bench.send(Reconfigure(bench.now, bench.machine.placed(), bench.capacity))
    serve(bench, "b")
    assert bench.stops() == []
    assert bench.machine.resident() == ("a", "b")
    pool = DevicePool(1000 * MIB, {"a": 700 * MIB, "b": 700 * MIB, "c": 700 * MIB})
    bench.specs["c"] = spec("c", 100, sticky=False)
    specs = {**bench.machine.placed(), "c": bench.specs["c"]}
    bench.send(Reconfigure(bench.now, specs, bench.capacity, devices={"CUDA0": pool}))
    ticket = bench.acquire("c")
    bench.at(bench.now + LIMITS.drain_s + 1)
    bench.settle()
    assert bench.lease(ticket) is not None
    assert set(bench.stops()) == {"a", "b"}  # the device had room for one of the three
    assert bench.machine.resident() == ("c",)


def test_a_node_without_devices_counts_host_ram_alone() -> None:
    bench = Bench([spec("a", 700, sticky=False), spec("b", 700, sticky=False)], 1000)
    serve(bench, "a")
    serve(bench, "b")
    assert bench.stops() == ["a"]


def test_a_measurement_past_the_count_on_a_device_is_counted_there_with_one_warning() -> None:
    # NVML's per-process figure for a's backend (what a GPU would report; no GPU here).
    bench = gpu_bench(1000, {"a": 400, "b": 400}, {})
    serve(bench, "a")
    bench.send(MeasuredPeak(bench.now, "a", 100 * MIB, 100 * MIB, {"CUDA0": 700 * MIB}))
    bench.send(MeasuredPeak(bench.now, "a", 100 * MIB, 100 * MIB, {"CUDA0": 700 * MIB}))
    warnings = [n.message for n in bench.of(LogNote) if "on device CUDA0" in n.message]
    assert len(warnings) == 1
    assert "role a holds 700 MiB on device CUDA0, 75% more than the 400 MiB" in warnings[0]
    pools = bench.machine.state.pools_view()
    assert pools["CUDA0"]["roles"] == {"a": 700 * MIB, "b": 400 * MIB}
    serve(bench, "b")  # 700 + 400 no longer fit the device: a leaves it
    assert bench.stops() == ["a"]
    assert bench.machine.resident() == ("b",)


def test_a_measurement_within_the_margin_changes_nothing() -> None:
    bench = gpu_bench(1000, {"a": 400, "b": 400}, {})
    serve(bench, "a")
    bench.send(MeasuredPeak(bench.now, "a", 100 * MIB, 100 * MIB, {"CUDA0": 430 * MIB}))
    serve(bench, "b")
    assert bench.stops() == []
    assert not [n for n in bench.of(LogNote) if "on device" in n.message]


# ------------------------------------------------------------ a smaller device in a reload


def shrink_device(bench: Bench, device_mib: int) -> None:
    """A reload that declares ``CUDA0`` with ``device_mib`` MiB, the roles on it unchanged."""
    pool = bench.machine.state.devices["CUDA0"]
    smaller = DevicePool(device_mib * MIB, dict(pool.bytes_by_role))
    bench.send(
        Reconfigure(bench.now, bench.machine.placed(), bench.capacity, devices={"CUDA0": smaller})
    )


def test_a_smaller_device_in_a_reload_evicts_idle_roles_at_once_least_recently_used_first() -> None:
    bench = gpu_bench(1000, {"old": 300, "mid": 300, "new": 300}, {"cpu": 500})
    for at, role in enumerate(("old", "mid", "new", "cpu")):
        bench.now = float(at)
        serve(bench, role)
    assert bench.stops() == []
    shrink_device(bench, 650)  # 900 MiB resident on a 650 MiB device: one must go
    assert bench.stops() == ["old"]  # at once, with no request asking; the host had room
    bench.stop_done("old")
    assert bench.stops() == ["old"]
    assert bench.machine.resident() == ("cpu", "mid", "new")
    (stopping,) = bench.records("stopping")
    assert "device CUDA0's capacity is now 0.63 GiB" in stopping.cause
    assert "evicting old" in stopping.cause
    notes = [n.message for n in bench.of(LogNote)]
    assert any(n.startswith("device CUDA0: capacity is now 0.63 GiB") for n in notes)
    (reconfigured,) = bench.of(Reconfigured)
    assert reconfigured.change.changed
    assert reconfigured.change.as_json()["device_capacity_bytes"] == {
        "CUDA0": [1000 * MIB, 650 * MIB]
    }
    assert {r.label for r in bench.records("stopped")} == {"replan"}


def test_a_smaller_device_evicts_an_idle_role_before_one_serving_a_request() -> None:
    bench = gpu_bench(1000, {"busy": 300, "idle": 300}, {})
    bench.now = 1.0
    held = bench.acquire("busy")
    bench.settle()
    bench.now = 2.0
    serve(bench, "idle")  # used last, yet idle
    shrink_device(bench, 500)
    assert bench.stops() == ["idle"]
    bench.stop_done("idle")
    bench.release(held)
    assert bench.stops() == ["idle"]
    assert bench.machine.resident() == ("busy",)


def test_a_role_serving_a_request_over_a_smaller_device_drains_then_is_cut() -> None:
    bench = gpu_bench(1000, {"a": 600}, {})
    held = bench.acquire("a")
    bench.settle()
    shrink_device(bench, 500)
    newer = bench.acquire("a")
    bench.at(LIMITS.drain_s - 0.1)
    assert not bench.answered(newer)  # newer requests wait: a drains
    assert bench.of(RevokeLeases) == []
    bench.at(LIMITS.drain_s)
    assert [r.role for r in bench.of(RevokeLeases)] == ["a"]
    bench.release(held)
    assert bench.stops() == ["a"]
    assert "device CUDA0's capacity is now" in bench.records("stopping")[0].cause
    bench.stop_done("a")
    assert_failed(bench, newer, RoleRefusedError, "device CUDA0")
    assert bench.machine.resident() == ()


def test_a_role_serving_a_request_over_a_smaller_device_stops_once_released() -> None:
    bench = gpu_bench(1000, {"a": 600}, {})
    held = bench.acquire("a")
    bench.settle()
    shrink_device(bench, 500)
    assert bench.stops() == []
    bench.release(held)
    assert bench.stops() == ["a"]


def test_a_device_that_still_holds_its_roles_evicts_nothing_on_a_reload() -> None:
    bench = gpu_bench(1000, {"a": 400, "b": 400}, {})
    serve(bench, "a")
    serve(bench, "b")
    shrink_device(bench, 800)
    assert bench.stops() == []
    assert bench.machine.resident() == ("a", "b")


def test_a_measurement_that_no_longer_fits_the_device_evicts_at_once() -> None:
    bench = gpu_bench(1000, {"a": 400, "b": 400}, {})
    bench.now = 1.0
    serve(bench, "a")
    bench.now = 2.0
    serve(bench, "b")
    bench.send(MeasuredPeak(bench.now, "b", 100 * MIB, 100 * MIB, {"CUDA0": 700 * MIB}))
    assert bench.stops() == ["a"]  # 400 + 700 over 1000: the least recently used goes
    cause = bench.records("stopping")[0].cause
    assert "memory on device CUDA0 grew over its capacity of 0.98 GiB" in cause
