"""What a node serves when the plan puts two copies of a role on it, one per device (issue 29,
item 5): the first under the role's name, the further one as a unit of its own (``chat~2``)
with the role's figures, slots and weights; a node with one copy serves as before."""

from __future__ import annotations

from rosterd.fleet_scheduler.served import copies_after_loss, node_serving, retired_reasons
from rosterd.fleet_scheduler.values import NodeRun
from rosterd.placement import Plan
from support.fleet_bench import config, node
from support.specs import spec


def test_a_node_named_twice_in_copies_serves_chat_and_chat_2() -> None:
    box = node("box", 8)
    cfg = config([spec("chat", 1, interactive=True), spec("other", 1)], [box])
    serving = node_serving(
        cfg, {"chat": "box", "other": "box"}, box, NodeRun.LOCAL, {"chat": ("box",)}
    )
    assert sorted(serving.specs) == ["chat", "chat~2", "other"]
    assert serving.specs["chat~2"].role == "chat~2"
    assert serving.specs["chat~2"].memory == serving.specs["chat"].memory
    assert serving.specs["chat~2"].interactive


def test_a_copy_on_another_node_adds_no_unit() -> None:
    box = node("box", 8)
    cfg = config([spec("chat", 1)], [box, node("other", 8)])
    serving = node_serving(cfg, {"chat": "other"}, box, NodeRun.LOCAL, {"chat": ("box",)})
    assert sorted(serving.specs) == ["chat"]


def test_a_copy_on_another_device_of_the_role_s_node_stays_after_a_node_is_lost() -> None:
    new = Plan({"chat": "box"}, (), {}, "test", copies={"chat": ("box", "c")})
    assert copies_after_loss(new, {"chat": "box"}) == {"chat": ("box", "c")}
    # a role kept on a lost node: its copies elsewhere, not that node again
    assert copies_after_loss(new, {"chat": "c"}) == {"chat": ("box",)}


def test_a_reload_that_drops_a_further_copy_says_the_plan_no_longer_places_it() -> None:
    # A reload shrank box's second GPU below the role: its copy there, chat~2, is retired.
    # The reason is the plan's for the missing copy, not "no longer in the roster".
    box = node("box", 8)
    cfg = config([spec("chat", 1, interactive=True)], [box])
    why_short = "box: CUDA1 has 0.40 GiB, the copy needs 0.51 GiB"
    result = Plan({"chat": "box"}, (), {}, "test", copies_short=(("chat", why_short),))
    change = {"nodes": {"box": {"added": [], "retired": ["chat~2"]}}}
    assert retired_reasons(change, cfg, result) == {
        "chat~2": f"a copy of chat the new plan no longer places: {why_short}"
    }
    # The role itself gone from the roster: its own reason, once, not one per copy.
    gone = Plan({}, (), {}, "test")
    change = {"nodes": {"box": {"added": [], "retired": ["chat", "chat~2"]}}}
    assert retired_reasons(change, cfg, gone) == {"chat": "no longer in the roster"}
