"""What a new user runs into first, over real HTTP: an endpoint the backend does not serve
(llama-server's 501 for embeddings without ``--embeddings``), the messages of the limits
(413, 429, 503 naming the option of ``rosterd up`` that sets them), the client commands
against a ``rosterd up`` that wants a key or given the OpenAI base URL (``.../v1``), what
``rosterd load`` evicted, and ``/openapi.json`` against the routes the app serves.

The client commands run as a user runs them (the ``rosterd`` console script); the router
runs in this process over stand-in backends (``support.router``, ``test_router``), and the
embeddings case on a real llama-server through a real ``rosterd up``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from rosterd.backends.values import Endpoint
from rosterd.router import RoleRoute, create_app
from rosterd.router.routing import RouterConfig
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerLimits
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from support.backends import NoLiveness, pick_free_port
from support.router import MIB, ROLES, NoBackends, serve
from support.router_stand_ins import chat
from support.router_stand_ins import serve as serve_stand_ins
from support.up import llama_entry, rosterd_argv, start_up, write_roster

# --------------------------------------------------------------- what the backend answers

#: llama-server's answer to ``/v1/embeddings`` without ``--embeddings`` (its 0.3.36 build).
LLAMA_501 = (
    b'{"error":{"code":501,"message":"This server does not support embeddings. '
    b'Start it with `--embeddings`","type":"not_supported_error"}}'
)


class StatusServer:
    """An HTTP server on 127.0.0.1 that answers every request with ``status`` and ``body``,
    counting the requests it got."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        await reader.readexactly(length)
        self.requests += 1
        writer.write(
            b"HTTP/1.1 %d Whatever\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (self.status, len(self.body), self.body)
        )
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> StatusServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


class ToPorts(NoLiveness):
    """Each role's backend "starts" at once, at the port ``ports`` gives it."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports

    async def start(self, role: str) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.ports[role]}", role)

    async def stop(self, role: str) -> None:
        return None


async def test_a_backend_501_is_a_400_the_openai_client_does_not_retry(tmp_path: Path) -> None:
    """A 501 (the endpoint is not served) is the request's fault: 400 ``not_supported``,
    which the openai client raises at once (its default ``max_retries`` is 2); a genuine
    5xx stays 502 ``backend_error``, retried as a server error."""
    async with (
        StatusServer(501, LLAMA_501) as no_embed,
        StatusServer(500, b'{"error":{"code":500,"message":"boom"}}') as broken,
    ):
        backends = ToPorts({"chat": no_embed.port, "quiet": broken.port})
        async with serve(tmp_path, backends=backends) as up:
            async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused") as client:
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.embeddings.create(model="chat", input=["hello"])
            assert no_embed.requests == 1  # not retried
            assert refused.value.status_code == 400
            assert refused.value.code == "not_supported"
            message = refused.value.message
            assert "the backend of role 'chat' does not serve embeddings" in message
            assert "This server does not support embeddings" in message
            assert "--embeddings" in message
            assert "extra_args" in message
            assert "models:" in message

            async with openai.AsyncOpenAI(
                base_url=f"{up.url}/v1", api_key="unused", max_retries=0
            ) as once:
                with pytest.raises(openai.APIStatusError) as failed:
                    await once.embeddings.create(model="quiet", input=["hello"])
            assert failed.value.status_code == 502
            assert failed.value.code == "backend_error"
            assert "answered 500" in failed.value.message


#: llama-server's own 400 (its envelope: an integer ``code``, no ``param``).
LLAMA_400 = (
    b'{"error":{"code":400,"message":"unsupported content[].type","type":"invalid_request_error"}}'
)


async def test_a_backends_own_400_comes_in_the_envelope_of_the_path(tmp_path: Path) -> None:
    """The backend's refusal keeps its status and message, in OpenAI's shape on the OpenAI
    paths and Anthropic's on ``/v1/messages`` passed through, as each SDK reads it."""
    async with StatusServer(400, LLAMA_400) as refusing:
        backends = ToPorts({"chat": refusing.port})
        async with serve(tmp_path, backends=backends, native=frozenset({"messages"})) as up:
            async with httpx.AsyncClient(base_url=up.url, trust_env=False) as client:
                plain = await client.post("/v1/chat/completions", json=chat("chat"))
            assert plain.status_code == 400
            assert plain.json() == {
                "error": {
                    "message": "unsupported content[].type",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            async with anthropic.AsyncAnthropic(
                base_url=up.url, api_key="unused", max_retries=0
            ) as claude:
                with pytest.raises(anthropic.BadRequestError) as refused:
                    await claude.messages.create(
                        model="chat", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
                    )
            assert refused.value.body == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "unsupported content[].type"},
            }


