"""The requests the proxy sends a backend (DESIGN.md layer 7): the client's request itself,
sent once more on a fresh connection when the backend closed the pooled one unanswered
(retry 1 of :mod:`~rosterd.router.retries`), and the count of a request's prompt, asked
when a stream lost the event that said it (:mod:`~rosterd.router.stream_repair`)."""

from __future__ import annotations

import json
import logging

from rosterd.errors import UpstreamClosedError, UpstreamError
from rosterd.router.retries import RETRIES
from rosterd.router.upstream import Upstream, UpstreamResponse

log = logging.getLogger("rosterd.router")

#: llama-server's (and Anthropic's) route that counts a Messages request's prompt.
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


async def send_upstream(
    upstream: Upstream, base_url: str, path: str, body: bytes, accept: str, role: str
) -> UpstreamResponse:
    """``POST`` ``body`` to ``base_url + path``; once more on a new connection when the
    backend closed the pooled one without answering.

    Idle connections expire before the backend's keep-alive timeout
    (``RouterConfig.upstream_keepalive_s``), but a backend may still close one as the
    pool hands it out: the request then fails before any answer byte, so the backend
    never took it and sending it again (on a new connection, never a pooled one) is safe.

    Raises:
        UpstreamError: the retry failed too, or any other failure.
    """
    try:
        return await upstream.post(base_url, path, body, accept)
    except UpstreamClosedError as exc:
        if not RETRIES.fresh_connection:
            raise
        log.info("backend of %s closed a pooled connection (%s); retrying once", role, exc)
    return await upstream.post(base_url, path, body, accept, fresh=True)


async def prompt_tokens(upstream: Upstream, base_url: str, body: bytes, role: str) -> int | None:
    """The prompt's tokens of the Messages request ``body`` as the backend counts them
    (:data:`COUNT_TOKENS_PATH`'s ``input_tokens``); ``None`` when it cannot say (never
    raises: the count is for display and usage, not worth failing an answer for)."""
    try:
        answer = await send_upstream(
            upstream, base_url, COUNT_TOKENS_PATH, body, "application/json", role
        )
        try:
            said = json.loads(await answer.read()) if answer.status == 200 else None
        finally:
            answer.close()
    except (UpstreamError, ValueError):
        return None
    tokens = said.get("input_tokens") if isinstance(said, dict) else None
    return tokens if isinstance(tokens, int) else None
