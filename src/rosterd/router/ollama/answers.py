"""An OpenAI answer as Ollama's (DESIGN.md layer 7; pure: the caller gives the time).

The shapes are Ollama's (``docs/api.md`` of github.com/ollama/ollama): a whole
answer is one JSON object; a stream is NDJSON, one object per line, each
``"done": false`` with the next piece of text, then one ``"done": true`` with
``done_reason`` and the counts (durations in nanoseconds). Tool calls come whole,
with their arguments as an object, in one line. An error is ``{"error": "..."}``:
the body of an error answer, or the last line of a stream cut midway.

:class:`StreamTranslator` reads an OpenAI event stream (server-sent events, as
the backend sends them, in any chunking) and gives the NDJSON lines.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

#: OpenAI ``finish_reason`` -> Ollama ``done_reason`` (Ollama says ``stop`` after tool calls).
_DONE_REASONS: Mapping[str, str] = {"stop": "stop", "length": "length", "tool_calls": "stop"}

_NS_PER_MS = 1_000_000
#: OpenAI ``usage`` -> Ollama's counts; llama-server's ``timings`` (ms) -> Ollama's (ns).
_USAGE_COUNTS = (("prompt_tokens", "prompt_eval_count"), ("completion_tokens", "eval_count"))
_TIMINGS = (("prompt_ms", "prompt_eval_duration"), ("predicted_ms", "eval_duration"))


def created_at(now_s: float) -> str:
    """``now_s`` (Unix seconds) as Ollama's ``created_at``: RFC 3339 in UTC."""
    moment = dt.datetime.fromtimestamp(now_s, tz=dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def error_line(message: str) -> bytes:
    """Ollama's error object, as an NDJSON line (the body of an error answer is the same)."""
    return _line({"error": message})


def error_message(body: bytes) -> str:
    """The message of an error answer's body: OpenAI's ``error.message``, Ollama's ``error``
    text, or the body itself."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return error if isinstance(error, str) else body.decode(errors="replace")


def counts(usage: object, timings: object, total_ns: int, load_ns: int = 0) -> dict[str, int]:
    """Ollama's counts of a finished generation: ``total_duration`` and ``load_duration``
    (ns, measured by the router), token counts from OpenAI's ``usage``, and llama-server's
    ``timings`` (ms) as ``prompt_eval_duration`` and ``eval_duration`` when it sent them."""
    out = {"total_duration": total_ns, "load_duration": load_ns}
    if isinstance(usage, dict):
        for source, target in (
            ("prompt_tokens", "prompt_eval_count"),
            ("completion_tokens", "eval_count"),
        ):
            if isinstance(usage.get(source), int):
                out[target] = usage[source]
    if isinstance(timings, dict):
        for source, target in (
            ("prompt_ms", "prompt_eval_duration"),
            ("predicted_ms", "eval_duration"),
        ):
            if isinstance(timings.get(source), int | float):
                out[target] = int(timings[source] * _NS_PER_MS)
    return out


def tool_calls(calls: object) -> list[dict[str, Any]]:
    """OpenAI tool calls as Ollama's: ``{"function": {"name", "arguments": {...}}}``, the
    arguments parsed (kept as text when they are not JSON)."""
    out: list[dict[str, Any]] = []
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments: object = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        out.append({"function": {"name": function.get("name", ""), "arguments": arguments}})
    return out


def whole_answer(
    kind: str, data: Mapping[str, Any], *, model: str, now_s: float, total_ns: int
) -> dict[str, Any]:
    """The Ollama answer of a ``kind`` request (``chat``, ``generate``, ``embed``,
    ``embeddings``) from the backend's whole OpenAI answer ``data``; ``model``: the name the
    client asked for (Ollama answers with it)."""
    if kind == "embeddings":
        rows = _embedding_rows(data)
        return {"embedding": rows[0] if rows else []}
    if kind == "embed":
        usage = data.get("usage")
        answer: dict[str, Any] = {"model": model, "embeddings": _embedding_rows(data)}
        answer["total_duration"] = total_ns
        answer["load_duration"] = 0
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            answer["prompt_eval_count"] = usage["prompt_tokens"]
        return answer
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    text = message.get("content") if message else choice.get("text")
    reason = _DONE_REASONS.get(str(choice.get("finish_reason")), "stop")
    answer = {"model": model, "created_at": created_at(now_s)}
    if kind == "chat":
        reply: dict[str, Any] = {"role": "assistant", "content": text or ""}
        if message.get("reasoning_content"):
            reply["thinking"] = message["reasoning_content"]
        if message.get("tool_calls"):
            reply["tool_calls"] = tool_calls(message["tool_calls"])
        answer["message"] = reply
    else:
        answer["response"] = text or ""
        if message.get("reasoning_content"):
            answer["thinking"] = message["reasoning_content"]
    answer |= {"done": True, "done_reason": reason}
    answer |= counts(data.get("usage"), data.get("timings"), total_ns)
    return answer


def load_answer(kind: str, *, model: str, now_s: float, reason: str) -> dict[str, Any]:
    """The answer to a request that only named its model: loaded (``reason`` ``load``) or
    unloaded (``unload``), as Ollama answers it."""
    answer: dict[str, Any] = {"model": model, "created_at": created_at(now_s)}
    if kind == "chat":
        answer["message"] = {"role": "assistant", "content": ""}
    else:
        answer["response"] = ""
    return answer | {"done": True, "done_reason": reason}


def _embedding_rows(data: Mapping[str, Any]) -> list[Any]:
    rows = data.get("data")
    if not isinstance(rows, list):
        return []
    ordered = sorted(
        (row for row in rows if isinstance(row, dict)), key=lambda row: row.get("index", 0)
    )
    return [row.get("embedding", []) for row in ordered]


def _line(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class StreamTranslator:
    """An OpenAI event stream (chat completions or completions) as Ollama's NDJSON.

    ``kind``: ``chat`` (pieces in ``message.content``) or ``generate`` (in
    ``response``); ``model``: the name the client asked for. Feed the backend's
    bytes to :meth:`feed` as they come (events may be split anywhere); each call
    returns the complete lines so far. ``data: [DONE]`` gives the last line,
    ``"done": true`` with the counts; an error event gives an error line. ``now_s``
    and ``total_ns`` are the caller's clock, read when :meth:`feed` is called.
    """

    def __init__(self, kind: str, model: str) -> None:
        self.kind = kind
        self.model = model
        self.finished = False
        self._pending = b""
        self._reason = "stop"
        self._usage: object = None
        self._timings: object = None
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: bytes, *, now_s: float, total_ns: int) -> bytes:
        """The NDJSON lines completed by ``chunk`` (``b""`` when none)."""
        self._pending += chunk.replace(b"\r\n", b"\n")
        out: list[bytes] = []
        while b"\n\n" in self._pending and not self.finished:
            event, self._pending = self._pending.split(b"\n\n", 1)
            data = b"\n".join(
                line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
            )
            if data:
                out.append(self._event(data, now_s, total_ns))
        return b"".join(out)

    def _event(self, data: bytes, now_s: float, total_ns: int) -> bytes:
        if data == b"[DONE]":
            self.finished = True
            return self._last(now_s, total_ns)
        try:
            event = json.loads(data)
        except ValueError:
            return b""
        if not isinstance(event, dict):
            return b""
        if "error" in event:
            self.finished = True
            return error_line(error_message(data))
        self._usage = event.get("usage") or self._usage
        self._timings = event.get("timings") or self._timings
        out = b""
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                self._reason = _DONE_REASONS.get(str(choice["finish_reason"]), "stop")
            given = choice.get("delta")
            delta: dict[str, Any] = given if isinstance(given, dict) else {}
            for call in delta.get("tool_calls") or ():
                self._add_call(call)
            text = delta.get("content") if "delta" in choice else choice.get("text")
            thinking = delta.get("reasoning_content")
            if text or thinking:
                out += self._piece(text or "", thinking, now_s)
        return out

    def _add_call(self, call: object) -> None:
        """Gather a streamed tool call's pieces (OpenAI sends its arguments in fragments)."""
        if not isinstance(call, dict):
            return
        whole = self._calls.setdefault(int(call.get("index", 0)), {"name": "", "arguments": ""})
        given = call.get("function")
        function: dict[str, Any] = given if isinstance(given, dict) else {}
        whole["name"] += function.get("name") or ""
        whole["arguments"] += function.get("arguments") or ""

    def _piece(self, text: str, thinking: object, now_s: float) -> bytes:
        line: dict[str, Any] = {"model": self.model, "created_at": created_at(now_s)}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            line["message"] = message
        else:
            line["response"] = text
            if thinking:
                line["thinking"] = thinking
        return _line(line | {"done": False})

    def _last(self, now_s: float, total_ns: int) -> bytes:
        out = b""
        if self._calls:
            calls = [{"function": self._calls[i]} for i in sorted(self._calls)]
            line = {"model": self.model, "created_at": created_at(now_s)}
            message = {"role": "assistant", "content": "", "tool_calls": tool_calls(calls)}
            out += _line(line | {"message": message, "done": False})
        last: dict[str, Any] = {"model": self.model, "created_at": created_at(now_s)}
        if self.kind == "chat":
            last["message"] = {"role": "assistant", "content": ""}
        else:
            last["response"] = ""
        last |= {"done": True, "done_reason": self._reason}
        return out + _line(last | counts(self._usage, self._timings, total_ns))
