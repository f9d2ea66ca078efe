"""A real mlx_lm.server (on the CPU through `mlx-lm[cpu]`) on a tiny random MLX llama model,
started by the supervisor from the mlx_lm adapter's launch, offline (HF_HUB_OFFLINE=1).
Skipped with the reason when mlx or mlx_lm is not installed."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from rosterd.adapters.mlx_lm import MlxLmAdapter
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.supervisor import Supervisor
from rosterd.tokens import GB
from rosterd.weights import ResolvedWeights
from support.backends import gone, port_is_free

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def tiny_mlx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random MLX llama model folder (mlx_lm's own classes, a small BPE vocab)."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx-lm[cpu]')")
    pytest.importorskip("mlx_lm", reason="mlx_lm is not installed (pip install 'mlx-lm[cpu]')")
    from support.tiny_mlx import write_tiny_mlx_model

    return write_tiny_mlx_model(tmp_path_factory.mktemp("mlx") / "tiny-mlx")


async def test_mlx_lm_server_lifecycle(
    tmp_path: Path, tiny_mlx_model: Path, free_port: int
) -> None:
    hub_cache = tmp_path / "hf-hub"
    hub_cache.mkdir()
    adapter = MlxLmAdapter(hf_hub_cache=str(hub_cache))
    spec = InferenceSpec(
        role="planner-tiny",
        flavor=InferFlavor.MLX_LM,
        model="tiny-mlx",
        memory=MemorySpec(weights_bytes=GB // 10),
    )
    launch = adapter.launch(
        spec, ResolvedWeights(path=tiny_mlx_model), host="127.0.0.1", port=free_port
    )
    assert launch.env["HF_HUB_OFFLINE"] == "1"
    sup = Supervisor(tmp_path / "state", grace_s=5.0, initial_backoff_s=0.2)
    try:
        backend = await sup.start("planner-tiny", launch, ready_timeout_s=90)
        # A client names the role; the rewrite makes the server use what it loaded
        # (any other name would make mlx_lm look for it in the hub, offline: an error).
        body = adapter.rewrite_request(
            {"model": "planner-tiny", "prompt": "hello", "max_tokens": 3}, launch.served_model
        )
        async with httpx.AsyncClient() as client:
            answer = await client.post(backend.base_url + "/v1/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["finish_reason"] in {"length", "stop"}
            wrong = await client.post(
                backend.base_url + "/v1/completions",
                json={"model": "planner-tiny", "prompt": "hello", "max_tokens": 1},
                timeout=60,
            )
            assert wrong.status_code != 200  # why the router must rewrite the model field
        probe = await sup.probe(
            "planner-tiny", adapter.generation_probe(launch.served_model), timeout_s=30
        )
        assert probe.ok, probe.detail

        os.kill(backend.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        restarted = None
        while time.monotonic() < deadline:
            restarted = sup.backend("planner-tiny")
            if restarted is not None and restarted.ready and restarted.pid != backend.pid:
                break
            await asyncio.sleep(0.1)
        assert restarted is not None
        assert restarted.pid != backend.pid
        assert restarted.ready

        await sup.stop("planner-tiny")
        assert gone(restarted.pid)
        assert port_is_free(free_port)
    finally:
        await sup.stop_all()
