"""The live web page (DESIGN.md layer 7): ``GET /`` and ``/ui``, and the one event stream
it lives on, ``GET /rosterd/events/stream``.

The page is plain HTML, CSS and one small script in ``rosterd/router/static/``
(package data: no build step, nothing fetched from elsewhere). It draws every
node with its memory bar and every role with its state and buttons, from what
the stream sends:

- ``event: snapshot``: the same JSON as ``GET /status``, at once, then every
  :data:`SNAPSHOT_INTERVAL_S` seconds and right after each scheduler event
  (idle times, in-flight and queued counts and measured RSS change without one);
- ``event: scheduler``: one :class:`~rosterd.scheduler.values.SchedulerEvent` as
  ``GET /rosterd/events`` gives it (a load, an eviction with its cause, a crash,
  a restart), the moment the node's loop records it;
- ``event: loads``: after each snapshot, the loads under way with their seconds elapsed
  and expected (:func:`~rosterd.router.load_progress.loads_now`), for the roles'
  progress bars;
- ``event: history``: at connect, the last :data:`HISTORY_EVENTS` of them;
- ``event: sample``: each point of the charts' history
  (:meth:`~rosterd.router.history.History.sample`) as it is closed (at connect, the
  last few: the page skips those it has from ``GET /rosterd/history``).

The charts are drawn with uPlot (MIT, ~50 KB, vendored under ``static/vendor/`` with
its licence): a small, well-kept canvas library for time series, with no dependencies
and nothing to fetch, so the page works on a lab network without the internet.

Keys: a key whose ``models`` list some roles sees only those, here as in ``GET /status``:
the snapshots hold only its roles, and a scheduler event of any other role is not sent
(:func:`shown_event`; the same holds for ``GET /rosterd/events``). The page, its CSS and
its script hold no data and are served without a key; everything they show comes from
the stream, ``/rosterd/logs``, ``/rosterd/history``, ``/rosterd/load|unload``,
``/rosterd/usage`` and (the playground) ``/v1/chat/completions``, which the key gate
guards as every other path. The script sends ``Authorization: Bearer`` with ``fetch``
and reads the stream with ``fetch`` too (``EventSource`` cannot send a header). A cookie
set by a login would have let any other site's page make a logged-in browser load and
unload roles (cross-site requests carry cookies); a header only this page's script sets
cannot be sent that way, and the gate keeps one rule and its constant-time comparison.
The key is kept in the tab's ``sessionStorage``.

Library choice: Starlette's ``StaticFiles`` serves the files from the package,
with ETags and ``304 Not Modified``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Final

from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from rosterd.router.history import History
from rosterd.router.load_progress import loads_now
from rosterd.router.routing import ModelNames
from rosterd.router.streams import LiveStreams
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.values import SchedulerEvent

#: Seconds between two snapshots on a quiet stream.
SNAPSHOT_INTERVAL_S: Final[float] = 1.0
#: Seconds a snapshot waits after a scheduler event, so that a burst of them sends one.
EVENT_SNAPSHOT_DELAY_S: Final[float] = 0.05
#: Scheduler events sent at connect.
HISTORY_EVENTS: Final[int] = 200
#: Scheduler events a slow client may fall behind by; past that it gets a fresh history.
STREAM_QUEUE_EVENTS: Final[int] = 1000
#: Milliseconds a browser waits before it connects again (SSE ``retry:``).
RECONNECT_MS: Final[int] = 2000
#: The paths of the page itself (served without a key: they hold no data).
PAGE_PATHS: Final[tuple[str, ...]] = ("/", "/ui", "/ui/")
#: Where the page's CSS and script are served (without a key).
STATIC_PREFIX: Final[str] = "/ui/static/"

_STATIC = StaticFiles(packages=[("rosterd.router", "static")])


def sse(event: str, data: object) -> bytes:
    """One server-sent event: ``event: NAME`` and its data as one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


#: What stands for a role the caller's key may not see, in an event's ``cause``.
HIDDEN_ROLE: Final[str] = "another role"


def shown_event(event: SchedulerEvent, names: ModelNames | None) -> dict[str, object] | None:
    """``event`` as JSON for the request's key (``rosterd.router.caller``): ``None`` when
    the key may not use its role; else without the roles it may not use (gone from
    ``resident``, and named :data:`HIDDEN_ROLE` in ``cause``, e.g. an eviction's "evicted
    for ROLE"). ``names`` ``None``: every event whole."""
    if names is None:
        return event.as_json()
    if not names.visible(event.role):
        return None
    shown = event.as_json()
    hidden = [r for r in {*names.names_of, *event.resident} if not names.visible(r)]
    if hidden:
        shown["resident"] = [r for r in event.resident if r not in hidden]
        words = "|".join(re.escape(r) for r in sorted(hidden, key=len, reverse=True))
        pattern = rf"(?<![\w.-])(?:{words})(?![\w.-])"
        shown["cause"] = re.sub(pattern, HIDDEN_ROLE, event.cause)
    return shown


