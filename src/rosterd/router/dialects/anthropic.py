"""Anthropic Messages <-> OpenAI chat completions (DESIGN.md layer 7, pure translation).

For a backend that serves chat completions but not ``/v1/messages`` (mlx_lm.server):
:class:`MessagesTranslation` turns a Messages request into a chat request, the chat
answer into a Messages answer, and a chat stream into Messages' events
(``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta``, ``message_stop``). What it carries over, after Anthropic's API
reference (https://docs.anthropic.com/en/api/messages):

- ``system`` (a string or text blocks) -> a leading ``system`` message;
- ``messages``: text blocks, ``image`` blocks (base64 or URL source -> ``image_url``),
  an assistant's ``tool_use`` blocks -> ``tool_calls``, a user's ``tool_result`` blocks
  -> ``tool`` messages (before the user's other blocks, as chat wants them right after
  the assistant's calls); ``thinking`` blocks are dropped (chat has no field for them);
- ``tools`` -> function tools, ``tool_choice`` (``auto``/``any``/``tool``/``none``) ->
  ``auto``/``required``/a named function/``none``; ``max_tokens``, ``temperature``,
  ``top_p``, ``top_k``, ``stop_sequences`` -> ``stop``;
- back: ``finish_reason`` -> ``stop_reason`` (:data:`STOP_REASONS`), ``usage`` ->
  ``input_tokens`` / ``output_tokens``.

Pure: values in, values out; a request it cannot read raises :class:`RouterError`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rosterd.errors import RouterError

#: OpenAI's ``finish_reason`` -> Anthropic's ``stop_reason``.
STOP_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "stop": "end_turn",
        "length": "max_tokens",
        "tool_calls": "tool_use",
        "function_call": "tool_use",
        "content_filter": "refusal",
    }
)

#: Sampling fields with the same name and meaning in both APIs.
_SAME_FIELDS = ("max_tokens", "temperature", "top_p", "top_k")


def sse_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One server-sent event, ``event: NAME`` and its JSON ``data``, as Anthropic sends them."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {text}\n\n".encode()


def _bad(message: str) -> RouterError:
    return RouterError("bad_request", message)


def _text_of(content: Any) -> str:
    """The text of a string or of a list of blocks (its ``text`` blocks joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def _image_part(block: Mapping[str, Any]) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _bad("an image block needs a 'source' object")
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    elif source.get("type") == "url":
        url = str(source.get("url", ""))
    else:
        raise _bad(f"image source type {source.get('type')!r} is not one of: base64, url")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant_message(blocks: list[Any]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name", "")),
                        "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _user_messages(blocks: list[Any]) -> list[dict[str, Any]]:
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block))
        elif kind == "tool_result":
            text = _text_of(block.get("content", ""))
            if block.get("is_error"):
                text = f"error: {text}"
            tool_messages.append(
                {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}
            )
    out = tool_messages
    if parts:
        if all(p["type"] == "text" for p in parts):
            # Plain text as a string: every chat backend reads that, not all read parts.
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": str(choice.get("name", ""))}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")


def messages_to_chat(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions request for a Messages request ``payload`` (``model`` kept).

    Raises:
        RouterError: 400 ``bad_request`` when ``messages`` is not a list of
            ``{role, content}`` objects, or an image block has no usable source.
    """
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise _bad("'messages' must be a list of {role, content} objects")
    chat: list[dict[str, Any]] = []
    system = _text_of(payload.get("system", ""))
    if system:
        chat.append({"role": "system", "content": system})
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _bad(f"messages[{index}] must be an object with role 'user' or 'assistant'")
        content = message.get("content", "")
        if isinstance(content, str):
            chat.append({"role": message["role"], "content": content})
        elif not isinstance(content, list):
            raise _bad(f"messages[{index}].content must be a string or a list of blocks")
        elif message["role"] == "assistant":
            chat.append(_assistant_message(content))
        else:
            chat.extend(_user_messages(content))
    out: dict[str, Any] = {"model": payload.get("model"), "messages": chat}
    for name in _SAME_FIELDS:
        if name in payload:
            out[name] = payload[name]
    if payload.get("stop_sequences"):
        out["stop"] = payload["stop_sequences"]
    tools = payload.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]
        if "tool_choice" in payload:
            out["tool_choice"] = _tool_choice(payload["tool_choice"])
    if payload.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _message_id(chat_id: Any) -> str:
    return f"msg_{chat_id}" if isinstance(chat_id, str) and chat_id else f"msg_{uuid.uuid4().hex}"


def _tool_input(arguments: Any) -> Any:
    """A tool call's arguments (a JSON text) as the object Anthropic's ``input`` holds."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


def _usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def chat_to_message(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages answer for a chat completion ``chat`` (its first choice)."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": str(message["content"])})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{uuid.uuid4().hex}"),
                "name": str(function.get("name", "")),
                "input": _tool_input(function.get("arguments")),
            }
        )
    return {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model", ""),
        "content": content,
        "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": _usage(chat.get("usage")),
    }


