"""What a request waited for (DESIGN.md layer 7): the response headers that tell a client
(the page's playground among them) whether its request had to load or swap its role,
and how long that took; and which roles a load stopped.

Headers on every proxied answer (names in :data:`WAIT_HEADERS`; with ``--cors-origin``
they are exposed to other origins' pages too):

- ``X-Rosterd-Role`` / ``X-Rosterd-Node``: the role that served it and its node;
- ``X-Rosterd-Copy``: present when a further copy of the role on another device of its
  node served it: that copy's key, ``box/chat~2`` (the node and the copy, as
  ``rosterd_copy_requests_total`` labels it), so the copies on one node can be told apart;
- ``X-Rosterd-Queue-Wait-S``: seconds the request waited for its lease (a load, a free
  slot), as the scheduler measured it;
- ``X-Rosterd-Load-S``: present when the role became ready while the request waited:
  how long that load took, seconds (the ``loaded`` event's duration);
- ``X-Rosterd-Evicted``: present when that load stopped other roles on the node (a
  swap): ``role=cause`` pairs, comma-separated, ``cause`` ``make_room`` or ``exclusion``.

The load and stops are read from the node's event log, the events recorded since the
request asked (so a load another request started and this one waited for counts: the
request did wait for it). A request granted at once reads nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from rosterd.residency import excludes_each_other
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.values import SchedulerEvent
from rosterd.spec import InferenceSpec

#: The headers a proxied answer carries about its wait (see the module docstring).
WAIT_HEADERS: Final[tuple[str, ...]] = (
    "X-Rosterd-Role",
    "X-Rosterd-Node",
    "X-Rosterd-Copy",
    "X-Rosterd-Queue-Wait-S",
    "X-Rosterd-Load-S",
    "X-Rosterd-Evicted",
)


def evicted_for(
    role: str,
    node: str,
    specs: Mapping[str, InferenceSpec],
    before: Sequence[SchedulerEvent],
    after: Sequence[SchedulerEvent],
) -> list[tuple[str, str]]:
    """The roles stopped on ``node`` to serve the load of ``role``, with why: among the
    events of ``after`` not in ``before`` (two reads of ``NodeDirectory.events()``, around a
    load), in the order they stopped, ``(stopped role, cause)``; ``cause`` is
    ``exclusion`` when the two exclude each other (``specs``: the node's roles), else
    ``make_room`` (its memory). Both kinds of stop are found: one evicted for ``role``
    (``evicted for ROLE: …``) and an idle exclusion winner that yielded to it
    (``…, yields to waiting ROLE (they exclude each other)``)."""
    seen = {id(event) for event in before}  # ``before`` keeps them alive: ids stay unique
    return _stopped_for(role, node, specs, (e for e in after if id(e) not in seen))


def _stopped_for(
    role: str, node: str, specs: Mapping[str, InferenceSpec], events: Iterable[SchedulerEvent]
) -> list[tuple[str, str]]:
    prefix = f"evicted for {role}:"
    yielded = f"yields to waiting {role} (they exclude each other)"
    wanted = specs.get(role)
    found: list[tuple[str, str]] = []
    for event in events:
        if (
            event.node != node
            or event.kind != "stopped"
            or not (event.cause.startswith(prefix) or yielded in event.cause)
        ):
            continue
        other = specs.get(event.role)
        exclusion = yielded in event.cause or (
            wanted is not None and other is not None and excludes_each_other(wanted, other)
        )
        found.append((event.role, "exclusion" if exclusion else "make_room"))
    return found


def wait_headers(
    lease: Lease,
    asked_at: float,
    node_events: Sequence[SchedulerEvent],
    specs: Mapping[str, InferenceSpec],
) -> list[tuple[bytes, bytes]]:
    """The ASGI headers of the module docstring for a request granted ``lease`` that
    asked at ``asked_at`` (seconds since the epoch); ``node_events``: its node's event log,
    oldest first; ``specs``: the node's roles. A lease granted without waiting reads no
    events."""
    headers = [
        (b"x-rosterd-role", lease.role.encode()),
        (b"x-rosterd-node", lease.node.encode()),
        (b"x-rosterd-queue-wait-s", f"{lease.waited_s:.3f}".encode()),
    ]
    if lease.copy_key != lease.node:
        headers.append((b"x-rosterd-copy", lease.copy_key.encode()))
    if lease.waited_s <= 0:
        return headers
    recent: list[SchedulerEvent] = []
    for event in reversed(node_events):
        if event.at < asked_at:
            break
        recent.append(event)
    recent.reverse()
    loads = [e for e in recent if e.kind == "loaded" and e.role == lease.role]
    if not loads:
        return headers
    load_s = loads[-1].duration_s
    headers.append((b"x-rosterd-load-s", f"{load_s or 0.0:.3f}".encode()))
    stopped = _stopped_for(lease.role, lease.node, specs, recent)
    if stopped:
        pairs = ",".join(f"{name}={cause}" for name, cause in stopped)
        headers.append((b"x-rosterd-evicted", pairs.encode()))
    return headers
