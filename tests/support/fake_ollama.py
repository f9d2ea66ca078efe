"""A fake `ollama serve`, because ollama cannot run on the test machine.

It follows Ollama's documented HTTP API for the calls rosterd makes: `GET /api/version`,
`POST /api/generate` (an empty prompt with `keep_alive` loads; `keep_alive: 0` unloads;
a prompt generates), `GET /api/ps` (resident models with their sizes), and the calls
rosterd passes through from clients: `POST /api/chat` (its reply, "fake ollama answers
MODEL (keep_alive K)", says what it was sent; streamed as NDJSON lines unless
`"stream": false`) and `POST /api/embed` (one 3-number vector per input). Listens on
`OLLAMA_HOST` (host:port), as ollama does. The models it "has" come from
`FAKE_OLLAMA_MODELS` (`name=size_bytes,...`). Stdlib only, so it starts fast.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    if sys.argv[1:] != ["serve"]:
        print("usage: ollama serve", file=sys.stderr)
        return 2
    host, _, port = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434").rpartition(":")
    store = {}
    for item in filter(None, os.environ.get("FAKE_OLLAMA_MODELS", "").split(",")):
        name, _, size = item.partition("=")
        store[name] = int(size or 0)
    resident: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/api/version":
                self._send(200, {"version": "0.0.0-fake"})
            elif self.path == "/api/ps":
                with lock:
                    models = [
                        {"name": n, "model": n, "size": s, "size_vram": 0, "details": {}}
                        for n, s in sorted(resident.items())
                    ]
                self._send(200, {"models": models})
            else:
                self._send(404, {"error": "not found"})

        def _chat(self, model: str, body: dict[str, object]) -> None:
            reply = f"fake ollama answers {model} (keep_alive {body.get('keep_alive')})"
            last: dict[str, object] = {"model": model}
            last["message"] = {"role": "assistant", "content": ""}
            last |= {"done": True, "done_reason": "stop", "eval_count": 2}
            if body.get("stream") is False:
                last["message"] = {"role": "assistant", "content": reply}
                self._send(200, last)
                return
            # Ollama's stream: NDJSON, one object per line, the body ends with the connection.
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            for word in reply.split(" "):
                piece = {"model": model, "message": {"role": "assistant", "content": word + " "}}
                self.wfile.write(json.dumps(piece | {"done": False}).encode() + b"\n")
                self.wfile.flush()
            self.wfile.write(json.dumps(last).encode() + b"\n")

        def do_POST(self) -> None:
            if self.path not in ("/api/generate", "/api/chat", "/api/embed"):
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            model = body.get("model", "")
            if model not in store:
                self._send(404, {"error": f"model '{model}' not found"})
                return
            if self.path == "/api/chat":
                self._chat(model, body)
                return
            if self.path == "/api/embed":
                inputs = body.get("input")
                count = len(inputs) if isinstance(inputs, list) else 1
                self._send(200, {"model": model, "embeddings": [[0.5, 0.25, 0.125]] * count})
                return
            keep_alive = body.get("keep_alive")
            with lock:
                if keep_alive == 0:
                    resident.pop(model, None)
                    reason = "unload"
                else:
                    resident[model] = store[model]
                    reason = "load" if not body.get("prompt") else "length"
            response = "x" if body.get("prompt") else ""
            self._send(
                200, {"model": model, "response": response, "done": True, "done_reason": reason}
            )

        def log_message(self, format: str, *fargs: object) -> None:
            print(format % fargs, file=sys.stderr, flush=True)

    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
