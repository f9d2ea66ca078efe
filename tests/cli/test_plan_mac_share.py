"""``rosterd plan`` on a Mac that declares no GPU share: its llama.cpp and mlx_lm roles are
planned in Metal's default share, which the plan shows with where its figure comes from; a
fleet of Linux nodes, or a roster of ollama roles alone, plans as before. Planning only: no
process."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.tokens import GB

_register()

SHARE = 16 * GB * 2 // 3

FLEET = """\
nodes:
  - name: air
    memory_gb: 16
    platform: macos-arm64
"""


def _entry(role: str, backend: str, port: int) -> str:
    return (
        f"  - id: {role}\n    role: chat\n    name: {role}-model\n    ram_gb: 6\n"
        f"    backend: {backend}\n    port: {port}\n    status: ready\n"
    )


def _plan(
    tmp_path: Path,
    backend: str,
    fleet: str = FLEET,
    *extra: str,
    planner: str | None = None,
    latency: str = "interactive",
) -> tuple[int, str]:
    """Plan writer (``backend``) and planner (``planner``, else ``backend``), 6 GiB each, of
    ``latency`` class."""
    (tmp_path / "roster.yaml").write_text(
        "roster:\n" + _entry("writer", backend, 8601) + _entry("planner", planner or backend, 8602)
    )
    (tmp_path / "overlay.yaml").write_text(
        f"latency_class:\n  writer: {latency}\n  planner: {latency}\n"
    )
    (tmp_path / "fleet.yaml").write_text(fleet)
    args = ["plan", str(tmp_path / "roster.yaml"), "--overlay", str(tmp_path / "overlay.yaml")]
    args += ["--fleet", str(tmp_path / "fleet.yaml"), "--state-dir", str(tmp_path / "state")]
    done = CliRunner().invoke(app, [*args, "--time-limit", "0.2", *extra])
    return done.exit_code, done.stdout


def test_two_mlx_roles_over_the_default_share_one_placed_and_the_reason_names_it(
    tmp_path: Path,
) -> None:
    code, out = _plan(tmp_path, "mlx_lm", FLEET, "--json")
    assert code == 0, out
    doc = json.loads(out)
    (placed,) = doc["placements"]
    assert doc["devices"]["air"]["MTL0"] == {
        "capacity_bytes": SHARE,
        "peak_bytes": 6 * GB,
        "always_resident": [placed],
        "swappable": [],
        "source": "default",
    }
    [[role, reason]] = doc["unplaced"]
    assert role != placed
    assert "needs 6.00 GiB on one device" in reason
    assert f"MTL0: 4.67 GiB free of 10.67 GiB (held by {placed})" in reason


def test_the_plan_shows_the_default_share_and_how_to_declare_another(tmp_path: Path) -> None:
    code, out = _plan(tmp_path, "mlx_lm")
    assert code == 0, out
    assert "MTL0: [" in out
    assert "6.0 / 10.7 GiB" in out
    assert "Metal's default GPU share (2/3 of memory up to 36 GiB, 3/4 above" in out
    assert "declare gpu_share_gb to override" in out


def test_a_declared_share_overrides_the_default(tmp_path: Path) -> None:
    declared = FLEET + "    devices: [{id: MTL0, gpu_share_gb: 13}]\n"
    code, out = _plan(tmp_path, "mlx_lm", declared, "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert sorted(doc["placements"]) == ["planner", "writer"]
    pool = doc["devices"]["air"]["MTL0"]
    assert (pool["capacity_bytes"], pool["source"]) == (13 * GB, "declared")


def test_an_mlx_and_a_llamacpp_role_over_the_default_share_one_placed_the_reason_names_it(
    tmp_path: Path,
) -> None:
    # 6 + 6 GiB fit the 14 GiB of host RAM, not the 10.67 GiB share: llama-server offloads
    # every layer to Metal, so the llama.cpp role counts there as the mlx one does.
    code, out = _plan(tmp_path, "mlx_lm", FLEET, "--json", planner="llama.cpp")
    assert code == 0, out
    doc = json.loads(out)
    (placed,) = doc["placements"]
    pool = doc["devices"]["air"]["MTL0"]
    assert (pool["capacity_bytes"], pool["source"]) == (SHARE, "default")
    assert pool["always_resident"] == [placed]
    [[role, reason]] = doc["unplaced"]
    assert role != placed
    assert f"MTL0: 4.67 GiB free of 10.67 GiB (held by {placed})" in reason
    assert "declare gpu_share_gb" in reason
    # Batch roles: both placed, swapped in the share one at a time; the llama.cpp role's
    # place is the share, every layer on it (pinned so at launch).
    code, out = _plan(tmp_path, "mlx_lm", FLEET, "--json", planner="llama.cpp", latency="batch")
    doc = json.loads(out)
    assert sorted(doc["placements"]) == ["planner", "writer"]
    pool = doc["devices"]["air"]["MTL0"]
    assert (pool["swappable"], pool["peak_bytes"]) == (["planner", "writer"], 6 * GB)
    assert doc["device_of"]["planner"]["air"]["device"] == "MTL0"
    assert doc["device_of"]["planner"]["air"]["gpu_layers"] is None


def test_a_mac_with_llamacpp_roles_alone_plans_them_in_the_default_share(tmp_path: Path) -> None:
    code, out = _plan(tmp_path, "llama.cpp", FLEET, "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert len(doc["placements"]) == 1
    assert doc["devices"]["air"]["MTL0"]["source"] == "default"


def test_a_mac_with_ollama_roles_alone_and_a_linux_node_plan_as_before(tmp_path: Path) -> None:
    linux = FLEET.replace("macos-arm64", "linux-x86_64")
    for backend, fleet in (("llama.cpp", linux), ("ollama", FLEET)):
        code, out = _plan(tmp_path, backend, fleet, "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert "devices" not in doc
        assert sorted(doc["placements"]) == ["planner", "writer"]
        code, out = _plan(tmp_path, backend, fleet)
        assert "MTL0" not in out
