"""OpenAI Responses <-> chat completions (DESIGN.md layer 7, pure translation).

For a backend that serves chat completions but not ``/v1/responses`` (mlx_lm.server):
:class:`ResponsesTranslation` turns a Responses request into a chat request, the chat
answer into a ``response`` object, and a chat stream into Responses' events
(``response.created`` ... ``response.output_text.delta`` ... ``response.completed``),
after OpenAI's API reference (https://platform.openai.com/docs/api-reference/responses).

Carried over: ``input`` (a string, or message items with ``input_text`` /
``output_text`` / ``input_image`` parts, ``function_call`` and
``function_call_output`` items), ``instructions`` (a leading system message),
function ``tools`` and ``tool_choice``, ``max_output_tokens``, ``temperature``,
``top_p``, ``text.format`` (``json_schema``, ``json_object``). What has no chat
equivalent (:data:`NO_EQUIVALENT`, built-in tools such as ``web_search``, items such
as ``reasoning``) is refused with 501 ``not_translatable`` naming the field, the role
and its flavor: a stateless chat backend cannot keep a conversation or run a tool.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from rosterd.errors import RouterError
from rosterd.router.dialects.anthropic import sse_event

#: Request fields that need state or machinery a chat completions backend lacks.
NO_EQUIVALENT = ("previous_response_id", "conversation", "background", "prompt")


def _no_equivalent(field: str) -> RouterError:
    """501 ``not_translatable`` for ``field``; :class:`ResponsesTranslation` prefixes the
    role and flavor (the pure builders here do not know them)."""
    return RouterError(
        "not_translatable",
        f"serves chat completions only, and the Responses field {field} has no equivalent "
        "there; drop it, or send the request to a llama.cpp role (llama-server serves "
        "/v1/responses itself)",
    )


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RouterError("bad_request", f"{where}.content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise _no_equivalent(f"{where}.content[{index}].type={kind!r}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _input_messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RouterError("bad_request", "'input' must be a string or a list of items")
    out: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise RouterError("bad_request", f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role")))
            out.append({"role": role, "content": _parts(item.get("content", ""), where)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {
                    "name": str(item.get("name", "")),
                    "arguments": str(item.get("arguments", "")),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append(
                {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text}
            )
        else:
            raise _no_equivalent(f"{where}.type={kind!r}")
    return out


def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    out = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _no_equivalent(f"tools[{index}].type={kind!r}")
        function = {
            "name": tool.get("name", ""),
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return out


def responses_to_chat(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions request for a Responses request ``payload`` (``model`` kept).

    Raises:
        RouterError: 501 ``not_translatable`` for a field of :data:`NO_EQUIVALENT`, a
            built-in tool, an input item or part that chat cannot carry; 400
            ``bad_request`` for an ``input`` that is not a string or items.
    """
    for name in NO_EQUIVALENT:
        if payload.get(name):
            raise _no_equivalent(name)
    messages = _input_messages(payload.get("input", ""))
    instructions = payload.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    out: dict[str, Any] = {"model": payload.get("model"), "messages": messages}
    if payload.get("max_output_tokens") is not None:
        out["max_tokens"] = payload["max_output_tokens"]
    for name in ("temperature", "top_p"):
        if payload.get(name) is not None:
            out[name] = payload[name]
    if isinstance(payload.get("tools"), list) and payload["tools"]:
        out["tools"] = _tools(payload["tools"])
        choice = payload.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif isinstance(choice, str):
            out["tool_choice"] = choice
    fmt = (
        (payload.get("text") or {}).get("format") if isinstance(payload.get("text"), dict) else None
    )
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    if payload.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _usage(usage: Any) -> dict[str, Any]:
    usage = usage if isinstance(usage, dict) else {}
    given = int(usage.get("prompt_tokens") or 0)
    made = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": given,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": made,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": given + made,
    }


def _response(
    rid: str, model: str, output: list[dict[str, Any]], status: str, usage: Any, finish: str
) -> dict[str, Any]:
    incomplete = finish == "length"
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete and status == "completed" else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "instructions": None,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "usage": _usage(usage) if usage is not None else None,
    }


