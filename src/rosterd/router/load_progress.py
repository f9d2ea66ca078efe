"""Load progress to whoever waits (DESIGN.md layer 7): a streamed request that waits for its
role's load gets its answer's head at once and then a progress line every few seconds, so
that a client with an idle timeout (chat UIs, agents) keeps waiting and a person sees why.

What a waiting stream receives, by path (``--load-progress``):

- OpenAI's event streams (``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/responses``): SSE comments, ``: loading chat-small 3 s of ~12 s``, which every SSE
  client skips (the SSE spec: a line that starts with a colon is a comment);
- Anthropic's ``/v1/messages``: ``event: ping`` (its streaming spec has it; the SDKs skip
  it), after a comment line with the same text;
- with ``text`` (the option, or a role's ``load_progress: text``), chat completions also
  carry the progress as ``delta.reasoning_content``, the field chat UIs show as the
  model's thinking (llama-swap's ``sendLoadingState`` does the same); the other paths keep
  the comments or pings, since their clients have no such field that a stream may open with;
- Ollama's NDJSON paths get nothing: its clients parse every line as a JSON answer
  (ollama-python's ``json.loads`` per line), so no line may be sent that is not one.

The head goes only once the request has waited :data:`FIRST_BEAT_S` with no copy of its
role ready: a refusal that comes at once (a queue full, a load in backoff) still gets its
own status. Once the head is out, the status is 200 and stays so: whatever fails later (the
load, the backend's refusal) ends the stream with the path's SSE error event instead
(:func:`continue_stream`).

The expected total of a load is the role's last load on that node in this run (its
``loaded`` event's duration), else the median of its last :data:`PAST_LOADS_USED` loads on
that node in earlier runs (the supervisor's run records), else its weights' size read at
:data:`ASSUMED_READ_BYTES_PER_S`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from starlette.types import Message, Send

from rosterd.errors import RouterError
from rosterd.replica_choice import CopyState
from rosterd.router.client_side import ClientAnswer
from rosterd.router.dialects.envelope import ErrorEnvelope, backend_error_text
from rosterd.router.routing import LoadProgressMode
from rosterd.router.wait_report import evicted_for
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.node import NodeScheduler
from rosterd.scheduler.values import SchedulerEvent
from rosterd.spec import InferenceSpec

#: Seconds a streamed request waits before its head is sent: below a client's patience
#: (the first byte within 1 s, issue 31), above a refusal's time (a queue full or a load
#: in backoff answers in milliseconds, and keeps its own status).
FIRST_BEAT_S: Final[float] = 0.1

#: Seconds between two progress lines: well under the idle timeouts of chat UIs and agents
#: (tens of seconds).
BEAT_INTERVAL_S: Final[float] = 3.0

#: The disk rate assumed for a role never loaded on its node, bytes a second: about what a
#: local NVMe drive gives llama.cpp's mmap'd load of a cold GGUF (1 GiB/s).
ASSUMED_READ_BYTES_PER_S: Final[float] = float(2**30)

#: How many of a role's past loads (earlier runs) its expected total reads: the median of
#: the last few, so that one cold-cache or warm-cache load does not sway it.
PAST_LOADS_USED: Final[int] = 5

#: The paths whose streams get progress (the others do not stream, or are Ollama's).
PROGRESS_PATHS: Final[frozenset[str]] = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
)

#: The one path whose stream may carry the progress as reasoning text (``text``).
TEXT_PATH: Final[str] = "/v1/chat/completions"

_ANTHROPIC_PATH: Final[str] = "/v1/messages"


def expected_load_s(
    role: str,
    events: Sequence[SchedulerEvent],
    spec: InferenceSpec | None,
    past_loads_s: Sequence[float] = (),
) -> float:
    """How long a load of ``role`` should take, seconds: its last ``loaded`` event's duration
    in ``events`` (its node's log, this run), else the median of the last
    :data:`PAST_LOADS_USED` of ``past_loads_s`` (its loads on that node in earlier runs,
    oldest first), else its weights' bytes at :data:`ASSUMED_READ_BYTES_PER_S` (at least
    1 s; 0 when nothing is known)."""
    for event in reversed(events):
        if event.role == role and event.kind == "loaded" and event.duration_s is not None:
            return event.duration_s
    if past_loads_s:
        return float(statistics.median(past_loads_s[-PAST_LOADS_USED:]))
    if spec is None or spec.memory.weights_bytes <= 0:
        return 0.0
    return max(1.0, spec.memory.weights_bytes / ASSUMED_READ_BYTES_PER_S)


def progress_text(
    role: str,
    elapsed_s: float,
    expected_s: float,
    loading: bool,
    evicted: Sequence[tuple[str, str]],
) -> str:
    """One progress line: ``loading chat-small 3 s of ~12 s, evicted chat-big``; ``waiting
    to load …`` before the load started (the room is being made). Whole seconds."""
    what = "loading" if loading else "waiting to load"
    line = f"{what} {role} {elapsed_s:.0f} s"
    if expected_s > 0:
        line += f" of ~{expected_s:.0f} s"
    if evicted:
        line += ", evicted " + ", ".join(name for name, _cause in evicted)
    return line


def progress_messages(path: str, line: str, mode: LoadProgressMode, model: str) -> bytes:
    """The bytes one progress ``line`` is on ``path``'s stream (the module docstring);
    ``model``: the name the client asked for (the reasoning chunk's ``model``)."""
    comment = b": " + line.encode() + b"\n"
    if path == _ANTHROPIC_PATH:
        return comment + b'event: ping\ndata: {"type": "ping"}\n\n'
    out = comment + b"\n"
    if mode is LoadProgressMode.TEXT and path == TEXT_PATH:
        chunk = {
            "id": "rosterd-load",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "reasoning_content": line + "\n"},
                    "finish_reason": None,
                }
            ],
        }
        out += b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
    return out