def test_embeddings_on_a_real_llama_server_without_the_flag_say_how_to_enable_them(
    tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path
) -> None:
    """llama-server started without ``--embeddings``: the openai client gets one 400 that
    names the role and the fleet's ``extra_args``, and no retry reaches the backend."""
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("chatter", "tiny", 0.1, 8311)])
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {name: here, memory_gb: 4, reserved_gb: 1, platform: linux-x86_64,"
        " flavors: [llamacpp], address: 127.0.0.1}\n"
        f"models:\n  tiny: {{path: {tiny_gguf}}}\n"
        f"model_roots: [{tiny_gguf.parent}]\n"
    )
    up = start_up([str(roster), "--fleet", str(fleet), "--no-warm-up"], tmp_path, pick_free_port())
    try:
        with openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused") as client:
            with pytest.raises(openai.BadRequestError) as refused:
                client.embeddings.create(model="chatter", input=["hello"])
            counted = httpx.get(f"{up.url}/metrics", trust_env=False, timeout=10).text
            # One request, answered 400: the client (max_retries 2) did not retry.
            assert (
                'rosterd_requests_total{code="400",endpoint="embeddings",role="chatter"} 1.0'
                in counted
            ), counted
            assert refused.value.code == "not_supported"
            message = refused.value.message
            assert "role 'chatter' does not serve embeddings (it answered 501" in message
            assert "add --embeddings to extra_args" in message
            # The backend still serves completions.
            reply = client.completions.create(model="chatter", prompt="hi", max_tokens=2)
            assert reply.choices
    finally:
        assert up.stop(signal.SIGINT) == 0
    assert "Traceback" not in up.output()


# --------------------------------------------------------------------- the limits' messages


async def test_the_limits_messages_name_the_options_that_set_them() -> None:
    """413 names ``--max-body``; a full queue's 429 ``--max-queue``; a request that waited
    too long, 503, ``--queue-timeout`` (all options of ``rosterd up``)."""
    limits = SchedulerLimits(max_queue=1, queue_timeout_s=0.5, tick_s=0.02)
    config = RouterConfig(max_body_bytes=1000)
    async with (
        serve_stand_ins(limits=limits, config=config, load_s=2.0) as up,
        httpx.AsyncClient(timeout=30) as client,
    ):
        url = f"{up.url}/v1/chat/completions"
        big = await client.post(url, json={"model": "dead", "prompt": "x" * 5000})
        assert big.status_code == 413
        assert "limit of 1000 bytes (rosterd up's --max-body sets it)" in big.text

        waiting = asyncio.create_task(client.post(url, json=chat("slow")))
        await asyncio.sleep(0.1)  # it is queued, waiting for the 2 s load
        full = await client.post(url, json=chat("slow"))
        assert full.status_code == 429
        assert "rosterd up's --max-queue sets the limit" in full.json()["error"]["message"]
        timed_out = await waiting
        assert timed_out.status_code == 503
        message = timed_out.json()["error"]["message"]
        assert "was not ready within 0.5 s" in message
        assert message.endswith("; rosterd up's --queue-timeout sets the limit")


# ------------------------------------------------------------------- the client commands