def _text_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def chat_to_response(chat: Mapping[str, Any]) -> dict[str, Any]:
    """The ``response`` object for a whole chat completion ``chat`` (its first choice)."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_text_item(f"msg_{uuid.uuid4().hex}", str(message["content"])))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            _call_item(
                f"fc_{uuid.uuid4().hex}",
                str(call.get("id") or f"call_{uuid.uuid4().hex}"),
                str(function.get("name", "")),
                str(function.get("arguments", "")),
                "completed",
            )
        )
    finish = str(choice.get("finish_reason"))
    rid = f"resp_{chat.get('id') or uuid.uuid4().hex}"
    return _response(
        rid, str(chat.get("model", "")), output, "completed", chat.get("usage"), finish
    )


class ResponsesStream:
    """Chat completion chunks in, Responses stream events out (each ``bytes``, SSE-framed,
    numbered by ``sequence_number``). One ``message`` item holds the text; each tool call
    (by its chunk ``index``) is a ``function_call`` item whose arguments arrive as
    ``response.function_call_arguments.delta``; every item is closed at ``[DONE]``."""

    def __init__(self) -> None:
        self.sequence = 0
        self.rid = f"resp_{uuid.uuid4().hex}"
        self.model = ""
        self.started = False
        self.text_index: int | None = None
        self.text_id = f"msg_{uuid.uuid4().hex}"
        self.text = ""
        self.calls: dict[int, dict[str, Any]] = {}  # chat index -> item (with output_index)
        self.items = 0
        self.usage: Any = None
        self.finish_reason = "stop"

    def _event(self, name: str, **fields: Any) -> bytes:
        body = {"type": name, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(name, body)

    def _start(self, chunk: Mapping[str, Any]) -> list[bytes]:
        self.started = True
        self.model = str(chunk.get("model", ""))
        shell = _response(self.rid, self.model, [], "in_progress", None, "stop")
        return [
            self._event("response.created", response=shell),
            self._event("response.in_progress", response=shell),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        """The events for one chat completion chunk."""
        out = [] if self.started else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text_delta(str(delta["content"]))
            for call in delta.get("tool_calls") or []:
                out += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def _text_delta(self, text: str) -> list[bytes]:
        out = []
        if self.text_index is None:
            self.text_index = self.items
            self.items += 1
            item = _text_item(self.text_id, "", "in_progress")
            out.append(
                self._event("response.output_item.added", output_index=self.text_index, item=item)
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.text_id,
                    output_index=self.text_index,
                    content_index=0,
                    part=part,
                )
            )
        self.text += text
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self.text_id,
                output_index=self.text_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _call_delta(self, call: Mapping[str, Any]) -> list[bytes]:
        out = []
        index = int(call.get("index", 0))
        function = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            item = _call_item(
                f"fc_{uuid.uuid4().hex}",
                str(call.get("id") or f"call_{uuid.uuid4().hex}"),
                str(function.get("name", "")),
                "",
                "in_progress",
            )
            item["output_index"] = self.items
            self.items += 1
            self.calls[index] = item
            shown = {k: v for k, v in item.items() if k != "output_index"}
            out.append(
                self._event(
                    "response.output_item.added", output_index=item["output_index"], item=shown
                )
            )
        if function.get("arguments"):
            item["arguments"] += str(function["arguments"])
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=item["output_index"],
                    delta=str(function["arguments"]),
                )
            )
        return out

    def finish(self) -> list[bytes]:
        """The closing events (every item done, then ``response.completed``)."""
        out = [] if self.started else self._start({})
        done: list[tuple[int, dict[str, Any]]] = []
        if self.text_index is not None:
            part = {"type": "output_text", "text": self.text, "annotations": []}
            ids = {"item_id": self.text_id, "output_index": self.text_index, "content_index": 0}
            out.append(self._event("response.output_text.done", **ids, text=self.text, logprobs=[]))
            out.append(self._event("response.content_part.done", **ids, part=part))
            item = _text_item(self.text_id, self.text)
            out.append(
                self._event("response.output_item.done", output_index=self.text_index, item=item)
            )
            done.append((self.text_index, item))
        for call in self.calls.values():
            index = call.pop("output_index")
            call["status"] = "completed"
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=call["id"],
                    output_index=index,
                    arguments=call["arguments"],
                )
            )
            out.append(self._event("response.output_item.done", output_index=index, item=call))
            done.append((index, call))
        output = [item for _, item in sorted(done, key=lambda pair: pair[0])]
        whole = _response(
            self.rid, self.model, output, "completed", self.usage or {}, self.finish_reason
        )
        name = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        out.append(self._event(name, response=whole))
        return out


class ResponsesTranslation:
    """The Responses dialect over a chat completions backend (see the module)."""

    def chat_request(self, payload: Mapping[str, Any], who: str) -> dict[str, Any]:
        """:func:`responses_to_chat`; a field with no equivalent raises 501
        ``not_translatable`` naming it and ``who`` (the role and its flavor)."""
        try:
            return responses_to_chat(payload)
        except RouterError as err:
            if err.code != "not_translatable":
                raise
            raise RouterError(err.code, f"{who} {err.message}") from None

    def answer(self, chat: Mapping[str, Any]) -> dict[str, Any]:
        """:func:`chat_to_response`."""
        return chat_to_response(chat)

    def stream(self) -> ResponsesStream:
        """A fresh :class:`ResponsesStream` for one answer."""
        return ResponsesStream()
