"""Two real hosts: ``rosterd up --ray-address`` across two network namespaces
(``netns_lab``: 192.0.2.101 runs the Ray head and ``rosterd up``, 192.0.2.102 a Ray
worker). Skipped, with the reason, where ``ip netns`` does not work (not root, no
iproute2) or Ray is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.netns_lab import (
    FIRST_IP,
    SECOND_IP,
    Lab,
    lab,
    listening,
    netns_inode,
    running_fleet,
    stop_group,
    write_lab,
)
from support.polling import eventually_sync
from support.ray_nodes import needs_ray
from support.up import rosterd_argv

__all__ = ["lab"]  # the fixture, used by name


@pytest.mark.slow
@needs_ray
def test_a_role_is_served_from_the_second_hosts_namespace_then_the_firsts_once_it_is_lost(
    lab: Lab, tiny_gguf: Path, llama_server_binary: Path, tmp_path: Path
) -> None:
    files = write_lab(tmp_path, tiny_gguf)
    with running_fleet(lab, tmp_path, files, rosterd_argv(), "--queue-timeout", "60") as fleet:
        up, worker, url, log = fleet.up, fleet.worker, fleet.url, fleet.log
        status = lab.http("GET", f"{url}/status")["body"]
        assert status["nodes"]["far"]["connected"] is True, status
        role = next(iter(status["nodes"]["far"]["roles"]))  # the role planned on the second host
        answer = lab.http(
            "POST", f"{url}/v1/completions", {"model": role, "prompt": "Hi", "max_tokens": 4}
        )
        assert answer["status"] == 200, answer
        info = lab.http("GET", f"{url}/status")["body"]["nodes"]["far"]["roles"][role]
        assert info["base_url"].startswith(f"http://{SECOND_IP}:")
        second_ns = netns_inode(f"/run/netns/{lab.second}")
        servers = list(lab.llama_servers(lab.second))
        assert len(servers) == 1, servers
        (server,) = servers
        assert netns_inode(f"/proc/{server}/ns/net") == second_ns  # it runs on the second host
        assert {ip for ip, _ in listening(server)} == {SECOND_IP}  # on that host's address

        # The second host's Ray processes stop: its role is lost, and moves to the first host.
        stop_group(worker)
        eventually_sync(
            lambda: server not in lab.pids(lab.second),
            what="the role's backend to end",
            timeout_s=60,
            interval_s=0.5,
        )

        def lost() -> bool:
            events = lab.http("GET", f"{url}/rosterd/events")["body"]["events"]
            return any(e["kind"] == "lost" and e["role"] == role for e in events)

        eventually_sync(lost, what="the loss to be recorded", timeout_s=60, interval_s=0.5)
        # Asked while the role is lost (or already moved): served from the first host.
        answer = lab.http(
            "POST", f"{url}/v1/completions", {"model": role, "prompt": "Hi", "max_tokens": 4}
        )
        assert answer["status"] == 200, answer
        events = lab.http("GET", f"{url}/rosterd/events")["body"]["events"]
        moved = [e for e in events if e["kind"] == "moved"]
        assert [(e["role"], e["node"]) for e in moved] == [(role, "far")], events
        assert moved[0]["cause"].startswith("moved to node near: node far is lost"), moved
        status = lab.http("GET", f"{url}/status")["body"]
        assert status["nodes"]["far"]["connected"] is False, status
        assert status["nodes"]["far"]["roles"] == {}, status
        near = status["nodes"]["near"]["roles"]
        assert sorted(near) == ["chat", "code"], status
        assert near[role]["phase"] == "ready", status
        assert near[role]["base_url"].startswith(f"http://{FIRST_IP}:"), status
        port = int(near[role]["base_url"].rsplit(":", 1)[1].split("/")[0])
        first_ns = netns_inode(f"/run/netns/{lab.first}")
        moved_servers = [
            pid for pid in lab.llama_servers(lab.first) if (FIRST_IP, port) in listening(pid)
        ]
        assert len(moved_servers) == 1, moved_servers
        (moved_server,) = moved_servers
        assert netns_inode(f"/proc/{moved_server}/ns/net") == first_ns  # now on the first host
        assert {ip for ip, _ in listening(moved_server)} == {FIRST_IP}
        stop_group(up, 90)  # SIGTERM: rosterd drains and stops everything
        assert up.returncode == 0, log.read_text(errors="replace")
        assert lab.llama_servers(lab.first) == set()  # rosterd stopped them all
        said = " ".join(log.read_text(errors="replace").split())
        assert "node far is lost" in said
        assert f"role {role}: moved to node near: node far is lost" in said
        assert said.rstrip().endswith("rosterd stopped; no backend left running")
