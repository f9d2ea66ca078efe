"""A finished proxied request, counted once (DESIGN.md layer 7).

Every proxied request ends in :meth:`RequestCounts.done`: ``rosterd_requests_total``
(by role, endpoint and status; 499 for a client that left) and its duration, the
charts' history, and the key's usage (:mod:`rosterd.router.usage_hook`). Kept apart
from the proxy, which decides how a request goes, since counting is the same for
every way it ends.
"""

from __future__ import annotations

from typing import Any

from rosterd.metrics import RosterdMetrics
from rosterd.router.client_side import ClientAnswer
from rosterd.router.history import History
from rosterd.router.usage_hook import KeyUsage


class RequestCounts:
    """The counting of one proxied path's finished requests.

    ``label``: the metrics' ``endpoint``; ``says_usage``: whether the answer reports the
    tokens it used (``count_tokens`` answers a prompt's length but serves nothing).
    """

    def __init__(
        self,
        metrics: RosterdMetrics,
        history: History,
        usage: KeyUsage | None,
        label: str,
        *,
        says_usage: bool,
    ) -> None:
        self.metrics = metrics
        self.history = history
        self.usage = usage
        self.label = label
        self.says_usage = says_usage
        # (role, status) -> its counter and histogram children: labels() takes a lock and
        # builds its key on every call. Bounded by the roles times the statuses sent.
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def done(self, role: str, answer: ClientAnswer, duration_s: float) -> None:
        """Count a request that ended: ``role`` (``"-"`` when no role was resolved), what
        the client was sent (``answer``: status, tokens, tails, queue wait) and how long
        it took, seconds."""
        children = self._children.get((role, answer.status))
        if children is None:
            requests, durations = self.metrics.requests, self.metrics.request_duration
            children = (
                requests.labels(role=role, endpoint=self.label, code=str(answer.status)),
                durations.labels(role=role, endpoint=self.label),
            )
            self._children[(role, answer.status)] = children
        children[0].inc()
        children[1].observe(duration_s)
        if role == "-":
            return
        self.history.request_done(role, answer.tokens)
        if self.usage is not None:  # per key (rosterd.router.usage_hook)
            self.usage.done(
                role,
                answer.status,
                answer.tail if self.says_usage else b"",
                head=answer.head,
                completion=answer.tokens,
                queue_wait_s=answer.waited_s,
                duration_s=duration_s,
            )
