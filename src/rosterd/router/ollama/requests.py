"""An Ollama request as the OpenAI request it becomes (DESIGN.md layer 7; pure: values in,
values out).

Ollama's ``/api/chat``, ``/api/generate``, ``/api/embed`` and ``/api/embeddings``
(``docs/api.md`` of github.com/ollama/ollama) map onto the OpenAI routes every
OpenAI-compatible backend serves:

- ``/api/chat`` -> ``/v1/chat/completions``: messages (images as ``image_url`` data
  URLs, tool calls with their arguments as JSON text, tool results), ``tools``,
  ``format`` (``json`` or a JSON schema) as ``response_format``, ``options``;
- ``/api/generate`` -> ``/v1/chat/completions`` with ``system`` and ``prompt`` as its
  messages (Ollama applies the model's template, and so does the chat route), or
  ``/v1/completions`` with ``raw: true`` (no template, the prompt as it is);
- ``/api/embed`` (``input``) and ``/api/embeddings`` (``prompt``) -> ``/v1/embeddings``.

``options`` that sample (``temperature``, ``top_p``, ``top_k``, ``seed``,
``num_predict``, ``stop``, penalties...) become the OpenAI request's fields (and
llama-server's own names where OpenAI has none); the options that size a load
(``num_ctx``, ``num_gpu``, ``num_thread``, ...) are left out: the fleet file sets
how a role is launched. Ollama's ``stream`` is true unless the request says false.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from rosterd.errors import RouterError
from rosterd.router.routing import ModelNames

#: Ollama's default tag: ``llama3.2`` and ``llama3.2:latest`` name the same model.
LATEST_TAG: Final[str] = ":latest"

#: Ollama ``options`` key -> the OpenAI request field it becomes (llama-server's own
#: names for the samplers OpenAI lacks; a backend ignores the fields it does not know).
OPTION_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "temperature": "temperature",
        "top_p": "top_p",
        "top_k": "top_k",
        "min_p": "min_p",
        "typical_p": "typical_p",
        "seed": "seed",
        "num_predict": "max_tokens",
        "stop": "stop",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "repeat_penalty": "repeat_penalty",
        "repeat_last_n": "repeat_last_n",
        "num_keep": "n_keep",
        "mirostat": "mirostat",
        "mirostat_tau": "mirostat_tau",
        "mirostat_eta": "mirostat_eta",
    }
)

#: A zero duration as Ollama's ``keep_alive`` takes it: a number of seconds, or Go's
#: duration text ("0", "0s", "0m", ...).
_ZERO_DURATION = re.compile(r"0+(\.0*)?(ns|us|µs|ms|s|m|h)?")

#: The image kinds an Ollama client sends (base64, no media type), by their first bytes.
_IMAGE_MAGIC = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


@dataclass(frozen=True, slots=True)
class OpenAICall:
    """What an Ollama request becomes: the OpenAI ``path`` and ``body`` (its ``model`` is
    the role id), and whether the answer ``stream``s."""

    path: str
    body: dict[str, Any]
    stream: bool


def resolve_ollama_name(names: ModelNames, model: str) -> str:
    """The role ``model`` names: a role id, model name or alias, with Ollama's ``:latest``
    tag or without it. Raises :class:`RouterError` 404 ``model_not_found`` (naming the
    known models) as :meth:`ModelNames.resolve` does."""
    if not names.knows(model) and model.endswith(LATEST_TAG):
        bare = model.removesuffix(LATEST_TAG)
        if names.knows(bare):
            return names.resolve(bare)
    return names.resolve(model)


def wants_stream(payload: Mapping[str, Any]) -> bool:
    """Ollama's ``stream``: true unless the request says false. Raises :class:`RouterError`
    400 ``bad_request`` for a value that is not a boolean."""
    stream = payload.get("stream", True)
    if not isinstance(stream, bool):
        raise RouterError("bad_request", "'stream' must be true or false")
    return stream


def keep_alive_zero(payload: Mapping[str, Any]) -> bool:
    """Whether ``keep_alive`` is zero (a number, or duration text such as ``"0s"``): the
    model is to be unloaded once the request is answered."""
    keep_alive = payload.get("keep_alive")
    if isinstance(keep_alive, bool):
        return False
    if isinstance(keep_alive, int | float):
        return keep_alive == 0
    return isinstance(keep_alive, str) and _ZERO_DURATION.fullmatch(keep_alive) is not None


def loads_only(kind: str, payload: Mapping[str, Any]) -> bool:
    """Whether a ``kind`` request (``chat``, ``generate``) only names its model: Ollama then
    loads it (or, with ``keep_alive: 0``, unloads it) and generates nothing."""
    if kind == "chat":
        return not payload.get("messages")
    if kind == "generate":
        return not payload.get("prompt") and not payload.get("images")
    return False


def openai_call(kind: str, role: str, payload: Mapping[str, Any]) -> OpenAICall:
    """The OpenAI request an Ollama ``kind`` request (``chat``, ``generate``, ``embed``,
    ``embeddings``) becomes, for ``role``.

    Raises :class:`RouterError` 400 ``bad_request`` for a field of the wrong shape, and
    400 ``not_supported`` for one no OpenAI route can carry (``/api/generate``'s
    ``suffix`` and ``template``).
    """
    if kind == "embed":
        embed: dict[str, Any] = {"model": role, "input": payload.get("input", [])}
        if isinstance(payload.get("dimensions"), int):
            embed["dimensions"] = payload["dimensions"]
        return OpenAICall("/v1/embeddings", embed, stream=False)
    if kind == "embeddings":
        prompt = payload.get("prompt", "")
        if not isinstance(prompt, str):
            raise RouterError("bad_request", "'prompt' must be a string")
        return OpenAICall("/v1/embeddings", {"model": role, "input": [prompt]}, stream=False)
    stream = wants_stream(payload)
    body: dict[str, Any] = {"model": role, "stream": stream, **sampling(payload.get("options"))}
    if stream:
        # The token counts come in a last chunk only when asked (OpenAI's stream_options).
        body["stream_options"] = {"include_usage": True}
    response_format = _response_format(payload.get("format"))
    if response_format is not None:
        body["response_format"] = response_format
    if kind == "generate":
        for field in ("suffix", "template"):
            if payload.get(field):
                raise RouterError(
                    "not_supported",
                    f"/api/generate's {field!r} has no equivalent on the OpenAI routes rosterd "
                    "translates to; leave it out",
                )
        prompt = payload.get("prompt") or ""
        if not isinstance(prompt, str):
            raise RouterError("bad_request", "'prompt' must be a string")
        if payload.get("raw") is True:
            return OpenAICall("/v1/completions", {**body, "prompt": prompt}, stream)
        messages: list[dict[str, Any]] = []
        if isinstance(payload.get("system"), str) and payload["system"]:
            messages.append({"role": "system", "content": payload["system"]})
        messages.append(
            _message({"role": "user", "content": prompt, "images": payload.get("images")})
        )
        return OpenAICall("/v1/chat/completions", {**body, "messages": messages}, stream)
    messages_in = payload.get("messages")
    if not isinstance(messages_in, list) or not all(isinstance(m, dict) for m in messages_in):
        raise RouterError("bad_request", "'messages' must be a list of message objects")
    body["messages"] = chat_messages(messages_in)
    if isinstance(payload.get("tools"), list) and payload["tools"]:
        body["tools"] = payload["tools"]
    return OpenAICall("/v1/chat/completions", body, stream)


def sampling(options: object) -> dict[str, Any]:
    """The OpenAI fields of Ollama's ``options`` (:data:`OPTION_FIELDS`); ``num_predict``
    below 0 (Ollama's "no limit") is left out, and so is every option that sizes a load."""
    if not isinstance(options, dict):
        return {}
    fields: dict[str, Any] = {}
    for key, value in options.items():
        field = OPTION_FIELDS.get(key)
        if field is None or value is None:
            continue
        if key == "num_predict" and isinstance(value, int) and value < 0:
            continue
        fields[field] = value
    return fields


def _response_format(fmt: object) -> dict[str, Any] | None:
    """Ollama's ``format`` as OpenAI's ``response_format``: ``"json"`` is a JSON object, a
    dict is a JSON schema; anything else is no constraint."""
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return None


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama's chat messages as OpenAI's: tool calls get ids (Ollama's have none) and
    their arguments as JSON text; a tool result names the call it answers by
    ``tool_name`` (the latest call of that function), as OpenAI's ``tool_call_id``."""
    out: list[dict[str, Any]] = []
    call_ids: dict[str, str] = {}
    for index, message in enumerate(messages):
        converted = _message(message)
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            converted["tool_calls"] = []
            for number, call in enumerate(calls):
                function = call.get("function", {}) if isinstance(call, dict) else {}
                name = str(function.get("name", ""))
                call_id = f"call_{index}_{number}"
                call_ids[name] = call_id
                arguments = function.get("arguments", {})
                converted["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": arguments
                            if isinstance(arguments, str)
                            else json.dumps(arguments, ensure_ascii=False),
                        },
                    }
                )
        if converted["role"] == "tool":
            tool = message.get("tool_name") or message.get("name")
            if isinstance(tool, str):
                converted["tool_call_id"] = call_ids.get(tool, tool)
        out.append(converted)
    return out


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message's role and content; its ``images`` (base64) as ``image_url`` parts."""
    content = message.get("content") or ""
    images = message.get("images")
    converted: dict[str, Any] = {"role": str(message.get("role", "user"))}
    if isinstance(images, list) and images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
        for image in images:
            if isinstance(image, str):
                url = f"data:{_image_type(image)};base64,{image}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
        converted["content"] = parts
    else:
        converted["content"] = content
    return converted


def _image_type(base64_text: str) -> str:
    """The media type of a base64 image by its first bytes (PNG when unknown)."""
    try:
        head = base64.b64decode(base64_text[:16] + "=" * (-len(base64_text[:16]) % 4))
    except (binascii.Error, ValueError):
        return "image/png"
    return next((kind for magic, kind in _IMAGE_MAGIC if head.startswith(magic)), "image/png")
