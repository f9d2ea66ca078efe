"""The names of a role's copies on one ``rosterd up``'s supervisor (``rosterd.backends.copy_names``)
and how this machine's backends give them: a role with one copy keeps its id (its log, run
record, load times and kept KV as before); a role whose fleet entry asks for ``replicas``
runs as ``<role>@<node>`` on each node; a running process keeps the name it started
under; a second copy on the same address does not take the roster's port. Nothing here
starts a process: the supervisor is made, never asked to start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rosterd.backends.copy_names import (
    HeldBackend,
    LocalCopies,
    copy_backend_name,
    copy_unit_name,
    is_copy_of,
    role_of_backend,
    role_of_copy,
    unit_names,
    valid_backend_name,
)
from rosterd.backends.node_host import NodeHost, ServingFacts
from rosterd.backends.values import BackendEvent
from rosterd.errors import BackendNameError
from rosterd.fleet.reader import parse_fleet
from rosterd.supervisor import Supervisor
from support.specs import spec


def test_a_copy_is_named_role_at_node_and_read_back() -> None:
    assert copy_backend_name("chat", "b") == "chat@b"
    assert role_of_backend("chat@b") == ("chat", "b")
    assert role_of_backend("chat") == ("chat", None)
    assert role_of_backend("ollama.box") == ("ollama.box", None)  # a shared server's


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("chat", True),
        ("chat@b", True),
        ("gemma-3.q4@node_2", True),
        ("a" * 64 + "@" + "b" * 64, True),  # each part a plain token of 64 bytes
        ("a" * 65, False),
        ("chat@", False),
        ("@b", False),
        ("chat@b@c", False),
        ("../chat", False),
        ("chat@../b", False),
        ("chat b", False),
        ("chat~2", True),  # a further copy on another device of its node
        ("chat~2@box", True),
        ("chat~x@box", False),
        ("chat~@box", False),
        ("chat~2~3", False),
    ],
)
def test_a_backend_name_is_a_plain_token_or_a_copy_of_two(name: str, valid: bool) -> None:
    assert valid_backend_name(name) is valid


def test_a_further_copy_on_a_node_is_role_tilde_n_and_read_back() -> None:
    assert copy_unit_name("chat", 2) == "chat~2"
    assert role_of_copy("chat~2") == role_of_copy("chat") == "chat"
    assert is_copy_of("chat~2", "chat")
    assert not is_copy_of("chatty", "chat")


async def test_the_supervisor_refuses_a_name_that_is_no_token_nor_a_copy(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    with pytest.raises(BackendNameError, match="chat@b@c"):
        await supervisor.start("chat@b@c", launch=None)  # type: ignore[arg-type]
    assert supervisor.log_path("chat@b") == tmp_path / "logs" / "chat@b.log"


def test_a_second_copy_on_the_same_address_finds_the_roster_port_held() -> None:
    copies = LocalCopies()
    copies.hold("a", "chat", HeldBackend("chat@a", "127.0.0.1", 8311))
    assert copies.port_held_by_other_copy("b", "chat", "127.0.0.1", 8311)
    assert not copies.port_held_by_other_copy("a", "chat", "127.0.0.1", 8311)  # its own
    assert not copies.port_held_by_other_copy("b", "chat", "127.0.0.2", 8311)  # elsewhere
    assert not copies.port_held_by_other_copy("b", "embed", "127.0.0.1", 8311)  # another role
    copies.release("a", "chat")
    assert not copies.port_held_by_other_copy("b", "chat", "127.0.0.1", 8311)


def test_a_further_copy_on_the_same_node_finds_the_first_copys_port_held_and_back() -> None:
    # replicas: 2 on one node's two GPUs: chat and chat~2 both take the roster's port from
    # the role's entry, so whichever starts second must take another.
    copies = LocalCopies()
    copies.hold("box", "chat", HeldBackend("chat@box", "127.0.0.1", 8311))
    assert copies.port_held_by_other_copy("box", "chat~2", "127.0.0.1", 8311)
    assert not copies.port_held_by_other_copy("box", "chat", "127.0.0.1", 8311)  # its own
    assert not copies.port_held_by_other_copy("box", "chatty~2", "127.0.0.1", 8311)
    copies.release("box", "chat")
    copies.hold("box", "chat~2", HeldBackend("chat~2@box", "127.0.0.1", 8311))
    assert copies.port_held_by_other_copy("box", "chat", "127.0.0.1", 8311)


def _facts(tmp_path: Path, replicas: int) -> ServingFacts:
    nodes = [
        {"name": n, "memory_gb": 4, "platform": "linux-x86_64", "address": "127.0.0.1"}
        for n in ("a", "b")
    ]
    models = {"chat": {"path": str(tmp_path / "chat.gguf"), "replicas": replicas}}
    return ServingFacts(parse_fleet(json.dumps({"nodes": nodes, "models": models})))


@pytest.mark.parametrize(("replicas", "names"), [(1, ["chat", "chat"]), (2, ["chat@a", "chat@b"])])
def test_up_names_the_copies_of_a_role_with_replicas_by_node(
    tmp_path: Path, replicas: int, names: list[str]
) -> None:
    host = NodeHost(tmp_path / "state", names_copies=True)
    facts = _facts(tmp_path, replicas)
    specs = {"chat": spec("chat", 0.3)}
    got = [host.backends(n, "127.0.0.1", specs, facts).backend_name("chat") for n in ("a", "b")]
    assert got == names


def test_a_node_agent_keeps_every_role_name(tmp_path: Path) -> None:
    host = NodeHost(tmp_path / "state")  # one node per supervisor: no copy's name
    backends = host.backends("b", "127.0.0.1", {"chat": spec("chat", 0.3)}, _facts(tmp_path, 2))
    assert backends.backend_name("chat") == "chat"


def test_a_running_backend_keeps_the_name_it_started_under(tmp_path: Path) -> None:
    """A reload that asks for copies of a role running alone: its stop, probe and measure
    still reach the process it started as ``chat``; its next start is ``chat@a``."""
    host = NodeHost(tmp_path / "state", names_copies=True)
    host.copies.hold("a", "chat", HeldBackend("chat", "127.0.0.1", 8311))
    specs = {"chat": spec("chat", 0.3)}
    backends = host.backends("a", "127.0.0.1", specs, _facts(tmp_path, 2))
    assert backends.backend_name("chat") == "chat"
    host.copies.release("a", "chat")
    assert backends.backend_name("chat") == "chat@a"


def test_a_copy_event_reaches_its_node_as_the_role(tmp_path: Path) -> None:
    host = NodeHost(tmp_path / "state", names_copies=True)
    facts = _facts(tmp_path, 2)
    specs = {"chat": spec("chat", 0.3)}
    a, b = (host.backends(n, "127.0.0.1", specs, facts) for n in ("a", "b"))
    exited = BackendEvent("chat@b", "exited", pid=42, exit_code=-9)
    assert not a.notice(exited)
    assert b.notice(exited)
    assert b._changes.get_nowait() == BackendEvent("chat", "exited", pid=42, exit_code=-9)


def test_a_nodes_copies_are_named_by_their_units_in_order() -> None:
    assert unit_names(["chat", "code", "chat", "chat"]) == ["chat", "code", "chat~2", "chat~3"]
    assert unit_names([]) == []
