"""Measured peaks: each role's peak RSS on its last run per node, in the state folder (layer 5).

The next ``rosterd up`` starts from what was measured: ``rosterd.memory.count``
counts the largest of ``ram_gb``, the estimate and this figure. One JSON file
per node, ``<state_dir>/memory/<node>.json``::

    {"version": 1, "roles": {"chat": {"peak_rss_bytes": 412090368,
      "fingerprint": "...", "measured_at_s": 1733040000.0}}}

``fingerprint`` is whatever the caller says identifies the run's settings
(weights path, ``ctx_size``, ``parallel``, ``extra_args``): a peak measured under
other settings is not returned for new ones. Writes are atomic (a temporary file
in the same folder, fsync, ``os.replace``), so a crash leaves the old file or
the new one, never half of one.

A file that cannot be read or parsed is **ignored with a warning** (collected in
``warnings`` for the CLI to print), not an error: a measured peak is evidence
that only ever raises the counted figure, and the roster's figure and the
estimate still stand without it, so refusing to start over a damaged cache file
would cost the operator more than it protects. The next ``record`` for that node
replaces the damaged file.

What is stored is what ``rosterd.supervisor.process_tree_peak_rss_bytes``
measures: the high-water mark of resident memory (Linux ``VmHWM`` in
``/proc/<pid>/status``) of a process and its children, summed, which is what
the kernel saw at the worst moment of each; elsewhere the current RSS.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rosterd.errors import MeasuredPeaksError
from rosterd.tokens import valid_token

FORMAT_VERSION: Final[int] = 1


@dataclass(frozen=True, slots=True)
class MeasuredPeak:
    """One role's measured peak on one node: ``peak_rss_bytes``, the run's ``fingerprint``
    and when it was measured (``measured_at_s``, seconds since the epoch)."""

    peak_rss_bytes: int
    fingerprint: str
    measured_at_s: float


class MeasuredPeaks:
    """The measured peaks under ``state_dir`` (see the module docstring).

    Reads are cached per node for the life of the instance; ``record`` writes
    through. ``warnings`` lists every file that was ignored, and why.
    """

    def __init__(self, state_dir: Path) -> None:
        self.folder = Path(state_dir) / "memory"
        self._nodes: dict[str, dict[str, MeasuredPeak]] = {}
        self._warnings: list[str] = []

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per ignored file: its path and what was wrong."""
        return tuple(self._warnings)

    def path_for(self, node: str) -> Path:
        """``<state_dir>/memory/<node>.json``.

        Raises:
            MeasuredPeaksError: ``node`` is not a plain token (it names a file).
        """
        if not valid_token(node, 64):
            raise MeasuredPeaksError(f"node {node!r} is not a plain token; it cannot name a file")
        return self.folder / f"{node}.json"

    def for_node(self, node: str) -> Mapping[str, MeasuredPeak]:
        """Every role's measured peak on ``node`` (empty when none was recorded)."""
        cached = self._nodes.get(node)
        if cached is None:
            cached = self._read(self.path_for(node))
            self._nodes[node] = cached
        return dict(cached)

    def peak_bytes(self, node: str, role: str, *, fingerprint: str | None = None) -> int | None:
        """The peak RSS (bytes) of ``role``'s last run on ``node``, or ``None``.

        With ``fingerprint``, only a peak recorded under the same fingerprint counts.
        """
        found = self.for_node(node).get(role)
        if found is None or (fingerprint is not None and found.fingerprint != fingerprint):
            return None
        return found.peak_rss_bytes

    def record(
        self,
        node: str,
        role: str,
        peak_rss_bytes: int,
        *,
        measured_at_s: float,
        fingerprint: str = "",
    ) -> None:
        """Store ``peak_rss_bytes`` as ``role``'s last run on ``node`` (replacing the one before).

        Raises:
            MeasuredPeaksError: ``node`` or ``role`` is not a plain token,
                ``peak_rss_bytes`` is negative, or the file cannot be written.
        """
        path = self.path_for(node)
        if not valid_token(role, 64):
            raise MeasuredPeaksError(f"role {role!r} is not a plain token")
        if peak_rss_bytes < 0:
            raise MeasuredPeaksError(f"role {role}: peak of {peak_rss_bytes} bytes is negative")
        peaks = dict(self.for_node(node))
        peaks[role] = MeasuredPeak(peak_rss_bytes, fingerprint, measured_at_s)
        document = {
            "version": FORMAT_VERSION,
            "roles": {
                name: {
                    "peak_rss_bytes": peak.peak_rss_bytes,
                    "fingerprint": peak.fingerprint,
                    "measured_at_s": peak.measured_at_s,
                }
                for name, peak in sorted(peaks.items())
            },
        }
        try:
            _write_atomic(path, json.dumps(document, indent=1) + "\n")
        except OSError as exc:
            raise MeasuredPeaksError(f"{path}: cannot store the measured peak: {exc}") from exc
        self._nodes[node] = peaks

    def _read(self, path: Path) -> dict[str, MeasuredPeak]:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            return self._ignore(path, f"unreadable ({exc})")
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            return self._ignore(path, f"not JSON ({exc})")
        if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
            return self._ignore(path, f"not a version {FORMAT_VERSION} measured-peaks file")
        roles = document.get("roles")
        if not isinstance(roles, dict):
            return self._ignore(path, "no roles object")
        out: dict[str, MeasuredPeak] = {}
        for role, entry in roles.items():
            peak = entry.get("peak_rss_bytes") if isinstance(entry, dict) else None
            if not isinstance(peak, int) or isinstance(peak, bool) or peak < 0:
                self._warnings.append(f"{path}: role {role}: no usable peak_rss_bytes; ignored")
                continue
            assert isinstance(entry, dict)
            fingerprint = entry.get("fingerprint", "")
            when = entry.get("measured_at_s", 0.0)
            out[str(role)] = MeasuredPeak(
                peak_rss_bytes=peak,
                fingerprint=fingerprint if isinstance(fingerprint, str) else "",
                measured_at_s=float(when) if isinstance(when, int | float) else 0.0,
            )
        return out

    def _ignore(self, path: Path, why: str) -> dict[str, MeasuredPeak]:
        self._warnings.append(
            f"{path}: {why}; its measured peaks are ignored and the next measurement replaces it"
        )
        return {}


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
