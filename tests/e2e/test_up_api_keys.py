"""``rosterd up`` never serves open by accident: an empty API key is an error, and
listening beyond loopback without a key is warned about."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rosterd.cli import _register, app
from rosterd.up.listen import is_loopback_host
from support.backends import pick_free_port
from support.up import EXAMPLE_LAB, StartUp

_register()
runner = CliRunner()

EXAMPLE = [*EXAMPLE_LAB, "--no-warm-up"]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--api-key", "good", "--api-key", "  "], {}, "--api-key is empty"),
        ([], {"ROSTERD_API_KEY": ""}, "ROSTERD_API_KEY is set but empty"),
        ([], {"ROSTERD_API_KEY": "   "}, "ROSTERD_API_KEY is set but empty"),
    ],
)
def test_an_empty_api_key_is_exit_2_and_serves_nothing(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    result = runner.invoke(
        app,
        ["up", *EXAMPLE, "--port", str(pick_free_port()), "--state-dir", str(tmp_path), *args],
        env=env,
    )
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert named in message
    assert "open to anyone" in message
    assert "Traceback" not in result.output
    assert not (tmp_path / "rosterd.lock").exists()  # stopped before anything started


def test_loopback_hosts() -> None:
    assert is_loopback_host("127.0.0.1")
    assert is_loopback_host("127.1.2.3")
    assert is_loopback_host("::1")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("::")
    assert not is_loopback_host("10.0.0.5")


def test_listening_beyond_loopback_without_a_key_warns(tmp_path: Path, rosterd_up: StartUp) -> None:
    up = rosterd_up([*EXAMPLE, "--host", "0.0.0.0"])
    try:
        output = " ".join(up.output().split())
        assert "warning: listening on 0.0.0.0 without an API key" in output
        assert "--api-key KEY" in output
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_loopback_without_a_key_does_not_warn(tmp_path: Path, rosterd_up: StartUp) -> None:
    up = rosterd_up(EXAMPLE)
    try:
        assert "without an API key" not in up.output()
    finally:
        assert up.stop(signal.SIGINT) == 0
