"""Requests checked before they reach a backend (DESIGN.md layer 7, pure): what each
dialect's own API refuses.

A malformed request must not reach a backend: llama-server given ``"messages": []``
processes with no progress until the wedge check restarts the role, cutting every other
request on it. :func:`check_request` refuses, with 400 ``bad_request`` and the field's
path (``messages[2].content``), what the dialect's own API refuses, and no more, so odd
but valid requests still pass (content as a list of parts, an assistant message with
``tool_calls`` and null content, ``system`` as a list of blocks):

- OpenAI chat completions (``/v1/chat/completions``): ``messages`` a non-empty list of
  objects; ``role`` one of system, developer, user, assistant, tool, function;
  ``content`` a string or a list of parts, required but on an assistant message that
  has ``tool_calls`` or ``function_call`` (OpenAI's ``ChatCompletionAssistantMessageParam``);
  a tool message's ``tool_call_id``; ``max_tokens`` and ``max_completion_tokens`` at
  least 1.
- OpenAI completions (``/v1/completions``): ``max_tokens`` at least 0 (OpenAI's minimum).
- Anthropic Messages (``/v1/messages``, ``count_tokens``): ``messages`` a non-empty
  list of ``{role: user|assistant, content: string|blocks}``; ``system`` a string or a
  list of blocks; ``max_tokens`` (required on ``/v1/messages``) at least 0 (Anthropic's
  minimum: 0 only fills the prompt cache).
- OpenAI Responses (``/v1/responses``): ``input`` a string or a list;
  ``max_output_tokens`` at least 1.
- Ollama (``/api/chat``, ``/api/generate``): ``messages`` a list of objects whose
  ``role`` and ``content`` are strings; ``prompt`` a string; ``options.num_predict`` an
  integer (negative is Ollama's "no limit": -1 endless, -2 until the context is full).

Every token limit is also at most the role's context size (``ctx_size``, tokens) when
it is known: a longer answer cannot fit. :func:`context_overflow_fix` is the sentence
added to a backend's own refusal of a prompt longer than the context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rosterd.errors import RouterError
from rosterd.router.dialects.envelope import backend_error_text

#: OpenAI's chat message roles (``developer`` replaces ``system`` for o1 models;
#: ``function`` is the deprecated form of ``tool``).
OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: Anthropic's message roles (the system prompt is the top-level ``system``).
ANTHROPIC_ROLES = frozenset({"user", "assistant"})

#: Where a role's context size is set, said in every refusal that names it.
CTX_SIZE_SETTING = "ctx_size of the role's entry in the fleet file's models: section"


def _bad(message: str) -> RouterError:
    return RouterError("bad_request", message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_limit(
    payload: Mapping[str, Any],
    field: str,
    *,
    minimum: int,
    ctx_size: int | None,
    required: bool = False,
) -> None:
    """``payload[field]``, a token count: an integer from ``minimum`` to ``ctx_size``."""
    value = payload.get(field)
    if value is None:
        if required:
            raise _bad(f"{field}: required, an integer of at least {minimum}")
        return
    if not _is_int(value):
        raise _bad(f"{field}: expected an integer, got {value!r}"[:200])
    if value < minimum:
        raise _bad(f"{field}: expected an integer of at least {minimum}, got {value}")
    if ctx_size is not None and value > ctx_size:
        raise _bad(
            f"{field}: {value} is more than the role's context size of {ctx_size} tokens; "
            f"ask for fewer, or raise {CTX_SIZE_SETTING}"
        )


def _check_content(content: Any, where: str, what: str) -> None:
    if not isinstance(content, str | list):
        raise _bad(f"{where}.content: expected a string or a list of {what}")


def _check_stream(payload: Mapping[str, Any]) -> None:
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad(f"stream: expected true or false, got {stream!r}"[:200])


def _non_empty_list(payload: Mapping[str, Any], field: str) -> list[Any]:
    items = payload.get(field)
    if not isinstance(items, list):
        raise _bad(f"{field}: required, a list of messages")
    if not items:
        raise _bad(f"{field}: the list is empty; it needs at least one message")
    return items


def _openai_chat(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    for index, message in enumerate(_non_empty_list(payload, "messages")):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _bad(f"{where}: expected an object with role and content")
        role = message.get("role")
        if role not in OPENAI_ROLES:
            raise _bad(f"{where}.role: expected one of {', '.join(sorted(OPENAI_ROLES))}")
        content = message.get("content")
        calls = message.get("tool_calls") or message.get("function_call")
        if content is None and not (role == "assistant" and calls):
            raise _bad(f"{where}.content: required (a string or a list of parts)")
        if content is not None:
            _check_content(content, where, "parts")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise _bad(f"{where}.tool_call_id: required, the id of the tool call answered")
    _check_stream(payload)
    for field in ("max_tokens", "max_completion_tokens"):
        _check_limit(payload, field, minimum=1, ctx_size=ctx_size)


def _openai_completions(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    _check_stream(payload)
    _check_limit(payload, "max_tokens", minimum=0, ctx_size=ctx_size)


def _anthropic(payload: Mapping[str, Any], ctx_size: int | None, *, generates: bool) -> None:
    for index, message in enumerate(_non_empty_list(payload, "messages")):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _bad(f"{where}: expected an object with role and content")
        if message.get("role") not in ANTHROPIC_ROLES:
            raise _bad(f"{where}.role: expected user or assistant")
        _check_content(message.get("content"), where, "content blocks")
    system = payload.get("system")
    if system is not None and not isinstance(system, str | list):
        raise _bad("system: expected a string or a list of text blocks")
    if generates:
        _check_stream(payload)
        _check_limit(payload, "max_tokens", minimum=0, ctx_size=ctx_size, required=True)


def _responses(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    items = payload.get("input")
    if items is not None and not isinstance(items, str | list):
        raise _bad("input: expected a string or a list of input items")
    _check_stream(payload)
    _check_limit(payload, "max_output_tokens", minimum=1, ctx_size=ctx_size)


def _ollama_options(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    options = payload.get("options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise _bad("options: expected an object")
    predict = options.get("num_predict")
    if predict is None:
        return
    if not _is_int(predict):
        raise _bad(f"options.num_predict: expected an integer, got {predict!r}"[:200])
    if ctx_size is not None and predict > ctx_size:
        raise _bad(
            f"options.num_predict: {predict} is more than the role's context size of "
            f"{ctx_size} tokens; ask for fewer (-1: no limit), or raise {CTX_SIZE_SETTING}"
        )


def _ollama_chat(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    messages = payload.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise _bad("messages: expected a list of messages")
        for index, message in enumerate(messages):
            where = f"messages[{index}]"
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _bad(f"{where}: expected an object with a role string")
            content = message.get("content")
            if content is not None and not isinstance(content, str):
                raise _bad(f"{where}.content: expected a string")
    _check_stream(payload)
    _ollama_options(payload, ctx_size)


def _ollama_generate(payload: Mapping[str, Any], ctx_size: int | None) -> None:
    prompt = payload.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _bad("prompt: expected a string")
    _check_stream(payload)
    _ollama_options(payload, ctx_size)


def check_request(path: str, payload: Mapping[str, Any], *, ctx_size: int | None) -> None:
    """Refuse ``payload`` (the parsed body of a request on ``path``) as its dialect's own API
    would (see the module): a path without rules passes. ``ctx_size``: the role's context
    size, tokens (``None``: not known, no upper bound on token limits).

    Raises:
        RouterError: 400 ``bad_request``, the message starting with the field's path.
    """
    if path == "/v1/chat/completions":
        _openai_chat(payload, ctx_size)
    elif path == "/v1/completions":
        _openai_completions(payload, ctx_size)
    elif path in ("/v1/messages", "/v1/messages/count_tokens"):
        _anthropic(payload, ctx_size, generates=path == "/v1/messages")
    elif path == "/v1/responses":
        _responses(payload, ctx_size)
    elif path == "/api/chat":
        _ollama_chat(payload, ctx_size)
    elif path == "/api/generate":
        _ollama_generate(payload, ctx_size)


def context_overflow_fix(role: str, ctx_size: int | None, backend_message: str) -> str | None:
    """The sentence to add to a backend's refusal of a prompt longer than its context
    (llama-server's ``exceed_context_size_error``: "the request exceeds the available
    context size"), naming ``role``'s ``ctx_size`` and where to raise it; ``None`` for
    any other refusal."""
    if "context size" not in backend_message and "context length" not in backend_message:
        return None
    size = f"ctx_size {ctx_size}" if ctx_size is not None else "the backend's default ctx_size"
    return f"role {role!r} is served with {size}; raise {CTX_SIZE_SETTING} to take longer prompts"


def refusal_text(role: str, ctx_size: int | None, raw: bytes) -> str:
    """The message a backend's own refusal (its 4xx body ``raw``) is relayed with: its words
    (``backend_error_text``), and for a prompt longer than the context the fix
    (:func:`context_overflow_fix`)."""
    text = backend_error_text(raw)
    fix = context_overflow_fix(role, ctx_size, text)
    return text if fix is None else f"{text}; {fix}"
