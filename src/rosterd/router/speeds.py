"""How fast each role reads a prompt and writes an answer, measured from its past requests
(DESIGN.md layer 7): what a request's first-byte deadline is computed from
(:func:`rosterd.router.deadlines.first_byte_deadline_s`).

llama-server puts its own figures in every answer (``timings``: ``prompt_per_second``,
``predicted_per_second``, in a whole answer and in a stream's last chunk); a backend that
gives none (mlx_lm.server, llama-cpp-python) is measured by the time to its first
streamed byte over the prompt's tokens (``usage.prompt_tokens``). A role not measured
yet is estimated from its memory (:data:`PREFILL_BYTES_PER_S`,
:data:`DECODE_BYTES_PER_S`): a CPU reads a model's weights once per token it writes and
about once per batch of prompt, so both speeds fall with the model's size.
Plain regular expressions over the answer's last bytes: the answer is never parsed twice.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

#: A role's prompt speed before it is measured: this many bytes of its memory read per
#: second, over its resident bytes, tokens/s. Slow on purpose: gemma-3-270m (about 0.4 GiB
#: resident) measured 154 tokens/s on two CPU cores (6,000 tokens in 39 s), this gives 50.
PREFILL_BYTES_PER_S = 2.0e10

#: How many of a role's newest measures count: the slowest of them is taken, since a prompt
#: the backend had cached reads far faster than a new one of the same size.
MEASURES_KEPT = 8

#: A role's generation speed before it is measured, the same way: a CPU's memory bandwidth
#: (tens of GB/s; this assumes 5) over the bytes read per token, tokens/s.
DECODE_BYTES_PER_S = 5.0e9

_PROMPT_PER_S = re.compile(rb'"prompt_per_second"\s*:\s*([0-9.eE+-]+)')
_PREDICTED_PER_S = re.compile(rb'"predicted_per_second"\s*:\s*([0-9.eE+-]+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*([0-9]+)')


@dataclass(frozen=True, slots=True)
class Speeds:
    """A role's speeds, tokens/s: reading the prompt (``prefill``) and writing (``decode``);
    ``measured``: from its own answers rather than estimated from its size."""

    prefill: float
    decode: float
    measured: bool = False


def estimated_speeds(resident_bytes: int) -> Speeds:
    """The speeds of a role not measured yet, from its resident memory in bytes (0 if
    unknown: counted as 1 GiB)."""
    size = max(resident_bytes, 1) if resident_bytes > 0 else 2**30
    return Speeds(PREFILL_BYTES_PER_S / size, DECODE_BYTES_PER_S / size)


def _figure(pattern: re.Pattern[bytes], tail: bytes) -> float | None:
    found = pattern.findall(tail)
    try:
        value = float(found[-1]) if found else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


class RoleSpeeds:
    """The measured speeds of each role: the slowest of its :data:`MEASURES_KEPT` newest
    answers (old figures age out: a role is reloaded with other settings, a node gets
    busier)."""

    def __init__(self) -> None:
        self._by_role: dict[str, deque[Speeds]] = {}

    def of(self, role: str, resident_bytes: int) -> Speeds:
        """``role``'s measured speeds, else those estimated from ``resident_bytes``."""
        measures = self._by_role.get(role)
        if not measures:
            return estimated_speeds(resident_bytes)
        prefill = min(m.prefill for m in measures)
        return Speeds(prefill, min(m.decode for m in measures), measured=True)

    def answered(self, role: str, tail: bytes, first_byte_s: float | None, streamed: bool) -> None:
        """Learn from an answer of ``role`` that ended well: ``tail`` its last bytes,
        ``first_byte_s`` seconds from sending it to its first body byte; ``streamed``: that
        first byte came before the generation (only then it times the prompt)."""
        prefill = _figure(_PROMPT_PER_S, tail)
        if prefill is None and streamed and first_byte_s:
            tokens = _figure(_PROMPT_TOKENS, tail)
            prefill = tokens / first_byte_s if tokens else None
        if prefill is None:
            return
        # Writing is slower than reading, about tenfold on a CPU, when the answer says nothing.
        decode = _figure(_PREDICTED_PER_S, tail) or prefill / 10
        measures = self._by_role.setdefault(role, deque(maxlen=MEASURES_KEPT))
        measures.append(Speeds(prefill, decode, measured=True))
