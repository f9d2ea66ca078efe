"""``rosterd up``'s plan header counts the skipped roster entries as ``rosterd roster
import`` and ``rosterd plan`` do, also when the fleet gives an alias other weights so that
up serves it as a role of its own (issue 33)."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from rosterd.cli.up_report import ConsoleReporter
from rosterd.fleet_scheduler.effects import ShowPlan
from rosterd.placement import Plan, plan
from rosterd.placement.problem import NodePlan
from rosterd.roster.importer import load_roster
from rosterd.up import config as up_config
from rosterd.up.options import UpOptions
from rosterd.up.report import plan_table
from support.fleet_bench import config as fleet_config
from support.fleet_bench import node
from support.specs import spec


def test_up_counts_an_alias_it_serves_apart_as_the_import_skipped_it(tmp_path: Path) -> None:
    entry = "role: chat, ram_gb: 0.1, backend: llama.cpp, status: live"
    roster = tmp_path / "roster.yaml"
    roster.write_text(f"roster:\n  - {{id: a, {entry}}}\n  - {{id: b, {entry}}}\n")
    for name in ("one.gguf", "two.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "nodes:\n  - {name: box, memory_gb: 8, reserved_gb: 1, platform: linux-x86_64, "
        "address: 127.0.0.1}\n"
        f"models:\n  a: {{path: {tmp_path / 'one.gguf'}}}\n  b: {{path: {tmp_path / 'two.gguf'}}}\n"
    )
    assert len(load_roster(roster, None).skipped) == 1  # the import: b, an alias of a

    served, fleet = up_config.read_files(UpOptions(roster, fleet_path=fleet_file))
    config = up_config.gather(served, fleet, tmp_path / "state")
    planned = plan([s.spec for s in config.roster.specs], fleet)
    assert set(planned.placements) == {"a", "b"}  # up serves b on its own weights
    out = Console(file=io.StringIO(), width=400, highlight=False)
    ConsoleReporter(out, out).plan(plan_table(ShowPlan(planned, config, ("box",))))
    said = " ".join(out.file.getvalue().split())  # type: ignore[attr-defined]
    assert "skipped roster entries: 1 (see `rosterd roster import`)" in said
    assert "of those skipped as aliases, 1 (b) served as roles of their own" in said


def test_up_names_a_further_copy_on_its_nodes_other_device_as_ps_does() -> None:
    # replicas: 2 on one node's two GPUs: the start's table names the second copy chat~2,
    # as rosterd ps and /status do, not chat a second time.
    box = node("box", 8)
    config = fleet_config([spec("chat", 1, interactive=True)], [box])
    planned = Plan(
        {"chat": "box"},
        (),
        {"box": NodePlan(box.capacity_bytes, ("chat",), ())},
        "test",
        copies={"chat": ("box",)},
    )
    table = plan_table(ShowPlan(planned, config, ("box",)))
    assert [row.role for row in table.nodes[0].rows] == ["chat", "chat~2"]
