"""A fast stand-in for llama-server, for the load tests (uvicorn, no model): it stands in for
speed, since a real llama-server on this machine's two cores cannot hold 1,000 streams.

    python tests/support/fake_llama_server.py -m MODEL --host H --port P [-c N] [-np N] [--alias A]

It takes llama-server's arguments (rosterd's llamacpp adapter launches it through
``ROSTERD_LLAMA_SERVER``; a wrapper script execs it) and ignores those it does not
need. ``GET /health`` and ``GET /v1/models`` answer 200; ``POST /v1/chat/completions``
and ``/v1/completions`` answer one JSON completion, or with ``"stream": true`` an
event stream of ``$FAKE_LLAMA_CHUNKS`` chunks (default 20) ``$FAKE_LLAMA_CHUNK_GAP_S``
seconds apart (default 0.1), then ``data: [DONE]``. Its listen backlog is 4096 so
the stand-in itself never refuses a connection. ``$FAKE_LLAMA_SERVICE_S`` (default 0)
gives a completion a fixed service time: it holds one of ``-np`` slots (default 1)
that long before it answers, so a copy serves at most ``np / service_s`` a second
(the replicas bench).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import uvicorn

Scope = dict[str, Any]


def _chunk(model: str, index: int, chat: bool) -> bytes:
    if chat:
        choice: dict[str, object] = {"index": 0, "delta": {"content": "x"}, "finish_reason": None}
    else:
        choice = {"index": 0, "text": "x", "finish_reason": None}
    body: dict[str, object] = {"object": "chat.completion.chunk", "model": model, "id": f"c{index}"}
    body["choices"] = [choice]
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def make_app(alias: str, chunks: int, gap_s: float, service_s: float = 0.0, slots: int = 1) -> Any:
    """The stand-in's raw ASGI app."""
    busy = asyncio.Semaphore(slots)

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if scope["method"] == "GET":
            if path == "/health":
                await _json(send, 200, {"status": "ok"})
            elif path == "/v1/models":
                await _json(send, 200, {"object": "list", "data": [{"id": alias}]})
            else:
                await _json(send, 404, {"error": {"message": "not found"}})
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body", False):
                break
        payload = json.loads(raw or b"{}")
        chat = path.endswith("/chat/completions")
        if service_s > 0:
            async with busy:
                await asyncio.sleep(service_s)
        if not payload.get("stream"):
            choice: dict[str, object] = (
                {"index": 0, "message": {"role": "assistant", "content": "x"}}
                if chat
                else {"index": 0, "text": "x"}
            )
            choice["finish_reason"] = "length"
            await _json(send, 200, {"object": "completion", "model": alias, "choices": [choice]})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for index in range(chunks):
            await send(
                {
                    "type": "http.response.body",
                    "body": _chunk(alias, index, chat),
                    "more_body": True,
                }
            )
            await asyncio.sleep(gap_s)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


async def _json(send: Any, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", dest="model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="fake")
    parser.add_argument("-np", "--parallel", dest="parallel", type=int, default=1)
    args, _ = parser.parse_known_args()
    chunks = int(os.environ.get("FAKE_LLAMA_CHUNKS", "20"))
    gap_s = float(os.environ.get("FAKE_LLAMA_CHUNK_GAP_S", "0.1"))
    print(f"fake llama-server listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(
        make_app(
            args.alias,
            chunks,
            gap_s,
            float(os.environ.get("FAKE_LLAMA_SERVICE_S", "0")),
            args.parallel,
        ),
        host=args.host,
        port=args.port,
        backlog=4096,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
