"""``/status``'s nodes as JSON (``rosterd.router.status_view``), built from the layers'
read-only snapshots: the fields ``rosterd ps`` and the live page read, what a key may see,
the fleet's nodes in fleet order, a node not connected with the roles planned there."""

from __future__ import annotations

from rosterd.backends.values import KeptKv
from rosterd.fleet_scheduler.views import FleetNodeView, PlannedRole
from rosterd.router.status_view import StatusInputs, nodes_json
from rosterd.scheduler.views import DirectoryNode, NodeSnapshot, RoleCopies, RoleSnapshot

GIB = 2**30


def role(phase: str = "ready", *, kv: KeptKv | None = None) -> RoleSnapshot:
    """A ready role running one request on its backend at port 9000 (pid 42)."""
    return RoleSnapshot(
        phase="ready" if phase == "ready" else "stopped",
        latency_class="interactive",
        sticky=True,
        resident_bytes=GIB,
        running=1,
        queued=0,
        idle_s=None,
        loaded_for_s=12.5,
        waiting_reason=None,
        waiting_s=None,
        last_error=None,
        last_error_age_s=None,
        load_backoff_s=None,
        base_url="http://127.0.0.1:9000",
        pid=42,
        restart_pending=False,
        unavailable_reason=None,
        retiring=False,
        memory={"roster_bytes": GIB},
        kv=kv,
    )


def directory() -> dict[str, DirectoryNode]:
    kept = KeptKv(tokens=3713, file_bytes=18 * 2**20, last_restore="none", saves=1)
    node = NodeSnapshot(
        capacity_bytes=8 * GIB,
        resident_bytes=2 * GIB,
        resident=("chat", "secret"),
        transition=False,
        lost_reason=None,
        roles={"chat": role(kv=kept), "secret": role()},
        running=2,
        max_concurrency=None,
    )
    copies = {"chat": RoleCopies(("box", "far"), 3)}
    return {"box": DirectoryNode(node, draining=False, copies=copies)}


def test_a_node_and_its_roles_show_every_field_ps_and_the_page_read() -> None:
    nodes = nodes_json(directory(), StatusInputs(measured={"box": {"chat": 700 * 2**20}}))
    box = nodes["box"]
    assert box["capacity_bytes"] == 8 * GIB
    assert box["resident"] == ["chat", "secret"]
    assert (box["running"], box["max_concurrency"], box["draining"]) == (2, None, False)
    roles = box["roles"]
    assert isinstance(roles, dict)
    chat = roles["chat"]
    assert chat["phase"] == "ready"
    assert chat["latency_class"] == "interactive"
    assert (chat["base_url"], chat["pid"], chat["loaded_for_s"]) == (
        "http://127.0.0.1:9000",
        42,
        12.5,
    )
    assert chat["measured_rss_bytes"] == 700 * 2**20
    assert chat["memory"] == {"roster_bytes": GIB}
    assert chat["kv"]["tokens"] == 3713
    assert chat["kv"]["saves"] == 1
    assert chat["kv_summary"] == "3,713 tok · 18 MiB"
    assert (chat["copies"], chat["copy_requests"]) == (["box", "far"], 3)
    secret = roles["secret"]
    assert secret["kv"] is None
    assert secret["kv_summary"] == "—"
    assert secret["measured_rss_bytes"] is None
    assert "copies" not in secret


def test_a_key_sees_only_the_roles_it_may_use() -> None:
    inputs = StatusInputs(measured={}, visible=lambda r: r != "secret")
    box = nodes_json(directory(), inputs)["box"]
    assert box["resident"] == ["chat"]
    roles = box["roles"]
    assert isinstance(roles, dict)
    assert set(roles) == {"chat"}


def test_the_fleet_s_nodes_come_in_fleet_order_and_one_not_connected_shows_its_plan() -> None:
    planned = {
        "big": PlannedRole("moved", "box", "node far is not connected", "batch", False, 4 * GIB),
        "hidden": PlannedRole("not_connected", None, None, "batch", True, GIB),
    }
    fleet = {
        "far": FleetNodeView("10.0.0.2", False, "not connected: no Ray node", 16 * GIB, planned),
        "box": FleetNodeView("127.0.0.1", True, "this machine, no Ray node"),
    }
    inputs = StatusInputs(measured={}, visible=lambda r: r != "hidden", fleet=fleet)
    nodes = nodes_json(directory(), inputs)
    assert list(nodes) == ["far", "box"]
    far = nodes["far"]
    assert (far["connected"], far["connection"]) == (False, "not connected: no Ray node")
    assert (far["capacity_bytes"], far["resident_bytes"], far["resident"]) == (16 * GIB, 0, [])
    assert far["roles"] == {
        "big": {
            "phase": "moved",
            "moved_to": "box",
            "reason": "node far is not connected",
            "latency_class": "batch",
            "sticky": False,
            "resident_bytes": 4 * GIB,
            "running": 0,
            "queued": 0,
            "idle_s": None,
            "measured_rss_bytes": None,
            "pid": None,
        }
    }
    assert nodes["box"]["connected"] is True
    assert nodes["box"]["address"] == "127.0.0.1"
    assert "chat" in nodes["box"]["roles"]  # type: ignore[operator]