def head_message(role: str) -> Message:
    """The head of a stream sent before its role is ready: 200, an event stream."""
    headers = [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        (b"x-rosterd-role", role.encode()),
    ]
    return {"type": "http.response.start", "status": 200, "headers": headers}


class LoadProgress:
    """An async context around a request's wait for its lease: while it waits for a load,
    the client gets the head and a progress line every :data:`BEAT_INTERVAL_S` seconds
    (``answer``: the client's side; ``path``: the request's; ``model``: the name asked).

    ``started``: the head was sent. On a clean exit after it started, one last line says
    the role is ready and after how long. Cancels its beats on every exit."""

    def __init__(
        self,
        scheduler: NodeDirectory,
        role: str,
        answer: ClientAnswer,
        path: str,
        mode: LoadProgressMode,
        model: str,
    ) -> None:
        self.scheduler = scheduler
        self.role = role
        self.answer = answer
        self.path = path
        self.mode = mode
        self.model = model
        self.started = False
        self._asked_at = time.time()
        self._before: Mapping[str, tuple[SchedulerEvent, ...]] = {}
        self._beats: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadProgress:
        self._asked_at = time.time()
        nodes = self.scheduler.nodes_of(self.role)
        self._before = {node.name: tuple(node.events) for node in nodes}
        self._beats = asyncio.get_running_loop().create_task(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._beats is not None:
            self._beats.cancel()
            # asyncio.wait, not await: a cut of this task while it waits stays a cut.
            await asyncio.wait({self._beats})
        if exc_type is None and self.started:
            took_s = time.time() - self._asked_at
            await self._send_line(f"{self.role} is ready after {took_s:.1f} s")

    async def _beat(self) -> None:
        await asyncio.sleep(FIRST_BEAT_S)
        if self._ready():
            return  # a wait for a slot, not for a load: the answer comes as it is
        await self.answer.send(head_message(self.role))
        self.started = True
        while True:
            await self._send_line(self._line())
            await asyncio.sleep(BEAT_INTERVAL_S)

    def _ready(self) -> bool:
        nodes = self.scheduler.nodes_of(self.role)
        return not nodes or any(n.copy_state(self.role) is CopyState.READY for n in nodes)

    def _loading_node(self) -> NodeScheduler | None:
        nodes = self.scheduler.nodes_of(self.role)
        for node in nodes:
            if node.copy_state(self.role) is CopyState.LOADING:
                return node
        return nodes[0] if nodes else None

    def _line(self) -> str:
        node = self._loading_node()
        if node is None:
            return f"waiting to load {self.role}"
        events = tuple(node.events)
        now = time.time()
        began = self._load_began(events)
        spec = node.specs.get(self.role)
        evicted = evicted_for(
            self.role, node.name, node.specs, self._before.get(node.name, ()), events
        )
        return progress_text(
            self.role,
            now - (began if began is not None else self._asked_at),
            expected_load_s(self.role, events, spec, node.past_loads_s(self.role)),
            began is not None,
            evicted,
        )

    def _load_began(self, events: Sequence[SchedulerEvent]) -> float | None:
        """When the role's load now running began (its ``loading`` event), else ``None``."""
        for event in reversed(events):
            if event.role != self.role:
                continue
            return event.at if event.kind == "loading" else None
        return None

    async def _send_line(self, line: str) -> None:
        body = progress_messages(self.path, line, self.mode, self.model)
        await self.answer.send({"type": "http.response.body", "body": body, "more_body": True})


def loads_now(scheduler: NodeDirectory) -> list[dict[str, object]]:
    """The loads under way on every node, for the page's progress bars (``event: loads``):
    ``role``, ``node``, ``elapsed_s`` since its ``loading`` event and ``expected_s``
    (:func:`expected_load_s`), seconds; oldest load first."""
    now = time.time()
    loads: list[tuple[float, dict[str, object]]] = []
    for name, node in sorted(scheduler.nodes.items()):
        events = tuple(node.events)
        specs = node.specs
        for role in sorted(specs):
            if node.copy_state(role) is not CopyState.LOADING:
                continue
            began = next(
                (e.at for e in reversed(events) if e.role == role and e.kind == "loading"), now
            )
            expected_s = expected_load_s(role, events, specs[role], node.past_loads_s(role))
            view = {"role": role, "node": name, "elapsed_s": now - began, "expected_s": expected_s}
            loads.append((now - began, view))
    return [view for _elapsed, view in sorted(loads, key=lambda pair: -pair[0])]


def continue_stream(send: Send, envelope: ErrorEnvelope) -> Send:
    """``send`` for the answer of a request whose head :class:`LoadProgress` sent: a later
    head is dropped (the client has its 200), and a refusal's (status 400 and up) body
    becomes the path's SSE error event (``envelope``), the message the backend gave."""
    refused: list[int] = []
    held = bytearray()

    async def send_on(message: Message) -> None:
        if message["type"] == "http.response.start":
            if int(message["status"]) >= 400:
                refused.append(int(message["status"]))
            return
        if not refused:
            await send(message)
            return
        held.extend(message.get("body", b""))
        if not message.get("more_body", False):
            code = "bad_request" if refused[0] < 500 else "backend_error"
            text = backend_error_text(bytes(held))
            await send(envelope.sse_event(RouterError(code, text)))

    return send_on


def wants_progress(path: str, payload: Mapping[str, Any], mode: LoadProgressMode) -> bool:
    """Whether a request on ``path`` with ``payload`` gets load progress in ``mode``: a
    streamed one on :data:`PROGRESS_PATHS`, unless the mode is ``off``."""
    return (
        mode is not LoadProgressMode.OFF
        and path in PROGRESS_PATHS
        and payload.get("stream") is True
    )
