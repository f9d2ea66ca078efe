"""A real llama-server, started by the supervisor from the llamacpp adapter's launch.

Uses the tiny random GGUF (loads in milliseconds, writes garbage) for the process
lifecycle and, in one slow test, the real gemma-3-270m Q4_K_M GGUF (253 MB) for real
text. Skipped with the reason when llama-server has not been built
(`scripts/build-llama-server`)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.supervisor import BackendStartError, Supervisor
from rosterd.supervisor.process import REASON_CHARS
from rosterd.tokens import GB
from rosterd.weights import ResolvedWeights
from support.backends import (
    gone,
    kill_rosterd_child,
    port_is_free,
    run_rosterd_child,
    wait_gone,
    wait_port_free,
)
from support.specs import GEMMA_CHAT_SMALL

pytestmark = pytest.mark.slow

# Two threads: the machine has two cores; more would only contend.
THREADS = ("-t", "2")


def tiny_spec(role: str = "voice-lite", model: str = "tiny-voice") -> InferenceSpec:
    return InferenceSpec(
        role=role,
        flavor=InferFlavor.LLAMACPP,
        model=model,
        memory=MemorySpec(weights_bytes=GB // 10),
    )


def weights_of(path: Path, ctx_size: int) -> ResolvedWeights:
    """``path`` served with ``ctx_size`` tokens, one slot and two threads."""
    return ResolvedWeights(
        path=path,
        ctx_size=ctx_size,
        parallel=1,
        extra_args=THREADS,
        size_bytes=path.stat().st_size,
    )


async def complete(base_url: str, model: str, prompt: str, max_tokens: int = 4) -> str:
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            base_url + "/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
            timeout=60,
        )
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["text"]
    assert isinstance(text, str)
    return text


async def wait_restarted(sup: Supervisor, name: str, old_pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        backend = sup.backend(name)
        if backend is not None and backend.ready and backend.pid != old_pid:
            return backend.pid
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} was not restarted within {timeout_s} s")


async def test_tiny_model_lifecycle(
    tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path, free_port: int
) -> None:
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    spec = tiny_spec()
    weights = weights_of(tiny_gguf, 512)
    launch = adapter.launch(spec, weights, host="127.0.0.1", port=free_port)
    sup = Supervisor(tmp_path / "state", grace_s=5.0, initial_backoff_s=0.2)
    try:
        backend = await sup.start("voice-lite", launch)
        # The request names the role's model; the adapter's rewrite is what the router sends.
        body = adapter.rewrite_request({"model": "voice-lite", "prompt": "Hi"}, launch.served_model)
        assert body["model"] == "tiny-voice"
        assert await complete(backend.base_url, "tiny-voice", "Hello") != ""
        probe = await sup.probe(
            "voice-lite", adapter.generation_probe(launch.served_model), timeout_s=30
        )
        assert probe.ok, probe.detail

        # kill -9 the server: the supervisor restarts it and it serves again.
        os.kill(backend.pid, signal.SIGKILL)
        new_pid = await wait_restarted(sup, "voice-lite", backend.pid, timeout_s=30)
        assert await complete(backend.base_url, "tiny-voice", "Again") != ""
        assert psutil.Process(new_pid).memory_info().rss > 0

        await sup.stop("voice-lite")
        assert gone(new_pid)  # memory is released: the process has exited
        assert port_is_free(free_port)
        log = sup.log_path("voice-lite").read_text(errors="replace")
        assert log.count("--- rosterd: starting voice-lite") == 2
    finally:
        await sup.stop_all()


async def test_llama_server_exit_during_load_reports_its_stderr(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    launch = adapter.launch(
        tiny_spec(),
        ResolvedWeights(path=broken, extra_args=THREADS),
        host="127.0.0.1",
        port=free_port,
    )
    sup = Supervisor(tmp_path / "state")
    with pytest.raises(BackendStartError) as info:
        await sup.start("voice-lite", launch, ready_timeout_s=60)
    err = info.value
    assert err.exit_code not in (None, 0)
    assert err.output_tail, "the error quotes llama-server's last lines"
    assert "model" in "\n".join(err.output_tail).lower()
    assert gone(err.pid)


async def test_a_corrupt_gguf_fails_with_llama_servers_reason_in_the_first_line(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    corrupt = tmp_path / "model.gguf"
    corrupt.write_bytes(random.Random(7).randbytes(4096))  # not a GGUF at all
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    launch = adapter.launch(
        tiny_spec(),
        ResolvedWeights(path=corrupt, extra_args=THREADS),
        host="127.0.0.1",
        port=free_port,
    )
    sup = Supervisor(tmp_path / "state")
    with pytest.raises(BackendStartError) as info:
        await sup.start("voice-lite", launch, ready_timeout_s=60)
    # The first line is what `rosterd up` prints and a client's 503 quotes: it says why.
    first = str(info.value).splitlines()[0]
    assert first.startswith("backend voice-lite exited with code 1 before it was ready: ")
    reason = first.removeprefix("backend voice-lite exited with code 1 before it was ready: ")
    assert "invalid magic" in reason
    assert "failed to load model" in reason
    assert len(reason) <= REASON_CHARS
    assert not re.search(r"\d+\.\d+\.\d+\.\d+ E ", reason)  # no llama.cpp time stamps


async def test_no_llama_server_survives_kill_9_of_rosterd(
    tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path, free_port: int
) -> None:
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    launch = adapter.launch(
        tiny_spec(),
        ResolvedWeights(path=tiny_gguf, ctx_size=512, extra_args=THREADS),
        host="127.0.0.1",
        port=free_port,
    )
    rosterd, server_pid = await run_rosterd_child(tmp_path / "state", launch, 60)
    assert not gone(server_pid)
    await kill_rosterd_child(rosterd)
    assert await wait_gone(server_pid, 10), "llama-server outlived the rosterd that started it"
    assert await wait_port_free(free_port)


async def test_real_gemma_writes_real_text(
    tmp_path: Path, gemma_gguf: Path, llama_server_binary: Path, free_port: int
) -> None:
    adapter = LlamaCppAdapter(server_binary=llama_server_binary)
    spec = GEMMA_CHAT_SMALL
    weights = weights_of(gemma_gguf, 1024)
    launch = adapter.launch(spec, weights, host="127.0.0.1", port=free_port)
    sup = Supervisor(tmp_path / "state")
    try:
        backend = await sup.start("chat-small", launch)
        rss = sup.measured_bytes("chat-small")
        assert rss is not None
        assert rss > 0
        text = await complete(
            backend.base_url, "gemma-3-270m", "The capital of France is", max_tokens=8
        )
        print(f"gemma-3-270m: {text!r}; server RSS {rss / 2**20:.0f} MiB")
        assert any(word.isalpha() for word in text.split()), text
        await sup.stop("chat-small")
        assert sup.measured_bytes("chat-small") is None
        assert gone(backend.pid)
        assert port_is_free(free_port)
    finally:
        await sup.stop_all()
