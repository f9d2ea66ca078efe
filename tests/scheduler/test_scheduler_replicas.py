"""A role with replicas under the node schedulers of one process (``NodeDirectory``): each copy is
its own residency unit on its node; requests go to a ready copy by prefix within a bounded
load, spread when they stay in flight, skip a copy that is not ready, and a failover names
the copy to avoid. The backends are the recording fakes of ``test_scheduler_node.py``
(standing in for the supervisor); no test sleeps."""

from __future__ import annotations

import asyncio

import pytest

from rosterd.errors import UnknownRoleError
from rosterd.replica_choice import CopyState, prefix_key
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import NodeConcurrency
from support.node_loop import LIMITS, MIB, GatedBackends, spec


def two_copies(
    gated: tuple[str, ...] = (), concurrency: NodeConcurrency | None = None
) -> tuple[NodeDirectory, dict[str, GatedBackends]]:
    backends = {name: GatedBackends(gated if name == "n2" else ()) for name in ("n1", "n2")}
    nodes = {
        name: NodeScheduler(
            name,
            1000 * MIB,
            {"chat": spec("chat", 100)},
            fake,
            limits=LIMITS,
            concurrency=concurrency,
        )
        for name, fake in backends.items()
    }
    sched = NodeDirectory(nodes)
    sched.start()
    return sched, backends


async def test_a_load_makes_every_copy_resident_and_each_copy_is_its_own_unit() -> None:
    sched, backends = two_copies()
    await sched.load("chat")
    assert [n.name for n in sched.nodes_of("chat")] == ["n1", "n2"]
    assert all(n.copy_state("chat") is CopyState.READY for n in sched.nodes_of("chat"))
    assert backends["n1"].starts == ["chat"]
    assert backends["n2"].starts == ["chat"]
    await sched.nodes["n1"].unload("chat")  # evicting one copy leaves the other serving
    assert sched.nodes["n1"].copy_state("chat") is CopyState.COLD
    lease = await sched.acquire("chat", prefix=b"any")
    assert lease.node == "n2"
    sched.release(lease)
    assert sched.snapshot()["n2"].copies["chat"].nodes == ("n1", "n2")
    await sched.shutdown()


async def test_an_unload_stops_every_copy_on_every_node_and_device() -> None:
    sched, backends = two_copies()
    await sched.load("chat")
    await sched.unload("chat")  # rosterd unload chat
    assert all(n.copy_state("chat") is CopyState.COLD for n in sched.nodes_of("chat"))
    assert backends["n1"].stops == backends["n2"].stops == ["chat"]
    await sched.shutdown()
    fake = GatedBackends(())
    specs = {"chat": spec("chat", 100), "chat~2": spec("chat~2", 100)}  # chat~2: a further copy
    one_node = NodeDirectory({"box": NodeScheduler("box", 1000 * MIB, specs, fake, limits=LIMITS)})
    one_node.start()
    await one_node.load("chat")
    await one_node.unload("chat")
    assert sorted(fake.stops) == ["chat", "chat~2"]
    with pytest.raises(UnknownRoleError):
        await one_node.unload("chat~2")  # a copy is no role of its own
    await one_node.shutdown()


async def test_requests_in_flight_spread_over_the_copies_and_a_prefix_sticks() -> None:
    sched, _ = two_copies()
    await sched.load("chat")
    key = prefix_key({"messages": [{"role": "user", "content": "hi"}]})
    first = await sched.acquire("chat", prefix=key)
    sched.release(first)
    again = await sched.acquire("chat", prefix=key)
    assert again.node == first.node  # idle copies: the prefix's own
    held: list[Lease] = [again]
    held += [await sched.acquire("chat", prefix=key) for _ in range(7)]
    counts = {n: sum(1 for lease in held if lease.node == n) for n in ("n1", "n2")}
    assert min(counts.values()) >= 3  # bounded load: the hot prefix spills over
    for lease in held:
        sched.release(lease)
    assert sched.snapshot()["n1"].copies["chat"].requests == 0
    await sched.shutdown()


