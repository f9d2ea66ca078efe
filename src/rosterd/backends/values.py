"""The plain values that cross the backends boundary (DESIGN.md layer 1: value types, no I/O).

What a node's scheduler gets back from its backends: a ready backend's
:class:`Endpoint`, a generation probe's :class:`ProbeResult`, and the
:class:`BackendEvent`\\ s of what happened to a backend by itself. The
supervisor (layer 5) produces them, the node agent carries them over Ray
(they pickle), and the pure node machine (layer 6) reads them; so they sit
below all three and import nothing of rosterd's. The supervisor re-exports
``ProbeResult``, ``BackendEvent`` and ``EventKind``, and
:mod:`rosterd.backends.interface` ``Endpoint``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A ready backend: ``base_url`` (``http://host:port``, no trailing slash), the model
    name it answers to (``served_model``), its process id (``None`` if not a local process)
    and ``restored_tokens``: the tokens its start restored into its slots from a kept KV
    cache (0: none; the router checks that the first answer reused them).
    """

    base_url: str
    served_model: str
    pid: int | None = None
    restored_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one ``HttpProbe``: ``ok``, the HTTP ``status`` (``None`` if no answer)."""

    ok: bool
    status: int | None
    detail: str = ""


EventKind = Literal["ready", "exited", "restarting", "restart_failed", "stopped"]


@dataclass(frozen=True, slots=True)
class BackendEvent:
    """Something that happened to a backend, given to the ``on_event`` callback.

    ``kind``: ``ready`` (started or restarted and ready), ``exited`` (died by
    itself; ``exit_code`` set), ``restarting`` (``delay_s`` until the next
    try), ``restart_failed`` (``detail`` says why; ``final`` when the
    supervisor gave up and no process is left), ``stopped`` (by ``stop``).
    """

    name: str
    kind: EventKind
    pid: int | None = None
    exit_code: int | None = None
    delay_s: float | None = None
    detail: str = ""
    final: bool = False