def _rosterd(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ROSTERD_API_KEY"}
    if key is not None:
        env["ROSTERD_API_KEY"] = key
    return subprocess.run(
        [*rosterd_argv(), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def _run(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_rosterd, *args, key=key)


CLIENT_COMMANDS = (("ps",), ("load", "chat"), ("unload", "chat"), ("reload",), ("logs", "chat"))


async def test_client_commands_say_a_key_is_needed_and_how_to_give_it(tmp_path: Path) -> None:
    async with serve(tmp_path, config=RouterConfig(api_keys=("s3cret",))) as up:
        without = await asyncio.gather(*(_run(*c, "--url", up.url) for c in CLIENT_COMMANDS))
        for command, done in zip(CLIENT_COMMANDS, without, strict=True):
            assert done.returncode == 2, (command, done.stderr)
            said = done.stderr.strip()
            assert said.startswith("rosterd: 401: rosterd up requires an API key"), said
            assert "--api-key" in said
            assert "ROSTERD_API_KEY" in said
        wrong = await _run("ps", "--url", up.url, key="guess")
        assert wrong.returncode == 2
        assert "does not accept the API key given (--api-key or ROSTERD_API_KEY)" in wrong.stderr
        right = await _run("ps", "--json", "--url", up.url, key="s3cret")
        assert right.returncode == 0, right.stderr
        assert set(json.loads(right.stdout)["nodes"]["n1"]["roles"]) == set(ROLES)


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
async def test_client_commands_take_the_openai_base_url(tmp_path: Path, suffix: str) -> None:
    async with serve(tmp_path) as up:
        (up.logs / "chat.log").write_text("started\n")
        ps, load, logs = await asyncio.gather(
            _run("ps", "--json", "--url", up.url + suffix),
            _run("load", "chat", "--url", up.url + suffix),
            _run("logs", "chat", "--url", up.url + suffix),
        )
        assert ps.returncode == 0, ps.stderr
        assert "n1" in json.loads(ps.stdout)["nodes"]
        assert load.returncode == 0, load.stderr
        assert load.stdout.startswith("chat is resident on n1")
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == "started\n"


async def test_rosterd_load_says_what_it_evicted(tmp_path: Path) -> None:
    """The node holds one 1 MiB role at a time: loading the other evicts the first, and
    both ``POST /rosterd/load/{role}`` and ``rosterd load`` say so."""
    async with (
        serve(tmp_path, capacity_bytes=MIB + MIB // 2) as up,
        httpx.AsyncClient(base_url=up.url, timeout=30) as client,
    ):
        first = await _run("load", "chat", "--url", up.url)
        assert first.returncode == 0, first.stderr
        assert "evicted" not in first.stdout
        again = (await client.post("/rosterd/load/chat")).json()
        assert again["evicted"] == []  # resident already: nothing to make room for
        second = await _run("load", "quiet", "--url", up.url)
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip().endswith("; evicted chat to make room"), second.stdout
        back = await client.post("/rosterd/load/chat")
        assert back.status_code == 200
        assert back.json() == {
            "role": "chat",
            "node": "n1",
            "base_url": "http://127.0.0.1:9",
            "ready": True,
            "evicted": ["quiet"],
            "evictions": [{"role": "quiet", "cause": "make_room"}],
        }


async def test_rosterd_load_says_what_it_evicted_for_an_exclusion(tmp_path: Path) -> None:
    """chat excludes quiet, and there is room for both: each load stops the other all
    the same, and both ``POST /rosterd/load/{role}`` and ``rosterd load`` name it with
    why, whichever way the exclusion is settled (the idle winner chat yields to a
    waiting quiet; chat, which takes precedence, evicts quiet)."""
    limits = SchedulerLimits(min_busy_residency_s=0.0)
    async with (
        serve(tmp_path, excludes={"chat": ("quiet",)}, limits=limits) as up,
        httpx.AsyncClient(base_url=up.url, timeout=30) as client,
    ):
        first = await _run("load", "chat", "--url", up.url)
        assert first.returncode == 0, first.stderr
        yielded = await _run("load", "quiet", "--url", up.url)
        assert yielded.returncode == 0, yielded.stderr
        assert yielded.stdout.strip().endswith("; evicted chat (they exclude each other)"), (
            yielded.stdout
        )
        back = (await client.post("/rosterd/load/chat")).json()
        assert back["evicted"] == ["quiet"]
        assert back["evictions"] == [{"role": "quiet", "cause": "exclusion"}]


#: The guide's pages whose ``rosterd ps`` samples are checked against what ``ps`` prints.
GUIDE_PAGES = [
    Path(__file__).resolve().parents[2] / "docs" / name for name in ("operating.md", "ray.md")
]


async def test_readme_ps_samples_have_the_columns_and_caption_ps_prints(tmp_path: Path) -> None:
    """Every ``rosterd ps`` table in the guide has the header and the caption that
    ``ps`` prints now (the rows depend on the lab; the columns and their meaning do not)."""
    async with serve(tmp_path) as up:
        done = await _run("ps", "--url", up.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃ role "))
    caption = next(line for line in lines if line.startswith("GiB: "))
    readme = "\n".join(page.read_text(encoding="utf-8") for page in GUIDE_PAGES)
    tables = [line for line in readme.splitlines() if line.startswith("┃ role ") and "RSS" in line]
    assert len(tables) >= 3  # the local sample and the two nodes of the Ray sample
    columns = [cell.strip() for cell in header.split("┃")]
    for line in tables:
        assert [cell.strip() for cell in line.split("┃")] == columns, line
    captions = [line for line in readme.splitlines() if line.startswith("GiB: ")]
    assert captions
    assert set(captions) == {caption}


# ---------------------------------------------------------------------------- /openapi.json


def _starlette(app: object) -> Starlette:
    """The Starlette app inside ``create_app``'s middleware (each keeps the next as ``.app``)."""
    while not isinstance(app, Starlette):
        app = app.app  # type: ignore[attr-defined]
    return app


def _served_operations(app: Starlette) -> set[tuple[str, str]]:
    """(path as OpenAPI writes it, lower-case method) of every route ``app`` serves."""
    served: set[tuple[str, str]] = set()
    for route in app.routes:
        if isinstance(route, Mount):
            served.add((route.path + "/{path}", "get"))
        else:
            assert isinstance(route, Route)
            path = route.path.replace(":path}", "}")
            served |= {(path, m.lower()) for m in route.methods or () if m != "HEAD"}
    return served


async def test_openapi_documents_every_route_the_app_serves(tmp_path: Path) -> None:
    specs = {
        r: InferenceSpec(
            role=r, flavor=InferFlavor.LLAMACPP, model=f"{r}-m", memory=MemorySpec(MIB)
        )
        for r in ROLES
    }
    scheduler = NodeDirectory({"n1": NodeScheduler("n1", 100 * MIB, specs, NoBackends())})

    async def reload(force: bool) -> dict[str, object]:
        return {}

    # Every optional route on: the reload, the logs.
    app = create_app(
        scheduler,
        {r: RoleRoute(r) for r in ROLES},
        reload=reload,
        log_path=lambda role: tmp_path / f"{role}.log",
    )
    served = _served_operations(_starlette(app))
    assert ("/rosterd/reload", "post") in served

    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url) as client:
        document = (await client.get("/openapi.json")).json()
    documented = {
        (path, method) for path, operations in document["paths"].items() for method in operations
    }
    assert served - documented == set()
    assert documented - served == set()
    for path in ("/rosterd/reload", "/rosterd/logs/{role}", "/rosterd/events/stream"):
        assert path in document["paths"]
    load = document["paths"]["/rosterd/load/{role}"]["post"]["responses"]["200"]
    assert "evicted" in load["content"]["application/json"]["schema"]["required"]
