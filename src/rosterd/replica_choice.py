"""Which copy of a role a request goes to (layer 3: pure; no clock, no I/O).

A role with replicas has one copy per node (``replicas: N`` in the fleet's ``models:``).
A request goes to the ready copy that already holds its prefix in its KV cache, unless
that copy is loaded beyond a bound, and otherwise to the least loaded ready copy:

- **The prefix** (:func:`prefix_key`) is a hash of the conversation's start: a chat's
  messages up to and including its first user message (the system prompt and the
  question that opens the conversation), or a completion prompt's first
  ``PROMPT_PREFIX_BYTES`` bytes. Every later turn of a conversation starts with the same
  messages, so it hashes the same and lands where its KV cache is.
- **Consistent hashing with bounded loads** (:func:`choose_copy`), as KubeAI's
  ``CHWBL`` load balancer (after Mirrokni, Thorup and Zadimoghaddam, "Consistent
  Hashing with Bounded Loads", SODA 2018): each copy has ``VIRTUAL_POINTS`` points on a
  hash ring; a key walks the ring clockwise from its own hash and takes the first copy
  whose requests in flight, with this one, stay within ``load_factor`` times the mean
  (rounded up). So a hot conversation cannot pin one copy: past the bound its requests
  spill to the next copy on the ring, and removing a copy moves only the keys it held.
- **No key** (a request with no messages and no prompt): the least loaded ready copy,
  ties by node name.
- **Slots first**: while some ready copy has a free slot, a copy whose slots are all busy
  is passed over (a request queued behind a busy slot waits longer than a cache miss
  costs on the tiny and mid-size models a lab serves; the bound alone lets two requests
  share a one-slot copy while the other copy idles).

Copies that are loading, unhealthy or lost are skipped (:attr:`CopyState.READY` only);
the caller also names copies already tried (``exclude``: a failover goes to another).
Hashes are BLAKE2b (``hashlib``): stable across processes, unlike ``hash()``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Final

#: Points per copy on the ring; more even the share of keys between copies (KubeAI uses
#: 100 by default, its ``replication``).
VIRTUAL_POINTS: Final[int] = 100
#: Bound on a copy's load: at most this times the mean load of the ready copies (KubeAI's
#: default ``meanLoadFactor`` is 1.25).
DEFAULT_LOAD_FACTOR: Final[float] = 1.25
#: How much of a completion prompt names its prefix, in bytes.
PROMPT_PREFIX_BYTES: Final[int] = 256


class CopyState(Enum):
    """What a copy can do now: ``ready`` serves; the others are skipped while a copy is
    ready. ``cold``: not in memory (a request there waits for a load)."""

    READY = "ready"
    LOADING = "loading"
    COLD = "cold"
    UNHEALTHY = "unhealthy"
    LOST = "lost"


#: When no copy is ready, where a request waits best: a load under way, then a cold copy
#: (one load), then one being restarted after a failed probe, then a lost node's (it
#: waits for the node's verdict).
_WAIT_ORDER: Final = {
    CopyState.LOADING: 0,
    CopyState.COLD: 1,
    CopyState.UNHEALTHY: 2,
    CopyState.LOST: 3,
}


@dataclass(frozen=True)
class Copy:
    """One copy of a role: its ``node``, its :class:`CopyState`, the requests sent to it
    and not done (``requests``, >= 0: queued there or running; a node's ``copy_requests``
    in ``/status``) and how many it serves at once (``slots``, >= 1; ``None``: no limit
    known)."""

    node: str
    state: CopyState
    requests: int = 0
    slots: int | None = None

    @property
    def full(self) -> bool:
        """Whether a request sent here now would wait for a slot."""
        return self.slots is not None and self.requests >= self.slots


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(body: Mapping[str, object]) -> bytes | None:
    """The prefix key of an OpenAI request body, or ``None`` when it has none.

    Chat (``messages``: a list of ``{role, content}``): the messages up to and including
    the first ``user`` message, as canonical JSON (roles and contents only). Completion
    (``prompt``: text, or a list whose first item is text): its first
    ``PROMPT_PREFIX_BYTES`` bytes of UTF-8. Anything else (no messages, an empty prompt,
    a token-id prompt): ``None``. Never raises.
    """
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        start: list[object] = []
        for message in messages:
            if not isinstance(message, Mapping):
                break
            start.append([message.get("role"), message.get("content")])
            if message.get("role") == "user":
                break
        if start:
            text = json.dumps(start, sort_keys=True, separators=(",", ":"), default=str)
            return hashlib.blake2b(text.encode(), digest_size=16).digest()
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt.encode("utf-8", "replace")[:PROMPT_PREFIX_BYTES]
    return None


@lru_cache(maxsize=256)
def _ring(nodes: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The hash ring of ``nodes``: sorted point hashes and the node of each point."""
    points = sorted(
        (_hash64(f"{node}#{i}".encode()), node) for node in nodes for i in range(VIRTUAL_POINTS)
    )
    return tuple(p for p, _ in points), tuple(n for _, n in points)


def load_bound(copies: Sequence[Copy], load_factor: float = DEFAULT_LOAD_FACTOR) -> int:
    """The most requests in flight a ready copy may have *after* taking this one:
    ``ceil(load_factor * (in flight on the ready copies + 1) / ready copies)``, at least 1;
    0 when no copy is ready."""
    ready = [c for c in copies if c.state is CopyState.READY]
    if not ready:
        return 0
    total = sum(c.requests for c in ready) + 1
    return max(1, math.ceil(load_factor * total / len(ready)))


def choose_copy(
    copies: Sequence[Copy],
    key: bytes | None,
    *,
    load_factor: float = DEFAULT_LOAD_FACTOR,
    exclude: Collection[str] = (),
) -> str | None:
    """The node whose copy takes the request, or ``None`` when no copy is ready.

    ``copies``: every copy of the role (one per node); ``key``: :func:`prefix_key`'s
    answer; ``load_factor`` (> 1; see the module) bounds a prefix's copy's load;
    ``exclude``: nodes already tried by this request, skipped. Deterministic: the same
    inputs give the same node.
    """
    ready = [c for c in copies if c.state is CopyState.READY and c.node not in exclude]
    if not ready:
        return None
    free = [c for c in ready if not c.full]
    candidates = free or ready
    if key is None or len(candidates) == 1:
        return min(candidates, key=lambda c: (c.requests, c.node)).node
    bound = load_bound(ready, load_factor)
    load = {c.node: c.requests for c in candidates}
    hashes, owners = _ring(tuple(sorted(load)))
    start = bisect.bisect(hashes, _hash64(key))
    seen: set[str] = set()
    for step in range(len(hashes)):
        node = owners[(start + step) % len(hashes)]
        if node in seen:
            continue
        if load[node] + 1 <= bound:
            return node
        seen.add(node)
        if len(seen) == len(load):
            break
    # Past every candidate's bound (only when busy copies were passed over): the least loaded.
    return min(candidates, key=lambda c: (c.requests, c.node)).node


def copy_to_wait_on(copies: Sequence[Copy], exclude: Collection[str] = ()) -> str | None:
    """The node to queue on when :func:`choose_copy` finds no ready copy: the first by
    ``_WAIT_ORDER`` (loading, cold, unhealthy, lost), then the least loaded, then by
    name; ``None`` when every copy is in ``exclude``."""
    left = [c for c in copies if c.node not in exclude and c.state in _WAIT_ORDER]
    if not left:
        return None
    return min(left, key=lambda c: (_WAIT_ORDER[c.state], c.requests, c.node)).node
