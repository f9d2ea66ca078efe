"""A proxied request's deadlines (DESIGN.md layer 7): how long a backend may take to send
its first byte and each next chunk before the request ends with 504.

An upstream answer must bring its first body byte within ``first_byte_s`` of being
sent and each next chunk within ``between_chunks_s`` of the one before.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Message, Send

from rosterd.errors import RouterError, StalledError


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Per-request upstream deadlines, seconds: to the first body byte, and between chunks.

    The defaults are for a slow CPU model on a big prompt: prompt processing of
    8k tokens at ~30 tokens/s takes ~270 s before the first byte.
    """

    first_byte_s: float = 300.0
    between_chunks_s: float = 120.0


async def forward_within_deadlines(
    forward: Callable[[Send], Awaitable[None]], send: Send, deadlines: Deadlines, role: str
) -> None:
    """Run ``forward(send')``, where ``send'`` passes every message on to ``send``, under
    ``deadlines``: the first non-empty body message must come within
    ``first_byte_s``, each next one within ``between_chunks_s``.

    Raises:
        StalledError: a deadline passed; ``forward`` was cancelled (its upstream
            request closed).
    """
    loop = asyncio.get_running_loop()
    seen = {"body": False}
    try:
        async with asyncio.timeout(deadlines.first_byte_s) as timeout:

            async def progressing(message: Message) -> None:
                if message["type"] == "http.response.body" and message.get("body"):
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
            waited = deadlines.first_byte_s
            what = f"no first byte within {waited:g} s (--first-byte-timeout)"
        raise StalledError(
            f"the backend of role {role!r} sent {what}",
            first_byte=not seen["body"],
            waited_s=waited,
        ) from None


def stalled_error(stall: StalledError) -> RouterError:
    """The answer to a request whose backend stalled: 504 ``backend_timeout``."""
    return RouterError(
        "backend_timeout", f"{stall}; the role is being checked and restarted if it hangs"
    )
