"""A proxied request's deadlines (DESIGN.md layer 7): how long a backend may take to send
its first byte and each next chunk before the request ends with 504.

An upstream answer must bring its first body byte within ``first_byte_s`` of being
sent and each next chunk within ``between_chunks_s`` of the one before.
``first_byte_s`` is the request's own (:func:`first_byte_deadline_s`): its prompt's
tokens over its role's prefill speed (:mod:`rosterd.router.speeds`; for an answer that
is not streamed, its ``max_tokens`` over the generation speed as well), times
:attr:`FirstByteRule.factor`, at least :attr:`FirstByteRule.floor_s` and at most
``--first-byte-timeout``; so a short prompt to a wedged backend is found in tens of
seconds, a long one on a slow node still has minutes. A backend whose progress check
(:mod:`rosterd.router.progress`) saw it move lately ``vouches`` for its request, which
then may wait up to ``--first-byte-timeout``.
:func:`forward_within_deadlines` runs one forwarding under those deadlines, reading the
progress from the messages it sends to the client, and raises :class:`StalledError`
when one passes (the upstream request is cancelled, which closes its connection, so the
backend frees its slot). The proxy then tells the scheduler (``NodeDirectory.suspect``),
which runs the role's generation probe: a wedged backend is found and restarted; the
client gets :func:`stalled_error`.

What happens when a backend cannot be reached at all (the wait for its restart) is a
retry, in :mod:`rosterd.router.retries`.

Plain asyncio (``asyncio.timeout``, rescheduled per chunk): the deadlines are
the router's own policy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Send

from rosterd.errors import RouterError, StalledError
from rosterd.router.speeds import Speeds

#: Bytes of a request body per prompt token, for a prompt counted without its tokenizer:
#: English text runs about 4 characters a token; 3 counts more tokens, so a longer wait.
BODY_BYTES_PER_TOKEN = 3

#: The fields, by dialect, that bound how many tokens an answer may have.
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True, slots=True)
class FirstByteRule:
    """How a request's first-byte deadline follows from its size, seconds: ``factor`` times
    the time its role's measured (or estimated) speeds give it, at least ``floor_s``
    (a backend's pauses: a prompt cache saved, a batch of other requests) and at most the
    operator's ``--first-byte-timeout``."""

    floor_s: float = 20.0
    factor: float = 4.0


def first_byte_deadline_s(
    payload: Mapping[str, Any], speeds: Speeds, rule: FirstByteRule, cap_s: float
) -> float:
    """The first-byte deadline of the request ``payload``, seconds: its prompt (the body's
    bytes over :data:`BODY_BYTES_PER_TOKEN`) read at ``speeds.prefill`` tokens/s and, when
    the answer is not streamed (its first byte comes after its last token), its
    ``max_tokens`` written at ``speeds.decode``; times ``rule.factor``, within
    ``[rule.floor_s, cap_s]``. A whole answer with no bound on its tokens gets ``cap_s``."""
    prompt_tokens = len(json.dumps(payload, ensure_ascii=False)) / BODY_BYTES_PER_TOKEN
    expected_s = prompt_tokens / speeds.prefill
    if not payload.get("stream"):
        bounds = [payload[f] for f in MAX_TOKENS_FIELDS if isinstance(payload.get(f), int)]
        if not bounds:
            return cap_s
        expected_s += max(bounds) / speeds.decode
    return min(cap_s, max(rule.floor_s, rule.factor * expected_s))


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Per-request upstream deadlines, seconds: to the first body byte, and between chunks;
    ``first_byte_cap_s``: the longest a request its backend vouches for waits for its first
    byte (``--first-byte-timeout``; ``None``: ``first_byte_s``).

    The defaults are for a slow CPU model on a big prompt: prompt processing of
    8k tokens at ~30 tokens/s takes ~270 s before the first byte.
    """

    first_byte_s: float = 300.0
    between_chunks_s: float = 120.0
    first_byte_cap_s: float | None = None


async def forward_within_deadlines(
    forward: Callable[[Send], Awaitable[None]],
    send: Send,
    deadlines: Deadlines,
    role: str,
    *,
    vouched: Callable[[], bool] | None = None,
) -> float | None:
    """Run ``forward(send')``, where ``send'`` passes every message on to ``send``, under
    ``deadlines``: the first non-empty body message must come within
    ``first_byte_s`` (or ``first_byte_cap_s`` when ``vouched()`` says the backend
    progresses at that moment), each next one within ``between_chunks_s``.
    Returns the seconds to the first body byte (``None``: the answer had no body).

    Raises:
        StalledError: a deadline passed; ``forward`` was cancelled (its upstream
            request closed).
    """
    loop = asyncio.get_running_loop()
    seen = {"body": False}
    sent_at = loop.time()
    first_byte_at: float | None = None
    cap_s = max(deadlines.first_byte_s, deadlines.first_byte_cap_s or 0.0)
    first_byte_limit = {"s": deadlines.first_byte_s}

    def judge(timeout: asyncio.Timeout) -> None:
        # The request's own deadline came: ended now unless its backend vouches for it.
        if seen["body"]:
            return
        if vouched is not None and vouched():
            first_byte_limit["s"] = cap_s
            return
        timeout.reschedule(loop.time())

    due: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(cap_s) as timeout:
            if cap_s > deadlines.first_byte_s:
                due = loop.call_later(deadlines.first_byte_s, judge, timeout)

            async def progressing(message: Message) -> None:
                nonlocal first_byte_at
                if message["type"] == "http.response.body" and message.get("body"):
                    if first_byte_at is None:
                        first_byte_at = loop.time()
                    seen["body"] = True
                    timeout.reschedule(loop.time() + deadlines.between_chunks_s)
                await send(message)
                # A client that reads slowly is not the backend's stall.
                if seen["body"]:
                    timeout.reschedule(loop.time() + deadlines.between_chunks_s)

            await forward(progressing)
    except TimeoutError:
        if not timeout.expired():
            raise  # a timeout of something inside, not ours
        if seen["body"]:
            waited = deadlines.between_chunks_s
            what = f"no chunk for {waited:g} s (--chunk-timeout)"
        else:
            waited = first_byte_limit["s"] if cap_s > deadlines.first_byte_s else cap_s
            what = f"no first byte within {waited:.3g} s"
            if waited >= cap_s:
                what += " (--first-byte-timeout)"
            else:
                what += " (the deadline of its prompt's size at the role's speed)"
        raise StalledError(
            f"the backend of role {role!r} sent {what}",
            first_byte=not seen["body"],
            waited_s=waited,
        ) from None
    finally:
        if due is not None:
            due.cancel()
    return None if first_byte_at is None else first_byte_at - sent_at


def stalled_error(stall: StalledError, *, alone: bool = False) -> RouterError:
    """The answer to a request whose backend stalled: 504 ``backend_timeout``; ``alone``:
    the backend progressed on its other requests all the while, so it is left serving."""
    if alone:
        then = "its backend progresses on its other requests, so only this one was cut"
    else:
        then = "the role is being checked and restarted if it hangs"
    return RouterError("backend_timeout", f"{stall}; {then}")
