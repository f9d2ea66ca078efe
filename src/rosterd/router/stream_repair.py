"""A backend's event stream repaired to the shape its dialect's SDKs read (DESIGN.md layer 7).

An Anthropic Messages stream opens with ``message_start`` and each content block with
``content_block_start``; an OpenAI Responses stream opens with ``response.created`` and
``response.in_progress``, each text with ``response.output_item.added`` and
``response.content_part.added``, and every event says its ``output_index``,
``content_index`` and ``sequence_number``. The SDKs build the answer from those: the
anthropic SDK's ``messages.stream`` yields no message for a stream without
``message_start``, and the openai SDK's ``responses.stream`` raises ``TypeError`` on a
text event without its indexes.

llama-server (measured on llama.cpp 0.3.36, its own ``/v1/messages`` and
``/v1/responses``) sends the opening events with its first token's text and drops them
when that text is held back because it ends inside a UTF-8 character (a model whose
byte-fallback vocabulary spells a CJK character or an emoji in several tokens answers
that way whenever its answer begins with one): on a small model that answers in bytes,
about one Messages stream in five and one Responses stream in twenty lost their opening,
and a Responses stream repeats its opening after each held-back token. Its Responses
events carry no indexes at all.

:class:`StreamRepair` puts a missing opening back before the event that needed it, each
event built as the backend builds it, drops a repeated one, and gives Responses events
the indexes they lack (a value the backend gave is kept). A Messages stream that has its
events passes byte for byte; a Responses stream is read event by event as JSON (one
parse per event, next to a token's generation). A rebuilt ``message_start`` says the
prompt's tokens as the backend's ``count_tokens`` counts them (``count_prompt``, asked only
then; 0 when it cannot say), and its ids are rosterd's own.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.types import Message, Send

#: The streams it mends: the Anthropic Messages path and the OpenAI Responses path.
MESSAGES_PATH: Final[str] = "/v1/messages"
RESPONSES_PATH: Final[str] = "/v1/responses"

_TYPE: Final[re.Pattern[bytes]] = re.compile(rb'"type"\s*:\s*"([\w.]+)"')
_INDEX: Final[re.Pattern[bytes]] = re.compile(rb'"index"\s*:\s*(\d+)')
_DELTA_TYPE: Final[re.Pattern[bytes]] = re.compile(rb'"delta"\s*:\s*\{\s*"type"\s*:\s*"(\w+)"')
#: The content block a delta of each kind belongs to (a tool call's cannot be rebuilt:
#: its id and name are only in the block's start).
_BLOCK_OF_DELTA: Final[Mapping[bytes, dict[str, str]]] = {
    b"text_delta": {"type": "text", "text": ""},
    b"thinking_delta": {"type": "thinking", "thinking": ""},
    b"signature_delta": {"type": "thinking", "thinking": ""},
}


#: Asks the backend how many tokens the request's prompt is (``None``: it could not say).
PromptCounter = Callable[[], Awaitable[int | None]]

#: The Messages events that belong to a content block opened before them.
_NEEDS_ITS_START: Final = (b"content_block_delta", b"content_block_stop")


def _event(name: str, data: Mapping[str, Any]) -> bytes:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n".encode()


def _name_of(block: bytes) -> bytes:
    """An SSE event's name: its ``event:`` field, else its data's ``type``, else ``b""``
    (a comment, which needs nothing before it)."""
    for line in block.split(b"\n"):
        if line.startswith(b"event:"):
            return line[6:].strip()
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            found = _TYPE.search(line)
            return found.group(1) if found else b""
    return b""


class StreamRepair:
    """``send`` for one streamed answer of :data:`MESSAGES_PATH` or
    :data:`RESPONSES_PATH`, with the opening events the backend left out put back.

    ``model``: the name the backend was sent (a rebuilt ``message_start`` names it, as
    the backend would; :class:`~rosterd.router.model_echo.ModelEcho` then writes the
    name asked). Events are read whole (a chunk may end inside one); an answer that is
    not an event stream passes unchanged.
    """

    def __init__(
        self, send: Send, path: str, model: str, count_prompt: PromptCounter | None = None
    ) -> None:
        self._send = send
        self._count_prompt = count_prompt
        #: A rebuilt ``message_start``'s bytes, once one was sent (for the usage counts).
        self.rebuilt_start = b""
        self._messages = path == MESSAGES_PATH
        self._model = model
        self._partial = b""
        self._mending = True
        self._started = False
        self._open: set[bytes] = set()  # blocks (index) or items (id) opened
        self._openings: set[bytes] = set()  # the opening events sent
        self._input_tokens = 0  # a rebuilt message_start's prompt tokens
        # Responses: each output item's id -> [its output_index, its last part's index]
        self._items: dict[str, list[int]] = {}
        self._sequence = 0

    @staticmethod
    def wrap(
        send: Send,
        path: str,
        payload: Mapping[str, Any],
        model: str,
        count_prompt: PromptCounter | None = None,
    ) -> Send:
        """``send`` wrapped for a streamed request (``payload["stream"]``) on one of the
        two paths, else ``send`` itself. ``count_prompt``: asked for the prompt's tokens
        when a ``message_start`` must be rebuilt (the backend's ``count_tokens``; ``None``
        or a ``None`` answer: 0)."""
        if path not in (MESSAGES_PATH, RESPONSES_PATH) or payload.get("stream") is not True:
            return send
        return StreamRepair(send, path, model, count_prompt)

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._mending = any(
                k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                for k, v in message.get("headers", ())
            )
            await self._send(message)
            return
        if message["type"] != "http.response.body" or not self._mending:
            await self._send(message)
            return
        data = self._partial + message.get("body", b"")
        more = bool(message.get("more_body", False))
        end = data.rfind(b"\n\n")
        cut = (end + 2 if end >= 0 else 0) if more else len(data)
        whole, self._partial = data[:cut], data[cut:]
        if not whole and more:
            return
        out = bytearray()
        blocks = whole.split(b"\n\n")
        if self._messages and not self._started and self._count_prompt is not None:
            names = (_name_of(b) for b in blocks)
            first = next((n for n in names if n not in (b"", b"ping", b"error")), None)
            if first not in (None, b"message_start"):  # its message_start will be rebuilt
                self._input_tokens = await self._count_prompt() or 0
        for number, block in enumerate(blocks):
            last = number == len(blocks) - 1
            if block.strip():
                out += self._mended(block) + (b"" if last else b"\n\n")
            elif not last:
                out += b"\n\n"
        await self._send({**message, "body": bytes(out)})

    def _mended(self, block: bytes) -> bytes:
        """``block`` (one SSE event, without its blank line) with the events the backend
        should have sent before it; nothing for a repeated opening event."""
        name = _name_of(block)
        if not name:
            return block
        if name in (b"message_start", b"response.created", b"response.in_progress"):
            if name in self._openings:
                return b""  # llama-server's Responses stream repeats its opening mid-way
            self._openings.add(name)
        if self._messages:
            return self._messages_missing(name, block) + block
        return self._responses_mended(name, block)

    def _messages_missing(self, name: bytes, block: bytes) -> bytes:
        out = b""
        if name == b"message_start":
            self._started = True
        elif name not in (b"ping", b"error") and not self._started:
            self._started = True
            self._openings.add(b"message_start")
            message: dict[str, Any] = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": self._model,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self._input_tokens, "output_tokens": 0},
            }
            self.rebuilt_start = _event(
                "message_start", {"type": "message_start", "message": message}
            )
            out += self.rebuilt_start
        index = _INDEX.search(block)
        if index is None:
            return out
        if name == b"content_block_start":
            self._open.add(index.group(1))
        elif name in _NEEDS_ITS_START and index.group(1) not in self._open:
            # A block's stop with no start or delta before it was a text of held-back bytes.
            kind = _DELTA_TYPE.search(block)
            content = _BLOCK_OF_DELTA.get(kind.group(1) if kind else b"text_delta")
            if content is not None:
                self._open.add(index.group(1))
                start = {"type": "content_block_start", "index": int(index.group(1))}
                out += _event("content_block_start", {**start, "content_block": content})
        return out

    def _responses_mended(self, name: bytes, block: bytes) -> bytes:
        """A Responses event with what the openai SDK reads put in where it is missing:
        the opening before the first event, an output item and its text part before a
        text that names an item never added, and every event's ``output_index``,
        ``content_index`` (its item's part) and ``sequence_number``."""
        data = _data_of(block)
        if data is None:
            return block
        out = b""
        if name != b"response.created" and not self._started:
            response: dict[str, Any] = {"id": f"resp_{uuid.uuid4().hex}", "object": "response"}
            response |= {"status": "in_progress", "model": self._model, "output": []}
            for kind in ("response.created", "response.in_progress"):
                out += self._numbered(kind, {"type": kind, "response": response})
            self._openings |= {b"response.created", b"response.in_progress"}
        self._started = True
        item = data.get("item")
        if name == b"response.output_item.added" and isinstance(item, dict):
            self._items.setdefault(str(item.get("id")), [len(self._items), -1])
        item_id = data.get("item_id")
        if isinstance(item_id, str) and item_id not in self._items:
            self._items[item_id] = [len(self._items), -1]
            added: dict[str, Any] = {"content": [], "id": item_id, "role": "assistant"}
            added |= {"status": "in_progress", "type": "message"}
            kind = "response.output_item.added"
            out += self._numbered(kind, {"type": kind, "item": added})
            if name != b"response.content_part.added":
                self._items[item_id][1] = 0
                kind, part = "response.content_part.added", {"type": "output_text", "text": ""}
                index = {"output_index": len(self._items) - 1, "content_index": 0}
                out += self._numbered(
                    kind, {"type": kind, "item_id": item_id, "part": part, **index}
                )
        place = self._items.get(str(item_id if item_id is not None else (item or {}).get("id")))
        if place is not None:
            if name == b"response.content_part.added":
                place[1] += 1
            data.setdefault("output_index", place[0])
            if item_id is not None:
                data.setdefault("content_index", max(place[1], 0))
        return (out + self._numbered(name.decode(), data))[:-2]  # its blank line is the caller's

    def _numbered(self, name: str, data: dict[str, Any]) -> bytes:
        """``data`` as the event ``name``, with the stream's next ``sequence_number``."""
        data.setdefault("sequence_number", self._sequence)
        self._sequence += 1
        return _event(name, data)


def _data_of(block: bytes) -> dict[str, Any] | None:
    """An SSE event's ``data:`` JSON object, ``None`` when it has none or another."""
    lines = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
    try:
        data = json.loads(b"\n".join(lines)) if lines else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