def shown_events(events: list[SchedulerEvent], names: ModelNames | None) -> list[dict[str, object]]:
    """:func:`shown_event` of each of ``events``, the hidden ones left out."""
    return [e for e in (shown_event(event, names) for event in events) if e is not None]


def _history(scheduler: NodeDirectory, names: ModelNames | None) -> dict[str, object]:
    return {"events": shown_events(scheduler.events()[-HISTORY_EVENTS:], names)}


def _loads_shown(scheduler: NodeDirectory, names: ModelNames | None) -> list[dict[str, object]]:
    """The loads under way that the request's key may see (all, without ``names``)."""
    loads = loads_now(scheduler)
    if names is None:
        return loads
    return [load for load in loads if names.visible(str(load["role"]))]


async def event_stream(
    scheduler: NodeDirectory,
    status: Callable[[], Awaitable[Mapping[str, object]]],
    streams: LiveStreams,
    *,
    interval_s: float = SNAPSHOT_INTERVAL_S,
    history: History | None = None,
    names: ModelNames | None = None,
) -> AsyncIterator[bytes]:
    """The page's stream: history and a snapshot at once, then scheduler events as they
    are recorded and snapshots (see the module docstring), until ``streams`` closes.

    ``await status()`` is ``GET /status``'s JSON. Every node's listeners hear the events
    (nodes added later are joined at the next snapshot); a client that falls
    :data:`STREAM_QUEUE_EVENTS` behind gets a fresh history instead. With ``history``,
    its new points go out as ``sample`` events, looked for at each snapshot. With
    ``names``, the request's key sees only the events of its roles (:func:`shown_event`).
    """
    queue: asyncio.Queue[SchedulerEvent] = asyncio.Queue(STREAM_QUEUE_EVENTS)
    overflowed = False

    def hear(event: SchedulerEvent) -> None:
        nonlocal overflowed
        try:
            queue.put_nowait(event)
        except asyncio.QueueFull:
            overflowed = True

    joined: dict[str, list[Callable[[SchedulerEvent], None]]] = {}

    def join_nodes() -> None:
        for name, node in scheduler.nodes.items():
            if name not in joined:
                node.listeners.append(hear)
                joined[name] = node.listeners

    join_nodes()
    try:
        yield f"retry: {RECONNECT_MS}\n\n".encode()
        yield sse("history", _history(scheduler, names))
        yield sse("snapshot", await status())
        yield sse("loads", {"loads": _loads_shown(scheduler, names)})
        sent_sample = 0
        next_snapshot = time.monotonic() + interval_s
        while not streams.closed:
            event = await streams.next_item(queue, next_snapshot - time.monotonic())
            if overflowed:  # fell behind: start over from the event log
                overflowed = False
                while not queue.empty():
                    queue.get_nowait()
                yield sse("history", _history(scheduler, names))
                next_snapshot = time.monotonic()
            elif event is not None:
                for shown in shown_events([event, *_drain(queue)], names):
                    yield sse("scheduler", shown)
                # The state after the event, soon: the page shows the new phase at once.
                next_snapshot = min(next_snapshot, time.monotonic() + EVENT_SNAPSHOT_DELAY_S)
            if not streams.closed and time.monotonic() >= next_snapshot:
                join_nodes()
                for number, point in list(history.recent) if history is not None else ():
                    if number > sent_sample:
                        sent_sample = number
                        yield sse("sample", point)
                yield sse("snapshot", await status())
                yield sse("loads", {"loads": _loads_shown(scheduler, names)})
                next_snapshot = time.monotonic() + interval_s
    finally:
        for listeners in joined.values():
            if hear in listeners:
                listeners.remove(hear)


def _drain(queue: asyncio.Queue[SchedulerEvent]) -> list[SchedulerEvent]:
    out: list[SchedulerEvent] = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def page_routes(
    scheduler: NodeDirectory,
    status: Callable[[], Awaitable[Mapping[str, object]]],
    streams: LiveStreams,
    history: History | None = None,
    names: ModelNames | None = None,
) -> list[BaseRoute]:
    """The page's routes: ``/``, ``/ui``, ``/ui/static/*`` and ``/rosterd/events/stream``.

    ``await status()`` gives ``GET /status``'s JSON (the snapshots); ``streams`` ends
    the event streams when serving stops; ``history``'s points go out as ``sample``;
    ``names``: the roles each request's key may see (:func:`shown_event`).
    """

    async def page(_: Request) -> Response:
        index = _STATIC.lookup_path("index.html")[0]
        return FileResponse(
            index,
            media_type="text/html; charset=utf-8",
            headers={
                "Cache-Control": "no-cache",
                # Only this page's own files run or load; nothing from elsewhere.
                "Content-Security-Policy": (
                    "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'"
                ),
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
            },
        )

    async def stream(_: Request) -> Response:
        return StreamingResponse(
            event_stream(scheduler, status, streams, history=history, names=names),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/", page, methods=["GET"]),
        Route("/ui", page, methods=["GET"]),
        Route("/ui/", page, methods=["GET"]),
        Mount(STATIC_PREFIX.rstrip("/"), app=_STATIC),
        Route("/rosterd/events/stream", stream, methods=["GET"]),
    ]
