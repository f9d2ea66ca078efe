"""``rosterd up/ps/load/unload`` on bad input: a clear message and an exit status, no traceback.
Exit 2 for bad input, 3 when no running rosterd up answers."""

from __future__ import annotations

import socket
from pathlib import Path

from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.cli.client_cmd import role_path
from rosterd.fleet.addresses import is_this_machine as is_local_address
from support.up import EXAMPLES

_register()
runner = CliRunner()

EXAMPLE = [str(EXAMPLES / "roster.yaml"), "--overlay", str(EXAMPLES / "overlay.yaml")]


def test_missing_roster_is_exit_2_naming_the_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["up", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml" in result.output
    assert "Traceback" not in result.output


def test_bad_fleet_is_exit_2_with_its_location(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - name: box\n    platform: linux-x86_64\n    memory_gb: lots\n")
    result = runner.invoke(app, ["up", *EXAMPLE, "--fleet", str(fleet)])
    assert result.exit_code == 2
    assert "fleet.yaml" in result.output
    assert "memory_gb" in result.output
    assert "Traceback" not in result.output


def test_port_in_use_is_exit_2_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        result = runner.invoke(
            app,
            [
                "up",
                *EXAMPLE,
                "--fleet",
                str(EXAMPLES / "fleet.yaml"),
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path / "state"),
            ],
        )
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert not list((tmp_path / "state").glob("run/*.json"))  # no backend was started


def test_ps_load_unload_without_a_running_rosterd_say_so() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    for args in (["ps"], ["load", "chat-small"], ["unload", "chat-small"]):
        result = runner.invoke(app, [*args, "--url", url])
        assert result.exit_code == 3
        assert f"no rosterd up answers at {url}" in result.output


def test_load_unload_refuse_a_role_that_is_not_a_plain_token_before_any_request() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens: a request would be exit 3
    url = f"http://127.0.0.1:{port}"
    for action in ("load", "unload"):
        for role in ("../load/scratch-b", "scratch-a?x=1", "a/b", "a b", ".a", "x" * 65):
            result = runner.invoke(app, [action, role, "--url", url])
            assert result.exit_code == 2, (action, role, result.output)
            assert f"ROLE {role!r} is not a plain token" in result.output
            assert "no rosterd up answers" not in result.output
            assert "Traceback" not in result.output


def test_role_path_is_one_percent_encoded_segment() -> None:
    assert role_path("load", "scratch-a") == "/rosterd/load/scratch-a"
    assert role_path("unload", "Qwen2.5-7B_v1") == "/rosterd/unload/Qwen2.5-7B_v1"


def test_local_addresses() -> None:
    assert is_local_address("127.0.0.1")
    assert is_local_address("::1")
    assert is_local_address("localhost")
    assert not is_local_address("192.0.2.1")  # TEST-NET-1: never this machine
    assert not is_local_address("studio.example")


def test_remote_nodes_are_planned_but_not_started_here(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {name: here, memory_gb: 4, reserved_gb: 1, platform: linux-x86_64,"
        " flavors: [llamacpp], address: 127.0.0.1}\n"
        "  - {name: studio, memory_gb: 64, reserved_gb: 8, platform: macos-arm64,"
        " address: 192.0.2.1}\n"
    )
    with socket.socket() as held:  # stop right after the plan: the port is taken
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        result = runner.invoke(
            app,
            [
                "up",
                *EXAMPLE,
                "--fleet",
                str(fleet),
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path),
            ],
        )
    said = " ".join(result.output.split())  # independent of the terminal's width
    assert "node studio at 192.0.2.1 is not this machine" in said
    assert "remote: not started here" in said
