"""Hostile HTTP input against a running ``rosterd up``: its OpenAPI document fuzzed with
schemathesis, and slow and malformed clients (slowloris headers, a half-sent body,
pipelined garbage, 5,000 idle connections), each cut by a deadline while a normal
client is served as fast as before.

``rosterd up`` serves one role in front of the fast stand-in backend
(tests/support/fake_llama_server.py) so that requests naming it reach a backend.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi import checks as openapi_checks

from rosterd.router.dialects.envelope import ANTHROPIC_PATHS
from rosterd.router.ollama.catalog import STORE_PATHS
from rosterd.router.ollama.routes import OLLAMA_PREFIX
from rosterd.up.http_protocol import BODY_IDLE_TIMEOUT_S, HEADER_TIMEOUT_S
from support.reliability import (
    budget,
    documented_error,
    print_figures,
    raise_nofile,
    start_fake_up,
)
from support.up import Up

pytestmark = [pytest.mark.slow, pytest.mark.reliability]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Up]:
    """One ``rosterd up`` for the module; stopped by its own handle."""
    raise_nofile(12000)
    served = start_fake_up(tmp_path_factory.mktemp("up"), tiny_gguf)
    try:
        yield served
    finally:
        assert served.stop() == 0
        log = served.output()
        assert "Traceback" not in log, log[-4000:]


FUZZ_EXAMPLES_PER_OPERATION = 40
#: Documented operations not fuzzed: they never end (the event stream, a followed log) or
#: change the running ``up`` (a reload).
NOT_FUZZED = {
    ("GET", "/rosterd/events/stream"),
    ("GET", "/rosterd/logs/{role}"),
    ("POST", "/rosterd/reload"),
}


def test_openapi_fuzzing_finds_no_500_and_only_documented_errors(
    up: Up, long_reliability: bool
) -> None:
    """Every operation of ``/openapi.json``, fuzzed (schemathesis's strategies through
    hypothesis, sent over real HTTP): no 5xx but those documented, responses as
    documented, no traceback, every error in the OpenAI shape with a documented code."""
    schema = schemathesis.openapi.from_url(up.url + "/openapi.json")
    examples = FUZZ_EXAMPLES_PER_OPERATION * (25 if long_reliability else 1)
    sent = {"requests": 0}
    checks = [
        openapi_checks.status_code_conformance,
        openapi_checks.content_type_conformance,
        openapi_checks.response_schema_conformance,
    ]
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    operations = [op for op in operations if (op.method.upper(), op.path) not in NOT_FUZZED]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
            response = case.call(base_url=up.url, timeout=30)
            sent["requests"] += 1
            case.validate_response(response, checks=checks)
            store = case.operation.path in STORE_PATHS or case.operation.path.startswith(
                "/api/blobs/"
            )
            unexpected = (500, 504) if store else (500, 501, 504)
            assert response.status_code not in unexpected, response.text
            assert "Traceback" not in response.text
            if response.status_code >= 400 and case.operation.path.startswith(OLLAMA_PREFIX):
                assert isinstance(response.json().get("error"), str), response.text  # Ollama's
            elif response.status_code >= 400 and case.operation.path in ANTHROPIC_PATHS:
                error = response.json()  # Anthropic's envelope
                assert error["type"] == "error", response.text
                assert isinstance(error["error"]["type"], str), response.text
                assert isinstance(error["error"]["message"], str), response.text
            elif response.status_code >= 400:
                assert documented_error(response.text), response.text

        fuzz()
    print_figures(
        "openapi fuzz", {"operations": len(operations), "requests": sent["requests"], "500s": 0}
    )


def test_the_openapi_document_names_every_endpoint(up: Up) -> None:
    paths = set(up.get("/openapi.json")["paths"])
    assert {"/health", "/status", "/metrics", "/v1/models", "/v1/chat/completions"} <= paths
    assert {"/rosterd/load/{role}", "/rosterd/unload/{role}", "/rosterd/ps"} <= paths
    assert {path for _, path in NOT_FUZZED} <= paths
    assert {"/api/tags", "/api/ps", "/api/chat", "/api/generate", "/api/embed"} <= paths


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> float | None:
    """Seconds until the server closed the connection (all it sends is read), or ``None``."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - started


