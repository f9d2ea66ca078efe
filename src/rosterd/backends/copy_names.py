"""The names of the copies of a role on this machine's supervisor (DESIGN.md layer 1: values,
no I/O).

One ``rosterd up`` may run several fleet nodes of this machine over one supervisor, and a
supervisor runs one process per name. A role with one copy keeps its id as its backend's
name, so its log (``logs/<role>.log``), run record, load times and kept KV
(``kv/<role>/``) are those of earlier runs. A role whose fleet ``models:`` entry asks
for ``replicas`` names its copy on each node ``<role>@<node>``: two copies on two nodes
of this machine are two processes, each with its own files. ``@`` is in no plain token,
so a copy's name is never a role's nor another copy's.

:class:`LocalCopies` remembers, per node and role, the name and port a backend was started
with, so that a stop reaches the process it started even after a reload changed the name
a new start would take, and so that a second copy on the same address does not take
the roster's port the first one listens on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from rosterd.tokens import valid_token

#: Between a role's id and its node's name in a copy's backend name.
COPY_SEPARATOR: Final[str] = "@"

#: Between a role's id and the number of a further copy of it on a node that already holds
#: one, on another of the node's devices (``chat~2``): ``~`` is in no plain token, and unlike
#: ``/`` it makes no folder of a log's or KV cache's path.
UNIT_SEPARATOR: Final[str] = "~"


def copy_unit_name(role: str, nth: int) -> str:
    """The internal name of the ``nth`` copy (2, 3, ...) of ``role`` on a node that holds
    several, each on a device of its own: ``"<role>~<nth>"`` (``chat~2``); the first keeps
    the role's id. A client never sees or asks for it: the node serves it as a residency
    unit of its own, and the router sends the role's requests to it as to any copy."""
    return f"{role}{UNIT_SEPARATOR}{nth}"


def unit_names(roles: Iterable[str]) -> list[str]:
    """Each of ``roles`` (a node's copies, in order; a role named once per copy) as the node
    names its unit: a role's first copy by the role, its ``n``-th by
    :func:`copy_unit_name` (``["chat", "code", "chat"]`` -> ``chat``, ``code``, ``chat~2``)."""
    seen: dict[str, int] = {}
    names: list[str] = []
    for role in roles:
        seen[role] = seen.get(role, 0) + 1
        names.append(role if seen[role] == 1 else copy_unit_name(role, seen[role]))
    return names


def role_of_copy(name: str) -> str:
    """The role a node's unit serves: ``chat`` for ``chat~2`` and for ``chat``."""
    return name.partition(UNIT_SEPARATOR)[0]


def is_copy_of(name: str, role: str) -> bool:
    """Whether the node's unit ``name`` is a copy of ``role`` (``role`` itself, or
    ``role~N``)."""
    return role_of_copy(name) == role


def copy_backend_name(role: str, node: str) -> str:
    """The backend name of ``role``'s copy on ``node``: ``"<role>@<node>"`` (``chat@b``)."""
    return f"{role}{COPY_SEPARATOR}{node}"


def role_of_backend(name: str) -> tuple[str, str | None]:
    """``(role, node)`` of a backend name: ``("chat", "b")`` for ``chat@b``; a name without
    ``@`` (a role with one copy, a shared server) is ``(name, None)``."""
    role, separator, node = name.partition(COPY_SEPARATOR)
    return (role, node) if separator else (name, None)


def valid_backend_name(name: str) -> bool:
    """Whether ``name`` may name a supervised backend (its log and record files): a plain
    token of at most 64 bytes (``rosterd.tokens.valid_token``), or two joined by ``@``
    (a copy's: a role id and a node name, each a plain token of at most 64 bytes); the
    role part may carry a further copy's number, ``~`` and digits (``chat~2@box``)."""
    unit, node = role_of_backend(name)
    role, separator, nth = unit.partition(UNIT_SEPARATOR)
    return (
        valid_token(role, 64)
        and (not separator or (nth.isascii() and nth.isdigit() and len(nth) <= 4))
        and (node is None or valid_token(node, 64))
    )


@dataclass(frozen=True, slots=True)
class HeldBackend:
    """What a node's backend of a role was started with: its supervisor ``name``, the
    ``host`` it listens on and its ``port``."""

    name: str
    host: str
    port: int


class LocalCopies:
    """The backends one supervisor was asked to start, by (node, role), until stopped (see
    the module). Used from one event loop; nothing here waits."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], HeldBackend] = {}

    def held(self, node: str, role: str) -> HeldBackend | None:
        """What ``node``'s backend of ``role`` was started with, or ``None``."""
        return self._held.get((node, role))

    def hold(self, node: str, role: str, backend: HeldBackend) -> None:
        """``node`` starts ``role``'s backend as ``backend`` (before its start awaits
        anything, so that a copy starting at once sees the port taken)."""
        self._held[(node, role)] = backend

    def release(self, node: str, role: str) -> None:
        """``node``'s backend of ``role`` stopped, or its start failed."""
        self._held.pop((node, role), None)

    def port_held_by_other_copy(self, node: str, role: str, host: str, port: int) -> bool:
        """Whether another copy of the role of ``role`` (a role, or a further copy of it,
        ``chat~2``) was started on ``host`` and ``port``: a copy on another node, or another
        copy on ``node``'s other device (two copies cannot both listen there; each copy
        takes the roster's port from its role's entry)."""
        return any(
            (held.host, held.port) == (host, port)
            for (other, held_role), held in self._held.items()
            if role_of_copy(held_role) == role_of_copy(role) and (other, held_role) != (node, role)
        )
