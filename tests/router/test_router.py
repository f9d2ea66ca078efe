"""The router's HTTP contract, served by uvicorn on 127.0.0.1, without a model.

Backends here are stand-ins (a load that sleeps, a load that fails, an
endpoint nobody listens on), because these tests are about what clients see
before and around the backend: OpenAI-shaped errors with the right status and
``Retry-After``, API keys, body limits, ``/v1/models``, ``/status``,
``/metrics``. Real llama-server backends are exercised in ``test_up_*.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn

from rosterd.backends.values import Endpoint
from rosterd.router import RoleRoute, RouterConfig, create_app
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port
from support.router_stand_ins import LIMITS, MIB, chat, serve


def assert_openai_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == code
    assert isinstance(error["message"], str)
    return str(error["message"])


async def test_unknown_model_is_404_naming_the_known_ones() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient() as client:
        r = await client.post(f"{up.url}/v1/chat/completions", json=chat("gpt-9"))
        message = assert_openai_error(r, 404, "model_not_found")
        assert "gpt-9" in message
        assert "dead, slow" in message.replace("broken, ", "")


async def test_bad_bodies_get_400_and_413() -> None:
    config = RouterConfig(max_body_bytes=1000)
    async with serve(limits=LIMITS, config=config) as up, httpx.AsyncClient() as client:
        url = f"{up.url}/v1/chat/completions"
        assert_openai_error(await client.post(url, content=b"{not json"), 400, "invalid_json")
        assert_openai_error(await client.post(url, json={"messages": []}), 400, "model_missing")
        big = {"model": "dead", "prompt": "x" * 5000}
        assert_openai_error(await client.post(url, json=big), 413, "body_too_large")

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(10):
                yield b" " * 500

        r = await client.post(url, content=chunked())
        assert_openai_error(r, 413, "body_too_large")


async def test_api_keys_are_required_everywhere_but_health() -> None:
    config = RouterConfig(api_keys=("k-one", "k-two"))
    async with serve(limits=LIMITS, config=config) as up, httpx.AsyncClient() as client:
        assert (await client.get(f"{up.url}/health")).status_code == 200
        for path in ("/v1/models", "/status", "/metrics", "/rosterd/ps"):
            r = await client.get(f"{up.url}{path}")
            assert_openai_error(r, 401, "invalid_api_key")
        wrong = {"Authorization": "Bearer k-three"}
        r = await client.get(f"{up.url}/v1/models", headers=wrong)
        assert "invalid" in assert_openai_error(r, 401, "invalid_api_key")
        for key in ("k-one", "k-two"):
            ok = await client.get(f"{up.url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200


async def test_models_lists_roles_with_their_other_names() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient() as client:
        data = (await client.get(f"{up.url}/v1/models")).json()
        assert data["object"] == "list"
        by_id = {m["id"]: m for m in data["data"]}
        assert sorted(by_id) == ["broken", "dead", "slow"]
        assert by_id["slow"]["aliases"] == ["slow-alias", "slow-model"]


async def test_full_queue_is_429_and_a_long_wait_is_503_both_with_retry_after() -> None:
    limits = SchedulerLimits(max_queue=1, queue_timeout_s=0.5, tick_s=0.02)
    async with serve(limits=limits, load_s=1.5) as up, httpx.AsyncClient(timeout=10) as client:
        url = f"{up.url}/v1/chat/completions"
        first = asyncio.create_task(client.post(url, json=chat("slow")))
        await asyncio.sleep(0.2)  # the first waits for the 1.5 s load and fills the queue
        second = await client.post(url, json=chat("slow-alias"))
        assert_openai_error(second, 429, "queue_full")
        assert int(second.headers["retry-after"]) >= 1
        r = await first
        assert_openai_error(r, 503, "queue_timeout")
        assert int(r.headers["retry-after"]) >= 1


async def test_backend_failures_are_502() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient(timeout=10) as client:
        url = f"{up.url}/v1/chat/completions"
        r = await client.post(url, json=chat("broken"))
        assert "invalid model file" in assert_openai_error(r, 502, "backend_load_failed")
        r = await client.post(url, json=chat("dead-model"))
        assert "dead" in assert_openai_error(r, 502, "backend_error")


async def test_status_and_metrics_report_what_happened() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient(timeout=10) as client:
        await client.post(f"{up.url}/v1/chat/completions", json=chat("dead"))
        status = (await client.get(f"{up.url}/status")).json()
        node = status["nodes"]["n1"]
        assert node["capacity_bytes"] == 100 * MIB
        assert node["resident"] == ["dead"]
        assert node["roles"]["dead"]["phase"] == "ready"
        text = (await client.get(f"{up.url}/metrics")).text
        assert 'rosterd_requests_total{code="502",endpoint="chat",role="dead"} 1.0' in text
        assert 'rosterd_loads_total{cause="request",node="n1",role="dead"} 1.0' in text
        assert 'rosterd_resident_bytes{node="n1"}' in text
        events = (await client.get(f"{up.url}/rosterd/events")).json()["events"]
        assert [e["kind"] for e in events] == ["loading", "loaded"]


async def test_admin_load_and_unload() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient(timeout=10) as client:
        r = await client.post(f"{up.url}/rosterd/load/slow-model")
        assert r.status_code == 200
        assert r.json()["role"] == "slow"
        ps = (await client.get(f"{up.url}/rosterd/ps")).json()
        assert ps["nodes"]["n1"]["resident"] == ["slow"]
        r = await client.post(f"{up.url}/rosterd/unload/slow")
        assert r.status_code == 200
        ps = (await client.get(f"{up.url}/rosterd/ps")).json()
        assert ps["nodes"]["n1"]["resident"] == []
        r = await client.post(f"{up.url}/rosterd/load/nope")
        assert_openai_error(r, 404, "model_not_found")


async def test_admin_load_and_unload_refuse_a_role_that_is_not_a_plain_token() -> None:
    async with serve(limits=LIMITS) as up, httpx.AsyncClient(timeout=10) as client:
        for action in ("load", "unload"):
            for raw in ("slow%3Fx%3D1", "%2E%2E", "slow%20model", "-slow", "s" * 65):
                r = await client.post(f"{up.url}/rosterd/{action}/{raw}")
                message = assert_openai_error(r, 400, "invalid_role")
                assert "not a plain token" in message
                assert r.json()["error"]["type"] == "invalid_request_error"
        ps = (await client.get(f"{up.url}/rosterd/ps")).json()
        assert ps["nodes"]["n1"]["resident"] == []  # nothing was loaded


async def test_a_request_the_backend_drops_unanswered_is_sent_once_more() -> None:
    """A backend closing the connection without a response byte (a keep-alive connection
    it was closing) never took the request: the router sends it again, once."""
    connections = 0

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        if connections > 1:
            body = b'{"choices": []}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(backend, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]

    class Backends(NoLiveness):
        async def start(self, role: str) -> Endpoint:
            return Endpoint(f"http://127.0.0.1:{upstream_port}", role)

        async def stop(self, role: str) -> None:
            return None

    specs = {
        "a": InferenceSpec(role="a", flavor=InferFlavor.LLAMACPP, model="a", memory=MemorySpec(MIB))
    }
    node = NodeScheduler("n1", 100 * MIB, specs, Backends(), limits=LIMITS)
    app = create_app(NodeDirectory({"n1": node}), {"a": RoleRoute("a")})
    port = pick_free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(200):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.02)
            r = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat("a"))
        assert r.status_code == 200, r.text
        assert connections == 2
    finally:
        server.should_exit = True
        await task
        await node.shutdown()
        upstream.close()
        await upstream.wait_closed()