async def _attack(url: str, idle: int) -> dict[str, object]:
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    request = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    latencies: list[float] = []
    failures: list[str] = []

    async def served_client(rounds: int) -> None:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
            for _ in range(rounds):
                started = time.monotonic()
                reply = await client.post(url + "/v1/chat/completions", json=request)
                latencies.append(time.monotonic() - started)
                if reply.status_code != 200:
                    failures.append(reply.text)
                await asyncio.sleep(0.2)

    await served_client(10)
    baseline = list(latencies)
    latencies.clear()

    async def slowloris() -> float | None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        closed = asyncio.ensure_future(_closed_within(reader, HEADER_TIMEOUT_S + 10))
        for _ in range(int((HEADER_TIMEOUT_S + 10) / 0.5)):
            if closed.done():
                break
            try:
                writer.write(b"X")  # one byte of a header that never ends
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0.5)
        writer.close()
        return await closed

    async def half_body() -> float | None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": "chat", '
        )
        await writer.drain()
        closed = await _closed_within(reader, BODY_IDLE_TIMEOUT_S + 10)
        writer.close()
        return closed

    async def garbage() -> tuple[bytes, float | None]:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00\xff\x16garbage\r\n\r\n" * 4
        )
        await writer.drain()
        answer = b""
        started = time.monotonic()
        try:
            async with asyncio.timeout(10):
                while chunk := await reader.read(65536):
                    answer += chunk
            took: float | None = time.monotonic() - started
        except TimeoutError:
            took = None
        writer.close()
        return answer, took

    async def idle_connection() -> float | None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            failures.append(f"idle connect: {exc}")
            return None
        closed = await _closed_within(reader, HEADER_TIMEOUT_S + 20)
        writer.close()
        return closed

    attacks = asyncio.gather(
        asyncio.gather(*(slowloris() for _ in range(20))),
        half_body(),
        garbage(),
        asyncio.gather(*(idle_connection() for _ in range(idle))),
    )
    served = asyncio.ensure_future(served_client(int((BODY_IDLE_TIMEOUT_S + 5) / 0.25)))
    slow, half, (answer, garbage_s), idles = await attacks
    await served
    return {
        "baseline": baseline,
        "latencies": latencies,
        "failures": failures,
        "slowloris_closed_s": slow,
        "half_body_closed_s": half,
        "garbage_answer": answer,
        "garbage_closed_s": garbage_s,
        "idle_closed_s": idles,
    }


def test_slow_and_malformed_clients_are_cut_and_served_clients_are_not_slowed(up: Up) -> None:
    # Below a soft limit that does not allow them all (no root), fewer, and the figures say so.
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    idle = min(budget(False).idle_connections, soft - 500)
    result = asyncio.run(_attack(up.url, idle))
    baseline, during = result["baseline"], result["latencies"]
    assert isinstance(baseline, list)
    assert isinstance(during, list)
    slow, idles = result["slowloris_closed_s"], result["idle_closed_s"]
    assert isinstance(slow, list)
    assert isinstance(idles, list)
    cut_idle = [s for s in idles if s is not None]
    print_figures(
        "slow clients",
        {
            "idle_connections": idle,
            "idle_cut": len(cut_idle),
            "idle_cut_by_s": round(max(cut_idle, default=0), 1),
            "slowloris_cut_by_s": round(max((s or 999) for s in slow), 1),
            "half_body_cut_s": result["half_body_closed_s"],
            "served_p50_ms_before": round(statistics.median(baseline) * 1000, 1),
            "served_p50_ms_during": round(statistics.median(during) * 1000, 1),
            "served_max_ms_during": round(max(during) * 1000, 1),
        },
    )
    assert not result["failures"], json.dumps(result["failures"][:5])  # type: ignore[index]
    assert all(s is not None and s <= HEADER_TIMEOUT_S + 5 for s in slow), slow
    half = result["half_body_closed_s"]
    assert isinstance(half, float)
    assert half <= BODY_IDLE_TIMEOUT_S + 5
    answer = result["garbage_answer"]
    assert isinstance(answer, bytes)
    # httptools parses what arrived at once: the garbage behind the first request gets
    # the connection a 400 and closed before the first request is answered.
    assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer[:200]
    assert result["garbage_closed_s"] is not None
    assert len(cut_idle) == idle
    assert max(cut_idle) <= HEADER_TIMEOUT_S + 10
    # Served clients are not slowed: the median stays within a few times the quiet one
    # (two shared cores), and no request waits for a slow client's deadline.
    assert statistics.median(during) <= max(0.25, 5 * statistics.median(baseline))
    assert max(during) < HEADER_TIMEOUT_S / 2
