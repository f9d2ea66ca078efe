"""Usage per key at the router (DESIGN.md layer 7): each finished proxied request counted
for its key's name and role (:class:`KeyUsage`), into the usage database
(:mod:`rosterd.usage`) and Prometheus counters labelled by key name, and
``GET /rosterd/usage``.

Tokens are what the backend reported in its answer, read from the answer's end as the
page's charts read them (:func:`rosterd.router.history.generated_tokens`), in every dialect:
for a request rosterd translated (Anthropic's Messages or OpenAI's Responses to a backend
without them, Ollama's ``/api/chat`` and ``/api/generate`` to any but ollama) from the chat
completion the backend answered. Prompt tokens are the whole prompt's, cached or not: the
last ``usage.prompt_tokens``; else ``usage.input_tokens`` plus Anthropic's
``cache_read_input_tokens`` and ``cache_creation_input_tokens`` (its ``input_tokens`` leaves
out what the cache held; OpenAI's Responses counts it in and has neither); else Ollama's
``prompt_eval_count``; else llama-server's ``timings.prompt_n``; and where the answer's end
does not say (an Anthropic stream says it in ``message_start``), the same read from the
answer's first bytes. A request made without a key (an open router) is counted under the
name ``-``.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rosterd.errors import RouterError
from rosterd.metrics import RosterdMetrics
from rosterd.router.caller import caller
from rosterd.router.history import generated_tokens
from rosterd.router.key_limits import DAY_S, KeyLimiter
from rosterd.router.openai_errors import error_response
from rosterd.usage import UsageStore, parse_since
from rosterd.usage.store import GROUPINGS

#: The key name of requests made without a key.
NO_KEY: Final[str] = "-"
#: ``GET /rosterd/usage``'s window unless ``since`` says otherwise.
DEFAULT_SINCE: Final[str] = "7d"

_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_INPUT_TOKENS = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_CACHE_READ = re.compile(rb'"cache_read_input_tokens"\s*:\s*(\d+)')
_CACHE_CREATION = re.compile(rb'"cache_creation_input_tokens"\s*:\s*(\d+)')
_PROMPT_EVAL_COUNT = re.compile(rb'"prompt_eval_count"\s*:\s*(\d+)')
_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d+)')


def _last(pattern: re.Pattern[bytes], text: bytes) -> int | None:
    found = pattern.findall(text)
    return int(found[-1]) if found else None


def said_prompt_tokens(text: bytes) -> int | None:
    """The whole prompt's tokens as ``text`` (an answer's bytes) says them (see the
    module; Anthropic's cached tokens added back), or ``None`` where it says none."""
    for pattern in (_PROMPT_TOKENS, _INPUT_TOKENS, _PROMPT_EVAL_COUNT, _PROMPT_N):
        said = _last(pattern, text)
        if said is not None:
            if pattern is _INPUT_TOKENS:  # Anthropic's: what the cache held comes apart
                said += (_last(_CACHE_READ, text) or 0) + (_last(_CACHE_CREATION, text) or 0)
            return said
    return None


def prompt_tokens(tail: bytes, head: bytes = b"") -> int:
    """The prompt tokens an answer says it read (see the module): from ``tail``, its last
    bytes, else from ``head``, its first; 0 when neither says."""
    said = said_prompt_tokens(tail)
    if said is None and head:
        said = said_prompt_tokens(head)
    return said or 0


class KeyUsage:
    """Counts finished requests per key name and role: into ``store`` (``None``: not kept)
    and ``rosterd_key_requests_total{key, role, code}`` and
    ``rosterd_key_tokens_total{key, role, kind}`` (``kind``: ``prompt`` or
    ``completion``) in ``metrics`` (``RosterdMetrics.key_requests``, ``key_tokens``); each
    key's tokens also to ``limiter`` (its tokens per
    day)."""

    def __init__(
        self,
        store: UsageStore | None,
        metrics: RosterdMetrics,
        limiter: KeyLimiter | None = None,
    ) -> None:
        self.store = store
        self.limiter = limiter
        # (key, role, status) -> its counters' children (requests, prompt and completion
        # tokens): labels() takes a lock and builds its key on every call (the proxy keeps
        # its own counters so too).
        self._counted: dict[tuple[str, str, int], Any] = {}
        self.requests = metrics.key_requests
        self.tokens = metrics.key_tokens

    def done(
        self,
        role: str,
        status: int,
        tail: bytes,
        *,
        head: bytes = b"",
        completion: int | None = None,
        queue_wait_s: float,
        duration_s: float,
    ) -> None:
        """Count one finished request of the caller's key on ``role``: ``status`` its HTTP
        status (0: none sent; 4xx or 5xx, or none, is an error), ``tail`` and ``head`` its
        answer's last and first bytes (tokens; ``completion``: its completion tokens when
        already read from it),
        ``queue_wait_s`` its wait for the role and ``duration_s`` its whole time, seconds
        (served: the difference)."""
        key = caller()
        name = key.name if key is not None else NO_KEY
        prompt = prompt_tokens(tail, head) if tail else 0
        if completion is None:
            completion = generated_tokens(tail) if tail else 0
        counted = self._counted.get((name, role, status))
        if counted is None:
            counted = self._counted[(name, role, status)] = (
                self.requests.labels(key=name, role=role, code=str(status)),
                self.tokens.labels(key=name, role=role, kind="prompt"),
                self.tokens.labels(key=name, role=role, kind="completion"),
            )
        counted[0].inc()
        if prompt:
            counted[1].inc(prompt)
        if completion:
            counted[2].inc(completion)
        if self.limiter is not None and key is not None and key.limits.tokens_per_day:
            self.limiter.used(name, prompt + completion)
        if self.store is not None:
            self.store.record(
                name,
                role,
                error=not 200 <= status < 400,
                prompt_tokens=prompt,
                completion_tokens=completion,
                queue_wait_s=queue_wait_s,
                served_s=max(0.0, duration_s - queue_wait_s),
            )

    async def endpoint(self, request: Request) -> Response:
        """``GET /rosterd/usage?since=7d&by=key,role``: ``{"since": epoch seconds, "by":
        [...], "rows": [{key?, role?, requests, errors, prompt_tokens, completion_tokens,
        queue_wait_s, served_s}]}`` from the hour holding ``now - since`` on; 400
        ``bad_request`` for a bad ``since`` or ``by``, 404 when usage is not kept."""
        if self.store is None:
            return error_response(RouterError("not_found", "usage is not kept by this router"))
        try:
            since_s = parse_since(request.query_params.get("since", DEFAULT_SINCE))
        except ValueError as exc:
            return error_response(RouterError("bad_request", f"since: {exc}"))
        by = [b for b in request.query_params.get("by", "key,role").split(",") if b]
        if any(b not in GROUPINGS for b in by):
            return error_response(
                RouterError("bad_request", f"by: expected key, role or both, found {by!r}")
            )
        start = time.time() - since_s
        rows: Any = await asyncio.to_thread(self.store.totals, start, by)
        return JSONResponse({"since": start, "by": by, "rows": rows})


def tokens_today(store: UsageStore | None, now_s: float) -> dict[str, int]:
    """Tokens per key name so far in the UTC day of ``now_s`` (epoch seconds), from
    ``store`` (empty without one); blocking (a read of the usage database)."""
    if store is None:
        return {}
    day_start = now_s // DAY_S * DAY_S
    rows = store.totals(day_start, ["key"])
    return {
        str(r["key"]): int(str(r["prompt_tokens"])) + int(str(r["completion_tokens"])) for r in rows
    }
