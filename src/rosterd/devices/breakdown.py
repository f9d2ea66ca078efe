"""The parser of llama-server's own memory breakdown (layer 2: pure; log text in, figures out).

llama-server prints, when it stops (``common_memory_breakdown_print``, ``common/fit.cpp``),
what it allocated on each device and on the host, in MiB::

    | memory breakdown [MiB] | total   free    self   model   context   compute  unaccounted |
    |   - CUDA0 (RTX 4090)   | 24080 = 1234 + (21000 = 18000 +  2500 +  500) +  1846 |
    |   - Host               |                  300 =   250 +     0 +   50              |

A device row has ``total = free + (self = model + context + compute) + unaccounted``
(unaccounted: what other processes and the runtime hold); the host row has ``self =
model + context + compute`` alone. Lines may carry a log prefix (a timestamp, the
function name); anything that is not a row is skipped. This is the backend's own report
of its memory per pool, which the per-pool estimate is checked against (issue 29, item 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MiB: Final[int] = 1 << 20

_ROW: Final = re.compile(
    r"\|\s+-\s+(?P<name>[^\s|(]+)(?:\s+\((?P<desc>[^|]*)\))?\s*\|\s*"
    r"(?:(?P<total>\d+)\s*=\s*(?P<free>\d+)\s*\+\s*\()?"
    r"(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*\)?"
    r"(?:\s*\+\s*(?P<unaccounted>-?\d+))?\s*\|"
)


@dataclass(frozen=True, slots=True)
class BreakdownRow:
    """One row of llama-server's memory breakdown, in bytes (MiB as printed, floored).

    ``name``: a device id (``CUDA0``, ``MTL0``) or ``Host``; ``total``/``free``/
    ``unaccounted``: ``None`` on the host row.
    """

    name: str
    self_bytes: int
    model_bytes: int
    context_bytes: int
    compute_bytes: int
    total_bytes: int | None = None
    free_bytes: int | None = None
    unaccounted_bytes: int | None = None


def parse_memory_breakdown(text: str) -> dict[str, BreakdownRow]:
    """Every row of the last memory breakdown in ``text``, by name (``Host`` for the host);
    empty when ``text`` has none. Never raises."""
    rows: dict[str, BreakdownRow] = {}
    for line in text.splitlines():
        if "memory breakdown [MiB]" in line:
            rows = {}  # a later breakdown (the server stopped again) replaces an earlier one
            continue
        match = _ROW.search(line)
        if match is None:
            continue

        def mib(group: str, found: re.Match[str] = match) -> int | None:
            value = found[group]
            return None if value is None else int(value) * MiB

        rows[match["name"]] = BreakdownRow(
            name=match["name"],
            self_bytes=int(match["self"]) * MiB,
            model_bytes=int(match["model"]) * MiB,
            context_bytes=int(match["context"]) * MiB,
            compute_bytes=int(match["compute"]) * MiB,
            total_bytes=mib("total"),
            free_bytes=mib("free"),
            unaccounted_bytes=mib("unaccounted"),
        )
    return rows