class MessagesStream:
    """Chat completion chunks in, Messages stream events out (each ``bytes``, SSE-framed).

    :meth:`feed` takes one chunk (a parsed ``data:`` object) and returns the events it
    makes; :meth:`finish` (at ``data: [DONE]``) closes the open block and returns
    ``message_delta`` (stop reason, output tokens) and ``message_stop``. A text block is
    opened at the first text; each tool call (by its chunk ``index``) gets its own
    ``tool_use`` block whose arguments arrive as ``input_json_delta``.
    """

    def __init__(self) -> None:
        self.started = False
        self.block_index = -1
        self.open_kind: str | None = None  # "text", or "tool:<chat index>"
        self.finish_reason = "stop"
        self.usage: dict[str, int] = {"input_tokens": 0, "output_tokens": 0}

    def _start(self, chunk: Mapping[str, Any]) -> list[bytes]:
        self.started = True
        message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": chunk.get("model", ""),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [sse_event("message_start", {"type": "message_start", "message": message})]

    def _close_block(self) -> list[bytes]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [
            sse_event(
                "content_block_stop", {"type": "content_block_stop", "index": self.block_index}
            )
        ]

    def _open_block(self, kind: str, block: Mapping[str, Any]) -> list[bytes]:
        out = self._close_block()
        self.block_index += 1
        self.open_kind = kind
        start = {"type": "content_block_start", "index": self.block_index, "content_block": block}
        out.append(sse_event("content_block_start", start))
        return out

    def _delta(self, delta: Mapping[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self.block_index, "delta": delta}
        return sse_event("content_block_delta", body)

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        """The events for one chat completion chunk."""
        out = [] if self.started else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self.open_kind != "text":
                    out += self._open_block("text", {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or []:
                kind = f"tool:{call.get('index', 0)}"
                function = call.get("function") or {}
                if self.open_kind != kind:
                    block = {
                        "type": "tool_use",
                        "id": str(call.get("id") or f"toolu_{uuid.uuid4().hex}"),
                        "name": str(function.get("name", "")),
                        "input": {},
                    }
                    out += self._open_block(kind, block)
                if function.get("arguments"):
                    partial = {"type": "input_json_delta", "partial_json": function["arguments"]}
                    out.append(self._delta(partial))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def finish(self) -> list[bytes]:
        """The closing events, once the chat stream said ``[DONE]``."""
        out = [] if self.started else self._start({})
        out += self._close_block()
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": STOP_REASONS.get(self.finish_reason, "end_turn"),
                "stop_sequence": None,
            },
            "usage": self.usage,
        }
        out.append(sse_event("message_delta", delta))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out


class MessagesTranslation:
    """The Messages dialect over a chat completions backend (see the module)."""

    def chat_request(self, payload: Mapping[str, Any], who: str) -> dict[str, Any]:
        """:func:`messages_to_chat` (every field it reads has a chat equivalent, so ``who``,
        the role, is not named)."""
        return messages_to_chat(payload)

    def answer(self, chat: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`chat_to_message`."""
        return chat_to_message(chat)

    def stream(self) -> MessagesStream:
        """A fresh :class:`MessagesStream` for one answer."""
        return MessagesStream()
