"""Two copies of one role on two nodes that one ``rosterd up`` runs itself, without Ray
(nodes ``a`` and ``b``, both at 127.0.0.1, one supervisor): the lab's files and the
options of the run that serves it, shared by the tests of local copies. No tests here."""

from __future__ import annotations

import json
from pathlib import Path

from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port

#: The two nodes, each holding a copy of ``chat``.
NODES = ("a", "b")


def write_copies_lab(
    tmp: Path, gguf: Path, port: int, ctx_size: int | None = None
) -> tuple[Path, Path, Path]:
    """Roster, overlay and fleet in ``tmp``: one interactive llama.cpp role ``chat`` (0.3 GiB,
    roster port ``port``) on the weights ``gguf``, with ``replicas: 2`` on two nodes of 1 GiB
    at 127.0.0.1, ``a`` and ``b``; a context of ``ctx_size`` tokens where given, and no
    ``parallel``: each copy has rosterd's default slots."""
    roster = tmp / "roster.yaml"
    entry = {"id": "chat", "role": "test", "name": "chat", "repo": "local/chat", "ram_gb": 0.3}
    entry |= {"backend": "llama.cpp", "port": port, "status": "live"}
    roster.write_text(json.dumps({"roster": [entry]}))
    overlay = tmp / "overlay.yaml"
    overlay.write_text(json.dumps({"latency_class": {"chat": "interactive"}}))
    fleet = tmp / "fleet.yaml"
    nodes = [
        {"name": name, "memory_gb": 2, "reserved_gb": 1, "platform": "linux-x86_64"}
        | {"flavors": ["llamacpp"], "address": "127.0.0.1"}
        for name in NODES
    ]
    source: dict[str, object] = {"path": str(gguf), "replicas": 2, "grace_s": 2}
    source |= {"extra_args": ["-t", "1"]}
    if ctx_size is not None:
        source["ctx_size"] = ctx_size
    lab = {"nodes": nodes, "models": {"chat": source}, "model_roots": [str(gguf.parent)]}
    fleet.write_text(json.dumps(lab))
    return roster, overlay, fleet


def copies_options(tmp: Path, lab: tuple[Path, Path, Path]) -> UpOptions:
    """How the tests run ``up`` on a :func:`write_copies_lab` ``lab``: a free port, the state
    folder ``tmp/state``, requests queued up to 60 s, warmed up at start, 2 s of grace."""
    roster, overlay, fleet = lab
    return UpOptions(
        roster_path=roster,
        overlay_path=overlay,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp / "state",
        limits=SchedulerLimits(queue_timeout_s=60.0),
        warm_up=True,
        grace_s=2.0,
    )
