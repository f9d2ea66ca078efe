"""Which memory figure counts for a role, and how the figures are shown (layer 3, pure).

DESIGN.md's rule: placement and residency count the largest of the roster's
``ram_gb``, the estimate from the weights' metadata (``rosterd.memory.estimate``)
and the peak RSS measured on the role's last run on that node
(``rosterd.memory.peaks``). A ``"~N"`` roster value is the operator's guess:
it is marked as unmeasured wherever it is shown. When the figure that counts is
more than 20 % away from ``ram_gb``, ``up`` and ``plan`` say so once per role
with both numbers (``memory_warning``). No I/O, no clock, no logging.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from rosterd.memory.estimate import MemoryEstimate
from rosterd.spec import MemorySpec
from rosterd.tokens import GB

#: How far (as a share of ``ram_gb``) the counted figure may be from it before a warning.
WARN_SHARE: Final[float] = 0.20


class FigureSource(enum.Enum):
    """Where a memory figure came from; ties go to the first in this order."""

    MEASURED = "measured"
    ESTIMATE = "estimate"
    ROSTER = "roster"


@dataclass(frozen=True, slots=True)
class CountedMemory:
    """The figure a role counts, and every figure it was chosen from (bytes, or ``None``).

    ``counted_bytes`` is the largest of ``declared_bytes`` (roster ``ram_gb``),
    ``estimated_bytes`` and ``measured_bytes``; ``source`` says which;
    ``declared_unmeasured`` marks a ``"~N"`` roster value.
    """

    counted_bytes: int
    source: FigureSource
    declared_bytes: int | None
    estimated_bytes: int | None
    measured_bytes: int | None
    declared_unmeasured: bool = False

    @property
    def differs_from_declared(self) -> bool:
        """Whether the counted figure is more than ``WARN_SHARE`` away from ``ram_gb``.

        False when there is no roster figure (nothing to compare with).
        """
        if self.declared_bytes is None:
            return False
        return abs(self.counted_bytes - self.declared_bytes) > WARN_SHARE * self.declared_bytes


def count_memory(
    declared_bytes: int | None,
    estimated_bytes: int | None,
    measured_bytes: int | None,
    *,
    declared_unmeasured: bool = False,
) -> CountedMemory:
    """The largest of the given figures (bytes; ``None`` for a figure not known), with its source.

    Ties go to the measured figure, then the estimate, then the roster (the more
    direct evidence names the number). With no figure at all the count is 0
    from the roster.
    """
    candidates = [
        (measured_bytes, FigureSource.MEASURED),
        (estimated_bytes, FigureSource.ESTIMATE),
        (declared_bytes, FigureSource.ROSTER),
    ]
    best, source = 0, FigureSource.ROSTER
    found = False
    for value, where in candidates:
        if value is not None and (not found or value > best):
            best, source, found = value, where, True
    return CountedMemory(
        counted_bytes=best,
        source=source,
        declared_bytes=declared_bytes,
        estimated_bytes=estimated_bytes,
        measured_bytes=measured_bytes,
        declared_unmeasured=declared_unmeasured,
    )


def counted_memory_spec(counted: CountedMemory, estimate: MemoryEstimate | None) -> MemorySpec:
    """A ``MemorySpec`` whose ``resident_bytes`` is ``counted.counted_bytes``.

    With an estimate, its KV and overhead parts are kept and the weights part
    takes the rest (the counted figure is never below the estimate's total);
    without one, it is all weights.
    """
    if estimate is None:
        return MemorySpec(weights_bytes=counted.counted_bytes)
    weights = counted.counted_bytes - estimate.kv_bytes - estimate.overhead_bytes
    return MemorySpec(
        weights_bytes=max(weights, 0),
        kv_bytes=estimate.kv_bytes,
        overhead_bytes=estimate.overhead_bytes,
    )


def show_gb(n_bytes: int) -> str:
    """Bytes as GiB (2^30, the unit of the roster's ``ram_gb``) with two decimals: ``1.25 GiB``."""
    return f"{n_bytes / GB:.2f} GiB"


#: The memory note (``plan``'s ``memory_notes``) of a role that counts the roster's
#: ``"~N"`` figure: placement shows that figure as ``~N GiB (unmeasured; … bytes)``.
UNMEASURED_NOTE: Final[str] = "unmeasured"


def show_declared(declared_bytes: int, unmeasured: bool) -> str:
    """The roster figure as shown everywhere: ``~10.00 GiB (unmeasured)`` for a ``"~N"`` value."""
    if unmeasured:
        return f"~{show_gb(declared_bytes)} (unmeasured)"
    return show_gb(declared_bytes)


def memory_warning(role: str, counted: CountedMemory) -> str | None:
    """The once-per-role warning when the counted figure is > 20 % away from ``ram_gb``, else None.

    Names both numbers and where the counted one came from, e.g. ``role chat:
    counts 12.40 GiB (estimate) where the roster's ram_gb says ~8.00 GiB
    (unmeasured), 55 % more; placement and residency use 12.40 GiB``.
    """
    if not counted.differs_from_declared or counted.declared_bytes is None:
        return None
    declared = counted.declared_bytes
    share = (counted.counted_bytes - declared) / declared if declared else float("inf")
    how = "more" if share >= 0 else "less"
    shown_share = "∞" if share == float("inf") else f"{abs(share) * 100:.0f} %"
    return (
        f"role {role}: counts {show_gb(counted.counted_bytes)} ({counted.source.value}) "
        f"where the roster's ram_gb says {show_declared(declared, counted.declared_unmeasured)}, "
        f"{shown_share} {how}; placement and residency use {show_gb(counted.counted_bytes)}"
    )
