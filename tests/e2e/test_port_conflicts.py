"""Port conflicts found at plan time: two placed roles on one node and port, or a role on
the router's port, are reported by ``rosterd plan`` and ``rosterd up`` with both names
(the later role unplaced), and not under ``--auto-backend-ports``.

The check itself is pure (``rosterd.placement.conflicts``); the commands run on real
files, ``up`` in this event loop (``serving``, an ``UpRun``) on a real llama-server.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

import support.specs as spec_helpers
from rosterd.cli import _register, app
from rosterd.fleet.local import local_fleet
from rosterd.placement import plan
from rosterd.placement.conflicts import port_conflicts, without_port_conflicts
from rosterd.spec import InferenceSpec, InferFlavor, ServeSpec
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

_register()
MIB = 2**20


def _spec(role: str, port: int | None, flavor: InferFlavor = InferFlavor.LLAMACPP) -> InferenceSpec:
    spec = spec_helpers.spec(role, 10, unit=MIB, model=role, flavor=flavor)
    return dataclasses.replace(spec, serve=ServeSpec(port))


def test_the_later_of_two_roles_on_one_port_is_unplaced_naming_both() -> None:
    specs = [_spec("first", 8301), _spec("second", 8301), _spec("third", 8302)]
    fleet = local_fleet()
    node = fleet.nodes[0].name
    result = plan(specs, fleet)
    checked = without_port_conflicts(result, specs, router_port=None, router_nodes=[node])
    assert set(checked.placements) == {"first", "third"}
    [(role, reason)] = checked.unplaced
    assert role == "second"
    assert f"port 8301 on node {node} is taken by role first" in reason
    assert "give second or first another port" in reason
    assert "--auto-backend-ports" in reason
    assert "second" not in checked.nodes[node].swappable


def test_a_role_on_the_routers_port_is_unplaced_on_this_machine_only() -> None:
    specs = [_spec("clash", 8400)]
    fleet = local_fleet()
    node = fleet.nodes[0].name
    result = plan(specs, fleet)
    [(role, reason)] = port_conflicts(result, specs, router_port=8400, router_nodes=[node])
    assert role == "clash"
    assert "rosterd's own router port (--port)" in reason
    assert port_conflicts(result, specs, router_port=8400, router_nodes=[]) == []


def test_roles_of_a_shared_server_share_its_port() -> None:
    specs = [_spec(r, 11434, InferFlavor.OLLAMA) for r in ("o1", "o2")]
    result = plan(specs, local_fleet())
    shared = [InferFlavor.OLLAMA]
    checked = port_conflicts(
        result, specs, router_port=None, router_nodes=[], shared_flavors=shared
    )
    assert checked == []


def _files(tmp_path: Path, port: int) -> tuple[Path, Path]:
    entries = [
        llama_entry("chat-a", "tiny-a", 0.1, port),
        llama_entry("chat-b", "tiny-b", 0.1, port),
    ]
    roster = write_roster(tmp_path / "roster.yaml", entries)
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 256},
            "tiny-b": {"path": str(MODELS / "tiny-b.gguf"), "ctx_size": 256},
        },
        address="127.0.0.1",
    )
    return roster, fleet


def test_plan_reports_the_conflict_unless_auto_backend_ports(tmp_path: Path) -> None:
    roster, fleet = _files(tmp_path, 18611)
    runner = CliRunner()
    shown = runner.invoke(app, ["plan", str(roster), "--fleet", str(fleet), "--json"])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert "chat-b" not in data["placements"]
    [[role, reason]] = data["unplaced"]
    assert role == "chat-b"
    assert "port 18611 on node box is taken by role chat-a" in reason
    auto = runner.invoke(
        app, ["plan", str(roster), "--fleet", str(fleet), "--json", "--auto-backend-ports"]
    )
    assert json.loads(auto.output)["unplaced"] == []
    on_router = runner.invoke(
        app, ["plan", str(roster), "--fleet", str(fleet), "--json", "--port", "18611"]
    )
    reasons = [reason for _, reason in json.loads(on_router.output)["unplaced"]]
    assert len(reasons) == 2
    assert all("rosterd's own router port" in r for r in reasons)


@pytest.mark.slow
async def test_up_serves_the_first_role_and_names_the_conflict(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    prepare_example_models()
    roster, fleet = _files(tmp_path, pick_free_port())
    out = Console(file=io.StringIO(), width=300, highlight=False)
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        warm_up=False,
    )
    async with (
        serving(options, out=out, stop_timeout_s=60) as up,
        httpx.AsyncClient(base_url=up.url, trust_env=False, timeout=60) as client,
    ):
        ok = await client.post(
            "/v1/completions", json={"model": "chat-a", "prompt": "hi", "max_tokens": 2}
        )
        assert ok.status_code == 200, ok.text
        refused = await client.post(
            "/v1/completions", json={"model": "chat-b", "prompt": "hi", "max_tokens": 2}
        )
        # a role the plan could not place: 503 model_unplaced with the plan's reason
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "model_unplaced"
        assert "is taken by role chat-a" in refused.json()["error"]["message"]
    stream = out.file
    assert isinstance(stream, io.StringIO)
    printed = " ".join(stream.getvalue().split())
    assert "chat-b" in printed
    assert "is taken by role chat-a" in printed
