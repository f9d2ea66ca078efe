"""Whether a restored KV cache served (DESIGN.md layer 7): the first answer after a restore,
read for what the backend says it prefilled, and the KV summary ``/status`` shows per role.

A restore can succeed and still be of no use: llama-server loads the slot's file, then
prefills the next prompt whole, because the model slides a window over its cache and was
launched without ``--swa-full`` (only the window's last tokens are kept, so the cache
cannot be reused past it), or because the prompt no longer begins with the kept tokens
(a changed chat template or system prompt). Nothing fails; the swap is just as slow as
without the KV kept. The router sees the backend's answer, and llama-server ends it
(the plain answer's JSON, an event stream's last chunk) with ``timings``:
``prompt_n`` (tokens it prefilled) and ``cache_n`` (tokens it took from the cache). So
the first answer of a backend whose start restored tokens (``Endpoint.restored_tokens``)
is read once for those figures; every other answer costs one attribute check.

The verdict (:func:`restore_verdict`) is a pure function; :class:`RestoreChecks` holds
what was found per copy of a role, logs an ineffective restore once per role, and adds
the check to show beside the role's ``kv`` in ``/status`` (:meth:`RestoreChecks.judged`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Final

from rosterd.backends.values import Endpoint, KeptKv
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.views import RoleSnapshot

log = logging.getLogger("rosterd.kv")

#: Below this many tokens held (or asked for) a restore is not judged: a few tokens are
#: re-prefilled anyway (the chat template's last turn markers), and a tiny prompt says
#: nothing about the cache.
MIN_JUDGED_TOKENS: Final[int] = 64

_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d+)')
_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')

#: What makes a restore that loaded its file useless, most likely first.
LIKELY_CAUSES: Final[str] = (
    "likely a sliding-window model launched without --swa-full (only the window's last "
    "tokens are in the kept cache), a hybrid or recurrent model (Qwen3.5 and Qwen3-Next's "
    "Gated DeltaNet, Mamba, Jamba, Granite hybrid, LFM2: llama-server cannot reuse a "
    "restored slot of its recurrent layers, and rosterd keeps none of an architecture it "
    "knows as such), a changed chat template or system prompt (the prompt no longer begins "
    "with the kept tokens), or a first request from another conversation than the kept one"
)


@dataclass(frozen=True, slots=True)
class RestoreCheck:
    """The first answer after a restore of ``restored`` tokens: its prompt had
    ``prompt_tokens`` tokens, of which the backend prefilled ``prefilled`` and took
    ``reused`` from its cache; ``effective``: the cache served (see
    :func:`restore_verdict`); ``detail``: one line saying so."""

    restored: int
    prompt_tokens: int
    prefilled: int
    reused: int
    effective: bool
    detail: str

    def as_json(self) -> dict[str, object]:
        """The fields ``/status`` adds to the role's ``kv`` (``last_restore_check``:
        ``reused`` or ``not reused``)."""
        return {
            "last_restore_check": "reused" if self.effective else "not reused",
            "last_restore_check_detail": self.detail,
            "last_restore_prefilled": self.prefilled,
            "last_restore_reused": self.reused,
        }


def restore_verdict(role: str, restored: int, tail: bytes) -> RestoreCheck | None:
    """What the answer ending in ``tail`` (its last bytes) says of a restore of ``restored``
    tokens into ``role``'s backend; ``None`` when it cannot tell (no ``timings.prompt_n``,
    no prompt length, or fewer than :data:`MIN_JUDGED_TOKENS` to judge).

    The prompt's length is ``cache_n + prompt_n`` (llama-server's ``timings``), else the
    answer's ``usage.prompt_tokens``. A prompt that continues the kept conversation
    begins with up to ``restored`` kept tokens, so a cache that served reuses nearly
    ``min(restored, prompt)`` of them; the restore counts as ineffective when it reused
    less than half of that (the issue's rule: a full prefill of a prompt the slot held).
    """
    prefilled = _last(_PROMPT_N, tail)
    if prefilled is None:
        return None
    cached = _last(_CACHE_N, tail)
    total = cached + prefilled if cached is not None else _last(_PROMPT_TOKENS, tail)
    if total is None or total < prefilled:
        return None
    held = min(restored, total)
    if held < MIN_JUDGED_TOKENS:
        return None
    reused = total - prefilled
    effective = 2 * reused >= held
    if effective:
        detail = (
            f"role {role}: the first request after the restore of {restored:,} tokens "
            f"reused {reused:,} of its {total:,} prompt tokens"
        )
    else:
        detail = (
            f"role {role}: the KV restore of {restored:,} tokens did not serve: the first "
            f"request after it prefilled {prefilled:,} of its {total:,} prompt tokens "
            f"(reused {reused:,}); {LIKELY_CAUSES}"
        )
    return RestoreCheck(restored, total, prefilled, reused, effective, detail)


def _last(pattern: re.Pattern[bytes], tail: bytes) -> int | None:
    found = pattern.findall(tail)
    return int(found[-1]) if found else None


class RestoreChecks:
    """The restore checks of one router: per copy (node, role), the backend start it
    judged and what it found; which roles were warned about.

    Use: :meth:`answered` for every answer (cheap: it reads the tail only when
    :meth:`wants` says so, then :meth:`check`); :meth:`judged` for the ``/status`` roles."""

    def __init__(self) -> None:
        # (node, unit: the role, or a further copy of it there, chat~2) -> the backend start
        # judged last (endpoint, generation) and its check
        self._checks: dict[tuple[str, str], tuple[Endpoint, int, RestoreCheck | None]] = {}
        self._warned: set[str] = set()

    def wants(self, lease: Lease) -> bool:
        """Whether ``lease``'s answer is the first after a restore of its backend's start."""
        if not lease.endpoint.restored_tokens:
            return False
        done = self._checks.get((lease.node, lease.copy or lease.role))
        return done is None or (done[0], done[1]) != (lease.endpoint, lease.generation)

    def answered(self, lease: Lease, status: int, tail: bytes) -> None:
        """``lease``'s backend answered with ``status`` and an answer ending in ``tail``:
        judge its restore if this is the first successful answer after it (:meth:`check`);
        any other answer costs an attribute check."""
        if lease.endpoint.restored_tokens and status < 300 and self.wants(lease):
            self.check(lease, tail)

    def check(self, lease: Lease, tail: bytes) -> RestoreCheck | None:
        """Judge the restore from the answer ending in ``tail`` (see :func:`restore_verdict`)
        and keep the verdict for ``/status``; an ineffective restore is logged as a warning,
        the first time for its role. Called once per backend start (:meth:`wants`)."""
        endpoint = lease.endpoint
        verdict = restore_verdict(lease.role, endpoint.restored_tokens, tail)
        self._checks[(lease.node, lease.copy or lease.role)] = (endpoint, lease.generation, verdict)
        if verdict is None:
            return None
        if verdict.effective:
            log.info("%s", verdict.detail)
        elif lease.role not in self._warned:
            self._warned.add(lease.role)
            log.warning("%s", verdict.detail)
        else:
            log.info("%s", verdict.detail)
        return verdict

    def judged(self, node: str, role: str, shown: RoleSnapshot) -> RestoreCheck | None:
        """The last check of ``role``'s restore on ``node``, to show beside its ``kv``:
        ``None`` when its last start restored nothing, or nothing was judged, or the role
        runs another backend than the one judged (another ``base_url`` or ``pid``); a
        stopped role keeps its last check."""
        kv, done = shown.kv, self._checks.get((node, role))
        if kv is None or kv.last_restore != "restored" or done is None or done[2] is None:
            return None
        judged = (done[0].base_url, done[0].pid)
        if shown.base_url is not None and (shown.base_url, shown.pid) != judged:
            return None
        return done[2]


def kv_summary(kv: KeptKv | None, check: RestoreCheck | None = None) -> str:
    """One cell for a role's kept KV cache (``rosterd ps``, the live page): the tokens and
    bytes kept and the last restore's result, such as ``3,713 tok · 18 MiB · restored``
    (``restored, not reused`` when ``check`` found that the first request after it
    prefilled the prompt whole); ``not kept`` for a role whose architecture cannot reuse a
    restored slot (its ``kv``'s ``not_kept`` says why, ``rosterd.model_facts.slot_reuse``);
    ``—`` when nothing is kept and nothing was restored."""
    if kv is None:
        return "—"
    if kv.not_kept:
        return "not kept"
    parts: list[str] = []
    if kv.tokens or kv.file_bytes:
        parts += [f"{kv.tokens:,} tok", _mib(kv.file_bytes)]
    outcome = kv.last_restore
    if outcome is not None and outcome != "none":
        not_reused = outcome == "restored" and check is not None and not check.effective
        parts.append("restored, not reused" if not_reused else outcome)
    return " · ".join(parts) or "—"


def _mib(n_bytes: int) -> str:
    mib = n_bytes / 2**20
    return f"{mib:.0f} MiB" if mib >= 10 else f"{mib:.1f} MiB"
