"""ollama roles through the scheduler: one shared server per node, roles loaded and unloaded in it.

Ollama cannot run on the test machine, so this uses the FAKE ollama server of
``tests/support/fake_ollama.py`` (it follows Ollama's documented ``/api/generate`` and
``/api/ps`` calls). What is checked is rosterd's side: the node's server is
started once, under the supervisor, however many roles ask at once; a role's
load is a ``keep_alive: -1`` generate; its eviction unloads it and returns only
once ``/api/ps`` no longer lists it; the budget holds across a swap.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from rosterd.adapters import Adapter, OllamaAdapter, WeightsSource, adapter_for
from rosterd.backends.local import SupervisorBackends
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec, ServeSpec
from rosterd.supervisor import Supervisor
from support.ollama import fake_ollama_binary

GIB = 2**30


def ollama_spec(role: str, model: str, gib: int) -> InferenceSpec:
    return InferenceSpec(
        role=role,
        flavor=InferFlavor.OLLAMA,
        model=model,
        serve=ServeSpec(port=11434),
        memory=MemorySpec(weights_bytes=gib * GIB),
        sticky=False,
    )


async def test_ollama_roles_share_one_server_and_swap_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OLLAMA_MODELS", "qwen3:8b=5000000000,llama3.2:1b=1300000000")
    fake = OllamaAdapter(binary=str(fake_ollama_binary(tmp_path)))

    def adapters(flavor: InferFlavor) -> Adapter:
        return fake if flavor is InferFlavor.OLLAMA else adapter_for(flavor)

    def no_weights(spec: InferenceSpec) -> WeightsSource:
        raise AssertionError("ollama keeps its own weights")

    specs = {
        "general": ollama_spec("general", "qwen3:8b", 5),
        "small": ollama_spec("small", "llama3.2:1b", 2),
    }
    supervisor = Supervisor(tmp_path / "state", grace_s=2.0)
    backends = SupervisorBackends(
        supervisor,
        specs,
        host="127.0.0.1",
        resolve_weights=no_weights,
        auto_ports=True,
        ready_timeout_s=20.0,
        adapters=adapters,
        node="box",
    )
    limits = SchedulerLimits(min_busy_residency_s=0.0, tick_s=0.02)
    node = NodeScheduler("box", 6 * GIB, specs, backends, limits=limits)  # fits one at a time
    node.start()
    try:
        leases = await asyncio.gather(node.acquire("general"), node.acquire("general"))
        assert supervisor.names() == ("ollama.box",)  # one server for the node
        server = leases[0].endpoint.base_url
        assert leases[0].endpoint.served_model == "qwen3:8b"
        async with httpx.AsyncClient(base_url=server) as client:
            assert await fake.resident(client, timeout_s=5) == {"qwen3:8b": 5_000_000_000}
            for lease in leases:
                node.release(lease)
            small = await node.acquire("small")  # needs the room: general is unloaded first
            assert await fake.resident(client, timeout_s=5) == {"llama3.2:1b": 1_300_000_000}
            node.release(small)
        kinds = [(e.kind, e.role) for e in node.events]
        assert ("stopped", "general") in kinds
        assert kinds.index(("stopped", "general")) < kinds.index(("loading", "small"))
        assert all(e.resident_bytes <= 6 * GIB for e in node.events)
    finally:
        await node.shutdown()
        await supervisor.stop_all()
    assert supervisor.names() == ()