async def test_a_copy_loading_is_skipped_and_a_failover_avoids_the_copy_tried() -> None:
    sched, backends = two_copies(gated=("chat",))
    loading = asyncio.ensure_future(sched.load("chat"))
    await backends["n2"].started("chat").wait()
    sched.release(await sched.acquire("chat", on_node="n1"))  # n1's copy is ready
    for _ in range(3):
        lease = await sched.acquire("chat", prefix=b"whatever")
        assert lease.node == "n1"  # n2 is loading
        sched.release(lease)
    backends["n2"].gates["chat"].set()
    await loading
    lease = await sched.acquire("chat", avoid={"n1"})
    assert lease.node == "n2"
    sched.release(lease)
    with pytest.raises(UnknownRoleError):
        await sched.acquire("chat", avoid={"n1", "n2"})
    await sched.shutdown()


async def test_two_copies_on_one_node_are_two_units_routed_as_copies_of_one_role() -> None:
    fake = GatedBackends(())
    specs = {"chat": spec("chat", 100), "chat~2": spec("chat~2", 100)}  # chat~2: a further copy
    node = NodeScheduler("box", 1000 * MIB, specs, fake, limits=LIMITS)
    sched = NodeDirectory({"box": node})
    sched.start()
    assert sched.roles == ("chat",)  # clients never see chat~2
    assert sched.copy_keys("chat") == ("box", "box/chat~2")
    await sched.load("chat")
    assert sorted(fake.starts) == ["chat", "chat~2"]
    held = [await sched.acquire("chat", prefix=b"hot") for _ in range(8)]
    assert {lease.role for lease in held} == {"chat"}
    assert {lease.copy_key for lease in held} == {"box", "box/chat~2"}  # bounded load spills
    for lease in held:
        sched.release(lease)
    assert sched.snapshot()["box"].copies["chat~2"].requests == 0
    lease = await sched.acquire("chat", avoid={"box"})  # a failover from the first copy
    assert (lease.copy, lease.copy_key) == ("chat~2", "box/chat~2")
    assert sched.other_copy_ready("chat", "box/chat~2")
    sched.release(lease)
    with pytest.raises(UnknownRoleError):
        await sched.acquire("chat~2")
    await sched.shutdown()


async def test_a_prefix_goes_to_the_idle_copy_while_its_own_one_slot_is_busy() -> None:
    # Both copies launched with one parallel slot (llama-server's default), under the
    # per-role limit of 4: a long request holds the conversation's copy, and the
    # conversation's next request goes to the idle copy rather than queue behind it.
    sched, _ = two_copies(concurrency=NodeConcurrency(None, {"chat": 1}, {"chat": 1}))
    await sched.load("chat")
    assert [n.copy_slots("chat") for n in sched.nodes_of("chat")] == [1, 1]
    key = prefix_key({"messages": [{"role": "user", "content": "Story 2"}]})
    long = await sched.acquire("chat", prefix=key)
    short = await sched.acquire("chat", prefix=key, timeout_s=5.0)  # not queued behind it
    assert short.node != long.node
    # Both copies busy: the conversation's own copy, within the bound.
    assert sched.choose_node("chat", key).name == long.node
    sched.release(short)
    assert sched.choose_node("chat", key).name == short.node  # a slot free again there
    sched.release(long)
    assert sched.choose_node("chat", key).name == long.node  # both idle: its own copy
    await sched.shutdown()


async def test_a_copys_slots_are_its_roles_within_the_node_wide_limit() -> None:
    for concurrency, slots in (
        (None, LIMITS.max_concurrency),  # no slot count: the per-role limit
        (NodeConcurrency(None, {"chat": 2}, {"chat": 2}), 2),  # its backend's slots
        (NodeConcurrency(1, {"chat": 2}, {"chat": 2}), 1),  # the node's max_concurrency
    ):
        sched, _ = two_copies(concurrency=concurrency)
        await sched.load("chat")
        assert [n.copy_slots("chat") for n in sched.nodes_of("chat")] == [slots, slots]
        await sched.shutdown()
