"""Progress, not a clock, tells a wedged backend (DESIGN.md layer 7): the progress check.

A long prompt on a CPU node legitimately takes minutes before its first byte, so the
first-byte deadline (``--first-byte-timeout``, 300 s) cannot be short. A backend that
can say how far it has come (the adapter's ``progress_probe``: llama-server's
``/slots``) is asked instead, once a request has had no byte for
:attr:`ProgressCheck.after_s`:

- no answer within :attr:`ProgressCheck.answer_s`: wedged. llama-server answers
  ``/slots`` from its main loop, between two batches (``/health`` answers without
  it), so silence there means the loop is stuck even while ``/health`` says 200;
- the same counters for :attr:`ProgressCheck.window_s`: wedged. The window is
  wider than one batch: llama-server moves ``n_prompt_tokens_processed`` once per
  batch (2,048 tokens; about 13 s apart for gemma-3-270m on two cores);
- counters that move, or an answer the check cannot read (a ``/slots`` turned
  off answers 501): left alone, under the first-byte deadline as before.

While the check can read the backend's counters, it vouches for the request
(:class:`Vouch`): the request's own first-byte deadline (from its prompt's size,
:mod:`rosterd.router.deadlines`) then stretches to ``--first-byte-timeout``, since the
check finds a stuck backend by itself; a backend that cannot tell gets no such grace.

A verdict goes to ``on_wedged`` (the proxy tells the scheduler, which marks the role
unhealthy, revokes its leases with ``backend_unhealthy`` and restarts it); the request
is then cut through its revoked lease. httpx makes the look (a GET every few seconds,
only while a request is quiet).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.types import Message, Send

from rosterd.adapters.base import ProgressProbe
from rosterd.supervisor.backend_http import backend_client

log = logging.getLogger("rosterd.router")

Forward = Callable[[Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ProgressCheck:
    """When and how a quiet request's backend is asked whether it works, seconds.

    ``after_s``: no body byte for this long starts the looks (``math.inf``: never);
    ``answer_s``: a look must be answered within this; ``window_s``: counters unchanged
    this long mean no progress (wider than one batch of the backend); ``every_s``:
    between two looks.
    """

    after_s: float = 15.0
    answer_s: float = 5.0
    window_s: float = 45.0
    every_s: float = 5.0


class Vouch:
    """Whether a request's backend can show its progress, so its request may wait for its
    first byte up to ``--first-byte-timeout``: yes until a look found it cannot tell (an
    error status, an answer that is not its counters); ``False`` for a backend with no
    progress probe at all (:meth:`never`). Call it for the answer."""

    def __init__(self, can_tell: bool = True) -> None:
        self.can_tell = can_tell

    @classmethod
    def never(cls) -> Vouch:
        """The vouch of a backend that has no progress signal."""
        return cls(can_tell=False)

    def __call__(self) -> bool:
        return self.can_tell


async def wedged_verdict(
    base_url: str,
    probe: ProgressProbe,
    quiet_since: Callable[[], float],
    check: ProgressCheck,
    vouch: Vouch | None = None,
) -> str | None:
    """Look at the backend at ``base_url`` while its request is quiet (``quiet_since()``: the
    loop time of its last body byte) until it is found wedged: returns why, in words.
    Returns ``None`` when the backend cannot tell (an error status, an answer that is not
    its counters; ``vouch`` is then withdrawn); runs until cancelled while the backend
    progresses."""
    vouch = vouch if vouch is not None else Vouch()
    loop = asyncio.get_running_loop()
    seen: tuple[int, ...] | None = None
    changed_at = 0.0
    async with backend_client(timeout_s=check.answer_s) as client:
        while True:
            quiet_s = loop.time() - quiet_since()
            if quiet_s < check.after_s:
                seen = None  # bytes came: a new quiet spell starts a new window
                await asyncio.sleep(check.after_s - quiet_s)
                continue
            asked_at = loop.time()
            # Named without its slash: ps and clients get messages with paths cut short.
            what = probe.path.strip("/")
            try:
                async with asyncio.timeout(check.answer_s):
                    answer = await client.get(base_url + probe.path)
            except TimeoutError:
                return (
                    f"no byte for {quiet_s:.0f} s and its {what} endpoint gave no answer "
                    f"within {check.answer_s:g} s"
                )
            except httpx.HTTPError as exc:
                # Refused or reset: a backend that died is the supervisor's to see.
                log.info("progress check of %s: %s", base_url, exc)
                await asyncio.sleep(check.every_s)
                continue
            if answer.status_code != 200:
                vouch.can_tell = False
                return None
            try:
                counters = probe.counters(answer.json())
            except ValueError:
                vouch.can_tell = False
                return None
            if counters != seen:
                seen, changed_at = counters, asked_at
            elif asked_at - changed_at >= check.window_s:
                return (
                    f"no byte for {quiet_s:.0f} s and no progress in its {what} "
                    f"counters for {asked_at - changed_at:.0f} s"
                )
            await asyncio.sleep(check.every_s)


def watched(
    forward: Forward,
    *,
    base_url: str,
    probe: ProgressProbe | None,
    check: ProgressCheck,
    on_wedged: Callable[[str], None],
    vouch: Vouch | None = None,
) -> Forward:
    """``forward`` with the progress check running beside it: while it runs,
    :func:`wedged_verdict` watches the body bytes it sends, and a verdict is given to
    ``on_wedged`` (which must end the request, e.g. by revoking its lease); ``vouch`` is
    withdrawn when the backend cannot tell. ``forward`` itself when ``probe`` is ``None``
    (the backend cannot tell) or the check is off."""
    if probe is None or not math.isfinite(check.after_s):
        return forward

    async def forward_watched(send: Send) -> None:
        loop = asyncio.get_running_loop()
        last_byte_at = loop.time()

        async def tracked(message: Message) -> None:
            nonlocal last_byte_at
            if message["type"] == "http.response.body" and message.get("body"):
                last_byte_at = loop.time()
            await send(message)

        def report(task: asyncio.Task[str | None]) -> None:
            if task.cancelled():
                return
            if task.exception() is not None:
                log.warning("progress check of %s failed: %r", base_url, task.exception())
                return
            verdict = task.result()
            if verdict is not None:
                log.warning("the backend at %s is wedged: %s", base_url, verdict)
                on_wedged(verdict)

        watchers: list[asyncio.Task[str | None]] = []

        def start() -> None:
            watcher = loop.create_task(
                wedged_verdict(base_url, probe, lambda: last_byte_at, check, vouch)
            )
            watcher.add_done_callback(report)
            watchers.append(watcher)

        # A timer, not a task, until the first look is due: most requests end before it, and
        # a task (and an HTTP client) per request would cost them time for nothing.
        due = loop.call_later(check.after_s, start)
        try:
            await forward(tracked)
        finally:
            due.cancel()
            for watcher in watchers:
                watcher.remove_done_callback(report)
                watcher.cancel()

    return forward_watched
