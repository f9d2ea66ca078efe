"""The ollama adapter against a FAKE ollama server (tests/support/fake_ollama.py), because ollama
cannot run on this machine. The fake follows Ollama's documented API for the calls the
adapter makes; the supervisor starts it as the node's one shared `ollama serve`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from rosterd.adapters.ollama import OllamaAdapter
from rosterd.errors import OllamaError
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import Supervisor, run_probe
from support.backends import gone
from support.ollama import fake_ollama_binary


@pytest.fixture
async def ollama(
    tmp_path: Path, free_port: int
) -> AsyncIterator[tuple[OllamaAdapter, httpx.AsyncClient, Supervisor]]:
    adapter = OllamaAdapter(binary=str(fake_ollama_binary(tmp_path)))
    launch = adapter.server_launch(host="127.0.0.1", port=free_port)
    launch = replace(
        launch,
        env={**launch.env, "FAKE_OLLAMA_MODELS": "qwen3:8b=5000000000,llama3.2:1b=1300000000"},
    )
    sup = Supervisor(tmp_path / "state", grace_s=2.0)
    await sup.start("ollama", launch, ready_timeout_s=20)
    try:
        async with httpx.AsyncClient(base_url=launch.base_url) as client:
            yield adapter, client, sup
    finally:
        await sup.stop_all()


async def test_load_unload_and_residency(
    ollama: tuple[OllamaAdapter, httpx.AsyncClient, Supervisor],
) -> None:
    adapter, client, _ = ollama
    assert await adapter.resident(client, timeout_s=5) == {}
    await adapter.load(client, "qwen3:8b", timeout_s=5)
    await adapter.load(client, "llama3.2:1b", timeout_s=5)
    assert await adapter.resident(client, timeout_s=5) == {
        "qwen3:8b": 5_000_000_000,
        "llama3.2:1b": 1_300_000_000,
    }
    await adapter.unload(client, "qwen3:8b", timeout_s=5)
    assert await adapter.resident(client, timeout_s=5) == {"llama3.2:1b": 1_300_000_000}


async def test_unknown_model_is_a_clear_error(
    ollama: tuple[OllamaAdapter, httpx.AsyncClient, Supervisor],
) -> None:
    adapter, client, _ = ollama
    with pytest.raises(OllamaError, match="model 'nope' not found"):
        await adapter.load(client, "nope", timeout_s=5)


async def test_generation_probe(
    ollama: tuple[OllamaAdapter, httpx.AsyncClient, Supervisor],
) -> None:
    adapter, client, _ = ollama
    base = str(client.base_url).rstrip("/")
    good = await run_probe(base, adapter.generation_probe("llama3.2:1b"), timeout_s=5)
    assert good.ok, good.detail
    bad = await run_probe(base, adapter.generation_probe("nope"), timeout_s=5)
    assert not bad.ok
    assert bad.status == 404


async def test_shared_server_stops_like_any_backend(
    ollama: tuple[OllamaAdapter, httpx.AsyncClient, Supervisor],
) -> None:
    adapter, _, sup = ollama
    backend = sup.backend("ollama")
    assert backend is not None
    assert adapter.shared_server
    await sup.stop("ollama")
    assert gone(backend.pid)


def test_role_launch_names_its_model() -> None:
    adapter = OllamaAdapter()
    spec = InferenceSpec(role="coder", flavor=InferFlavor.OLLAMA, model="qwen3:8b")
    launch = adapter.launch(spec, None, host="127.0.0.1", port=11434)
    assert launch.argv == ("ollama", "serve")
    assert launch.env["OLLAMA_HOST"] == "127.0.0.1:11434"
    assert launch.served_model == "qwen3:8b"
    body = adapter.rewrite_request({"model": "coder", "messages": []}, launch.served_model)
    assert body == {"model": "qwen3:8b", "messages": []}
