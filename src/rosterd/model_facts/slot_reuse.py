"""Whether a restored llama-server slot can serve its model's next request, known from the
weights before anything is saved (DESIGN.md layer 2: a read of the GGUF's header, then a
pure decision).

A slot file holds what the server computed for a conversation. Restoring it only helps if
the server can then take the conversation's next prompt from it and prefill just the new
tokens, and that depends on the architecture (``general.architecture``):

- **full attention** (llama, qwen3, ...): the cache holds every token's keys and values;
  the next prompt continues it. Kept.
- **sliding-window attention** (gemma3's interleaved layers, ``sliding_window`` > 0):
  those layers keep only the window's last tokens unless llama-server is launched with
  ``--swa-full`` (rosterd passes it with the KV kept, ``rosterd.adapters.llamacpp``);
  without it the restored cache cannot be extended and every prompt is prefilled whole.
  Kept only with ``--swa-full``.
- **recurrent or hybrid** (Mamba, RWKV; Jamba, Granite hybrid, LFM2, Qwen3-Next and
  Qwen3.5's Gated DeltaNet, ...): a recurrent layer's state is the whole history folded
  into one value, and llama-server cannot roll it back to the point where a new prompt
  departs, so a restored slot is cleared and prefilled again (llama.cpp#25913: cold
  19.1 s, after the restore 19.2 s, warm slot 0.5 s; #28194 and PR #26004 open), and no
  flag changes it. Not kept: saving would only cost the swap its write.

The two sets are llama.cpp's own: ``llm_arch_is_recurrent`` and ``llm_arch_is_hybrid`` in
``src/llama-arch.cpp``, with each architecture's GGUF name from ``LLM_ARCH_NAMES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rosterd.errors import RosterdError
from rosterd.model_facts.reader import read_model_facts

#: llama.cpp's ``llm_arch_is_recurrent``: every layer a recurrent state.
RECURRENT_ARCHITECTURES: Final[frozenset[str]] = frozenset(
    {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"}
)
#: llama.cpp's ``llm_arch_is_hybrid``: attention layers among recurrent ones.
HYBRID_ARCHITECTURES: Final[frozenset[str]] = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "qwen35",
        "qwen35moe",
        "deepseek4",
    }
)
#: llama-server's flag that keeps a sliding-window layer's whole cache.
SWA_FULL_FLAG: Final[str] = "--swa-full"


@dataclass(frozen=True, slots=True)
class SlotReuse:
    """Whether a restored slot can serve: ``reusable``, and ``why`` (one sentence naming
    the architecture; empty when reusable)."""

    reusable: bool
    why: str = ""


def slot_reuse(architecture: str, *, sliding_window: int, swa_full: bool) -> SlotReuse:
    """Whether a llama-server slot of a model of ``architecture`` (GGUF's
    ``general.architecture``) whose layers slide a window of ``sliding_window`` tokens
    (0: none) can be restored and serve, launched with ``--swa-full`` or not (see the
    module; pure)."""
    if architecture in RECURRENT_ARCHITECTURES or architecture in HYBRID_ARCHITECTURES:
        kind = "recurrent" if architecture in RECURRENT_ARCHITECTURES else "hybrid"
        return SlotReuse(
            False,
            f"a {kind} model ({architecture}): llama-server cannot reuse a restored slot of "
            "its recurrent layers (the prompt is prefilled whole again), so its KV cache is "
            "not kept",
        )
    if sliding_window > 0 and not swa_full:
        return SlotReuse(
            False,
            f"a sliding-window model ({architecture}, window {sliding_window} tokens) "
            f"launched without {SWA_FULL_FLAG}: only the window's last tokens would be "
            "kept, so its KV cache is not kept",
        )
    return SlotReuse(True)


def slot_reuse_of(path: Path, argv: tuple[str, ...] | list[str]) -> SlotReuse:
    """:func:`slot_reuse` for the GGUF at ``path`` served with ``argv`` (llama-server's
    arguments: whether ``--swa-full`` is among them). Weights whose header cannot be read
    are taken as reusable, as before this check (the restore's own checks still hold)."""
    try:
        facts = read_model_facts(path)
    except (RosterdError, OSError):
        return SlotReuse(True)
    return slot_reuse(
        facts.architecture,
        sliding_window=facts.sliding_window,
        swa_full=SWA_FULL_FLAG in argv,
    )
