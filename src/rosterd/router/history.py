"""The page's charts' memory (DESIGN.md layer 7): a bounded in-memory history of how the
lab ran, one point every ``--history-interval`` seconds, served as ``GET /rosterd/history``.

Every series is a ring buffer (``collections.deque`` with ``maxlen``) of
:data:`HISTORY_POINTS` points, so what rosterd keeps does not grow with its uptime
(360 points at the default 10 s: the last hour). A point holds, at its time ``t``
(seconds since the epoch):

- per node: its capacity and, per role, the bytes the role counts while it holds
  memory (loading, ready, restarting or stopping; the same figure as the page's
  memory bar), ``None`` while it holds none;
- per role: requests finished per second and generated tokens per second over the
  interval, and the p50 and p95 (nearest rank) of the queue waits of the requests
  granted in it, seconds (``None`` when none was);
- marks: the loads (``loaded``) and stops (``stopped``, with the cause) the nodes
  recorded, kept while their time is inside the window (at most :data:`MAX_MARKS`).

Generated tokens are what the backend reports it generated (``usage.completion_tokens``,
llama-server's ``timings.predicted_n`` or Ollama's ``eval_count``), read from the end of
the answer; an answer
that reports neither counts none. A series whose role is gone (retired by a reload) is
dropped once the window holds no value of it, so roles coming and going do not grow it
either.

:class:`History` is plain state with no clock and no I/O: the proxy adds what it sees
(:meth:`History.request_done`, :meth:`History.request_granted`), node listeners add marks
(:meth:`History.hear`) and :func:`sample_forever` closes a point each interval.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from rosterd.router.status_view import StatusInputs, nodes_json
from rosterd.scheduler.directory import NodeDirectory
from rosterd.scheduler.values import SchedulerEvent

#: Points each series keeps: one hour at the default interval.
HISTORY_POINTS: Final[int] = 360
#: Seconds between two points unless ``--history-interval`` says otherwise.
HISTORY_INTERVAL_S: Final[float] = 10.0
#: Queue waits kept per role within one interval (the quantiles are over these).
WAITS_PER_INTERVAL: Final[int] = 4096
#: Points kept for the event streams to send on (a stream looks every second or so).
RECENT_POINTS: Final[int] = 32
#: Load and stop marks kept at most, whatever the window.
MAX_MARKS: Final[int] = 2000
#: The phases in which a role's memory counts against its node (the page's bar too).
HOLDING_PHASES: Final[frozenset[str]] = frozenset({"loading", "ready", "restarting", "stopping"})
#: The scheduler events that become marks on the charts' time axis.
MARK_KINDS: Final[frozenset[str]] = frozenset({"loaded", "stopped"})
#: Role series, in the JSON's order.
ROLE_SERIES: Final[tuple[str, ...]] = (
    "requests_per_s",
    "tokens_per_s",
    "queue_wait_p50_s",
    "queue_wait_p95_s",
)

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_OUTPUT_TOKENS = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
_PREDICTED_N = re.compile(rb'"predicted_n"\s*:\s*(\d+)')
_EVAL_COUNT = re.compile(rb'"eval_count"\s*:\s*(\d+)')

Value = float | int | None


def generated_tokens(tail: bytes) -> int:
    """The tokens an answer says it generated, from its last bytes (the end of a JSON
    answer, or an event stream's last events): the last ``usage.completion_tokens``, else
    ``usage.output_tokens`` (Anthropic's Messages and OpenAI's Responses, served by the
    backend itself), else llama-server's ``timings.predicted_n``, else Ollama's
    ``eval_count`` (its own API, passed through), else 0 (the backend did not say)."""
    for pattern in (_COMPLETION_TOKENS, _OUTPUT_TOKENS, _PREDICTED_N, _EVAL_COUNT):
        found = pattern.findall(tail)
        if found:
            return int(found[-1])
    return 0


def nearest_rank(sorted_values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (0 < fraction <= 1) of a non-empty ascending list, by
    nearest rank: the smallest value with at least that share of the list at or below it."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class _Series:
    """Named ring buffers that share one time axis of ``points`` points."""

    def __init__(self, points: int) -> None:
        self.points = points
        self.by_name: dict[str, deque[Value]] = {}

    def append(self, values: Mapping[str, Value], length_before: int) -> None:
        """One point: ``values`` by name, ``None`` for every known name it lacks. A new
        name gets ``None`` for the ``length_before`` points already kept."""
        for name in values.keys() - self.by_name.keys():
            self.by_name[name] = deque([None] * length_before, maxlen=self.points)
        for name, ring in self.by_name.items():
            ring.append(values.get(name))

    def empty(self) -> set[str]:
        """The names with no value in the whole window."""
        return {n for n, ring in self.by_name.items() if all(v is None for v in ring)}

    def drop(self, names: set[str]) -> None:
        for name in names:
            self.by_name.pop(name, None)

    def lists(self) -> dict[str, list[Value]]:
        return {name: list(ring) for name, ring in sorted(self.by_name.items())}

    def last(self) -> dict[str, Value]:
        return {name: ring[-1] for name, ring in sorted(self.by_name.items()) if ring}

    def lengths(self) -> Iterator[int]:
        return (len(ring) for ring in self.by_name.values())


class History:
    """The bounded history of one router (see the module docstring).

    ``interval_s``: seconds between points (> 0); ``points``: points kept per series.
    """

    def __init__(self, interval_s: float = HISTORY_INTERVAL_S, points: int = HISTORY_POINTS):
        if not interval_s > 0 or points < 1:
            raise ValueError(
                f"history needs interval_s > 0 and points >= 1, not {interval_s}, {points}"
            )
        self.interval_s = interval_s
        self.points = points
        self.times: deque[float] = deque(maxlen=points)
        self.capacity: dict[str, deque[Value]] = {}
        self.memory: dict[str, _Series] = {}  # node -> role -> counted bytes
        self.roles: dict[str, _Series] = {name: _Series(points) for name in ROLE_SERIES}
        self.marks: deque[dict[str, object]] = deque(maxlen=MAX_MARKS)
        self.samples = 0  # points closed so far
        #: The last points as :meth:`sample` gave them, ``(number, point)``: what an open
        #: event stream sends on (a page skips the ones it has, by ``t``).
        self.recent: deque[tuple[int, dict[str, object]]] = deque(maxlen=RECENT_POINTS)
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._waits: dict[str, deque[float]] = {}
        self._new_marks: list[dict[str, object]] = []
        self._last_at: float | None = None

    # ---- what the proxy and the nodes report --------------------------------------

    def request_granted(self, role: str, waited_s: float) -> None:
        """A request for ``role`` got its lease after waiting ``waited_s`` seconds."""
        waits = self._waits.get(role)
        if waits is None:
            waits = self._waits[role] = deque(maxlen=WAITS_PER_INTERVAL)
        waits.append(waited_s)

    def request_done(self, role: str, tokens: int) -> None:
        """A request for ``role`` finished, its backend having generated ``tokens``."""
        self._requests[role] = self._requests.get(role, 0) + 1
        if tokens:
            self._tokens[role] = self._tokens.get(role, 0) + tokens

    def hear(self, event: SchedulerEvent) -> None:
        """A node listener: a load or a stop becomes a mark (other kinds are not drawn)."""
        if event.kind in MARK_KINDS:
            mark: dict[str, object] = {
                "at": event.at,
                "node": event.node,
                "role": event.role,
                "kind": event.kind,
                "cause": event.cause,
                "duration_s": event.duration_s,
            }
            self.marks.append(mark)
            if len(self._new_marks) < MAX_MARKS:
                self._new_marks.append(mark)

    # ---- closing a point ------------------------------------------------------------

    def sample(self, now: float, nodes: Mapping[str, object]) -> dict[str, object]:
        """Close the point at ``now`` (seconds since the epoch) from ``nodes`` (the
        scheduler's snapshot: name -> ``capacity_bytes``, ``roles`` -> ``phase``,
        ``resident_bytes``: the bytes the node's budget counts for the role) and what was
        reported since the last point; returns the point (the stream's ``sample``: one
        column of :meth:`as_json`, with the marks recorded since the last point)."""
        elapsed = self.interval_s if self._last_at is None else max(1e-9, now - self._last_at)
        self._last_at = now
        length = len(self.times)
        self.times.append(now)
        for name in nodes:
            self.memory.setdefault(name, _Series(self.points))
            if name not in self.capacity:
                self.capacity[name] = deque([None] * length, maxlen=self.points)
        for name in list(self.memory):
            node = _mapping(nodes.get(name))
            capacity = node.get("capacity_bytes")
            self.capacity[name].append(capacity if isinstance(capacity, int) else None)
            self.memory[name].append(_held_bytes(node.get("roles")), length)
            self.memory[name].drop(self.memory[name].empty())  # gone for the whole window
            if not self.memory[name].by_name and all(v is None for v in self.capacity[name]):
                del self.memory[name], self.capacity[name]
        served = {
            str(role) for node in nodes.values() for role in _mapping(_mapping(node).get("roles"))
        }
        per_role: dict[str, dict[str, Value]] = {name: {} for name in ROLE_SERIES}
        for role in served | self._requests.keys() | self._waits.keys():
            per_role["requests_per_s"][role] = round(self._requests.get(role, 0) / elapsed, 4)
            per_role["tokens_per_s"][role] = round(self._tokens.get(role, 0) / elapsed, 3)
            waits = sorted(self._waits.get(role, ()))
            per_role["queue_wait_p50_s"][role] = (
                round(nearest_rank(waits, 0.5), 4) if waits else None
            )
            per_role["queue_wait_p95_s"][role] = (
                round(nearest_rank(waits, 0.95), 4) if waits else None
            )
        for name, series in self.roles.items():
            series.append(per_role[name], length)
        # A role is dropped (from every series at once) once none of them has a value.
        gone = set.intersection(*(series.empty() for series in self.roles.values()))
        for series in self.roles.values():
            series.drop(gone)
        self._requests.clear()
        self._tokens.clear()
        self._waits.clear()
        window_start = self.times[0]
        while self.marks and _mark_at(self.marks[0]) < window_start - self.interval_s:
            self.marks.popleft()
        self.samples += 1
        marks, self._new_marks = self._new_marks, []
        point: dict[str, object] = {
            "t": now,
            "nodes": {
                name: {"capacity_bytes": self.capacity[name][-1], "roles": self.memory[name].last()}
                for name in self.memory
            },
            "roles": _by_role({name: s.last() for name, s in self.roles.items()}),
            "marks": marks,
        }
        self.recent.append((self.samples, point))
        return point

    def as_json(self) -> dict[str, object]:
        """``GET /rosterd/history``: ``{"interval_s", "points", "t": [epoch s],
        "nodes": {node: {"capacity_bytes": [...], "roles": {role: [bytes|null]}}},
        "roles": {role: {"requests_per_s", "tokens_per_s", "queue_wait_p50_s",
        "queue_wait_p95_s": [...]}}, "marks": [{"at", "node", "role", "kind", "cause",
        "duration_s"}]}``; every list of values is aligned with ``t``."""
        return {
            "interval_s": self.interval_s,
            "points": self.points,
            "t": list(self.times),
            "nodes": {
                name: {"capacity_bytes": list(self.capacity[name]), "roles": series.lists()}
                for name, series in sorted(self.memory.items())
            },
            "roles": _by_role({name: s.lists() for name, s in self.roles.items()}),
            "marks": list(self.marks),
        }

    def lengths(self) -> list[int]:
        """The length of every ring buffer kept (each at most ``points``; for tests)."""
        out = [len(self.times), *(len(r) for r in self.capacity.values())]
        for series in (*self.memory.values(), *self.roles.values()):
            out.extend(series.lengths())
        return out


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _mark_at(mark: Mapping[str, object]) -> float:
    at = mark.get("at")
    return float(at) if isinstance(at, int | float) else 0.0


def _held_bytes(roles: object) -> dict[str, Value]:
    held: dict[str, Value] = {}
    for role, info in _mapping(roles).items():
        info = _mapping(info)
        if info.get("phase") not in HOLDING_PHASES:
            continue
        counted = info.get("resident_bytes")
        if isinstance(counted, int):
            held[str(role)] = counted
    return held


def _by_role(series: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """Series name -> role -> X, turned into role -> series name -> X."""
    out: dict[str, dict[str, object]] = {}
    for name, roles in series.items():
        for role, value in roles.items():
            out.setdefault(role, {})[name] = value
    return dict(sorted(out.items()))


async def sample_forever(
    history: History,
    scheduler: NodeDirectory,
    clock: Callable[[], float],
    on_sample: Callable[[dict[str, object]], None] | None = None,
) -> None:
    """Close a point of ``history`` every ``history.interval_s`` seconds from
    ``scheduler``'s snapshot, with ``clock()`` (seconds since the epoch) as its time;
    listen to every node's events for the marks (nodes added by a reload are joined at
    the next point). Runs until cancelled; ``on_sample(point)`` hears each point."""
    joined: dict[str, list[Callable[[SchedulerEvent], None]]] = {}

    def join_nodes() -> None:
        for name, node in scheduler.nodes.items():
            if name not in joined:
                node.listeners.append(history.hear)
                joined[name] = node.listeners

    loop = asyncio.get_running_loop()
    next_at = loop.time() + history.interval_s
    try:
        join_nodes()  # at once: the warm-up's loads are marks too
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            # A fixed cadence; after a stall (a suspended laptop) start again from now.
            next_at = max(next_at + history.interval_s, loop.time())
            join_nodes()
            nodes = nodes_json(scheduler.snapshot(), StatusInputs(measured={}))
            point = history.sample(clock(), nodes)
            if on_sample is not None:
                on_sample(point)
    finally:
        for listeners in joined.values():
            if history.hear in listeners:
                listeners.remove(history.hear)
