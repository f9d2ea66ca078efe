"""A small stand-in for a backend server, for supervisor tests (stdlib only, starts fast).

    python tests/support/fake_backend.py --port P [--mode MODE] [--load-s S] [--child-pid-file F]
                                 [--marker F] [--no-slots] [llama-server's other options, ignored]

Modes:
  ok           /health answers 503 for --load-s seconds, then 200; /v1/models 200;
               POST /v1/completions answers one token (streamed: in the shape of the path,
               /v1/completions, /v1/chat/completions or /v1/messages); GET /slots one idle slot.
  crash        writes a fatal error to stderr after --load-s seconds and exits 3.
  ignore-term  like ok, but ignores SIGTERM (only SIGKILL stops it).
  wedged       HTTP answers (/health 200) but a completion never returns: a hung generator
               (a stream sends its headers and one chunk, then nothing); /slots and
               /metrics hang too, as llama-server's do when its main loop is stuck
               (it answers them from that loop; /health it answers without it).
  wedge-once   wedged if the --marker file does not exist yet (it creates it), else ok:
               the first process hangs, the one restarted after it serves.
  stall-alone  a completion whose prompt is "stall" never returns, others are answered,
               and /slots answers counters that move on every look (its other slots
               progress): a request that stalls alone on a backend that works.
With --no-slots, /slots and /metrics answer 501 at once, as llama-server's do when started
with --no-slots: a backend with no progress signal (mlx_lm.server, llama-cpp-python).
It stands in for llama-server where the real one cannot show a case (a generator that
hangs while /health says 200, a load that takes seconds): llama-server's own options
(-m, -c, -np, --alias) are accepted and ignored, so a wrapper script can be given to
rosterd as ROSTERD_LLAMA_SERVER.
With --child-pid-file it also starts a child process (`sleep`) in its own process group
and writes the child's pid there, to show that stopping kills the whole group.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    modes = ["ok", "crash", "ignore-term", "wedged", "wedge-once", "stall-alone"]
    parser.add_argument("--mode", default="ok", choices=modes)
    parser.add_argument("--load-s", type=float, default=0.0)
    parser.add_argument("--child-pid-file", type=Path)
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--no-slots", action="store_true")
    args, _llama_server_options = parser.parse_known_args()
    started = time.monotonic()
    wedged = args.mode == "wedged"
    if args.mode == "wedge-once":
        assert args.marker is not None, "wedge-once needs --marker"
        wedged = not args.marker.exists()
        args.marker.touch()
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child_pid_file is not None:
        child = subprocess.Popen(["sleep", "300"])
        args.child_pid_file.write_text(str(child.pid))
    if args.mode == "crash":
        time.sleep(args.load_s)
        print("loading model ...", file=sys.stderr)
        print("fatal: could not load model: bad magic", file=sys.stderr, flush=True)
        return 3
    hang = threading.Event()
    looks: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            loading = time.monotonic() - started < args.load_s
            if self.path == "/health":
                if loading:
                    self._send(503, {"error": {"message": "Loading model"}})
                else:
                    self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "fake"}]})
            elif self.path in ("/slots", "/metrics") and args.no_slots:
                self._send(501, {"error": {"message": "This server does not support slots"}})
            elif self.path in ("/slots", "/metrics") and wedged:
                hang.wait(600)  # llama-server answers these from its main loop, stuck here
            elif self.path == "/slots" and args.mode == "stall-alone":
                looks.append(len(looks))  # the other slot has written one more token
                stuck = {"id": 0, "id_task": 1, "n_prompt_tokens_processed": 0}
                busy = {"id": 1, "id_task": 2, "n_prompt_tokens_processed": 9}
                self._send(
                    200,
                    [
                        {**stuck, "next_token": [{"n_decoded": 0}]},
                        {**busy, "next_token": [{"n_decoded": len(looks)}]},
                    ],
                )
            elif self.path == "/slots":
                slot = {"id": 0, "id_task": -1, "n_prompt_tokens_processed": 0}
                self._send(200, [{**slot, "next_token": {"n_decoded": 0}}])
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if body.get("stream"):
                self._stream(body)
                return
            if wedged or (args.mode == "stall-alone" and body.get("prompt") == "stall"):
                hang.wait(600)  # HTTP accepted, generation never ends
                return
            self._send(
                200,
                {
                    "object": "text_completion",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                },
            )

        def _stream(self, body: dict[str, object]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if self.path == "/v1/messages":
                self.wfile.write(_messages_stream(body.get("model")))
                self.close_connection = True
                return
            chunk: dict[str, object] = {"object": "text_completion", "model": body.get("model")}
            chunk["choices"] = [{"index": 0, "text": "x", "finish_reason": None}]
            if self.path == "/v1/chat/completions":
                chunk["object"] = "chat.completion.chunk"
                chunk["id"] = "fake"
                chunk["created"] = 0
                delta = {"role": "assistant", "content": "x"}
                chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            if wedged:
                hang.wait(600)  # the first chunk came, the next never does
                return
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def log_message(self, format: str, *fargs: object) -> None:
            print(format % fargs, file=sys.stderr, flush=True)

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake backend listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


def _messages_stream(model: object) -> bytes:
    """An Anthropic Messages stream of one text token ``x``, as llama-server's
    ``/v1/messages`` sends it (message_start to message_stop)."""
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, object]]] = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "x"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


if __name__ == "__main__":
    sys.exit(main())
