"""The plain values that cross the backends boundary (DESIGN.md layer 1: value types, no I/O).

What a node's scheduler gets back from its backends: a ready backend's
:class:`Endpoint`, a generation probe's :class:`ProbeResult`, and the
:class:`BackendEvent`\\ s of what happened to a backend by itself, and what is
kept of a role's KV cache across stops (:class:`KeptKv`, for ``/status``). The
supervisor (layer 5) produces them, the node agent carries them over Ray
(they pickle), and the pure node machine (layer 6) reads them; so they sit
below all three and import nothing of rosterd's. The supervisor re-exports
``ProbeResult``, ``BackendEvent`` and ``EventKind``, and
:mod:`rosterd.backends.interface` ``Endpoint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

#: How a role's last restore went: some slots came back, nothing was kept, a record did
#: not match (removed), or the server refused the file.
RestoreOutcome = Literal["restored", "none", "refused", "failed"]


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


@dataclass(frozen=True, slots=True)
class KeptKv:
    """What is kept of one role's KV cache across stops, for ``/status`` and ``/metrics``:
    ``tokens`` over its slots and ``file_bytes`` on disk now; how its last restore went
    (``None``: none yet in this run) and the line logged for it; and the counts and bytes
    of its saves, restores and refusals in this run. Read from the KV keeper's records
    in memory: building one does no disk I/O."""

    tokens: int
    file_bytes: int
    last_restore: RestoreOutcome | None = None
    last_restore_detail: str | None = None
    saves: int = 0
    restores: int = 0
    refusals: int = 0
    saved_bytes: int = 0
    restored_bytes: int = 0
    #: Why this role's KV cache is not kept at all (its architecture cannot reuse a
    #: restored slot, ``rosterd.model_facts.slot_reuse``); ``None``: it is kept.
    not_kept: str | None = None

    def as_json(self) -> dict[str, object]:
        """The value as ``/status`` shows it (a role's ``kv``), field by field;
        ``not_kept`` only where the KV cache is not kept."""
        shown = asdict(self)
        if self.not_kept is None:
            del shown["not_kept"]
        return shown

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> KeptKv:
        """The value of :meth:`as_json`'s object (a node agent's answer over Ray); a field
        missing or of another type reads as zero or ``None`` (the figures are for display)."""
        outcome = data.get("last_restore")
        detail = data.get("last_restore_detail")
        return cls(
            tokens=_count(data.get("tokens")),
            file_bytes=_count(data.get("file_bytes")),
            last_restore=outcome if outcome in ("restored", "none", "refused", "failed") else None,
            last_restore_detail=detail if isinstance(detail, str) else None,
            saves=_count(data.get("saves")),
            restores=_count(data.get("restores")),
            refusals=_count(data.get("refusals")),
            saved_bytes=_count(data.get("saved_bytes")),
            restored_bytes=_count(data.get("restored_bytes")),
            not_kept=not_kept if isinstance(not_kept := data.get("not_kept"), str) else None,
        )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
