"""Whether a restored llama-server slot can serve, from the weights' architecture (pure, and
read from GGUF headers the tests write): full attention yes, sliding-window only with
``--swa-full``, hybrid and recurrent never."""

from __future__ import annotations

from pathlib import Path

import pytest

from rosterd.model_facts.slot_reuse import slot_reuse, slot_reuse_of
from support.gguf import write_gguf


@pytest.mark.parametrize("architecture", ["qwen35", "qwen3next", "lfm2", "jamba", "granitehybrid"])
def test_hybrid_models_are_never_kept(architecture: str) -> None:
    reuse = slot_reuse(architecture, sliding_window=0, swa_full=True)
    assert not reuse.reusable
    assert reuse.why.startswith(f"a hybrid model ({architecture})")


@pytest.mark.parametrize("architecture", ["mamba", "mamba2", "rwkv7"])
def test_recurrent_models_are_never_kept(architecture: str) -> None:
    assert slot_reuse(architecture, sliding_window=0, swa_full=True).why.startswith(
        f"a recurrent model ({architecture})"
    )


def test_full_attention_is_kept_and_sliding_window_only_with_swa_full() -> None:
    assert slot_reuse("llama", sliding_window=0, swa_full=False).reusable
    assert slot_reuse("gemma3", sliding_window=512, swa_full=True).reusable
    refused = slot_reuse("gemma3", sliding_window=512, swa_full=False)
    assert not refused.reusable
    assert "without --swa-full" in refused.why


def test_read_from_the_gguf_header(tmp_path: Path) -> None:
    hybrid = write_gguf(tmp_path / "hybrid.gguf", hybrid="qwen35")
    assert not slot_reuse_of(hybrid, ["--swa-full"]).reusable
    swa = write_gguf(tmp_path / "swa.gguf", arch="gemma3", sliding_window=64)
    assert not slot_reuse_of(swa, []).reusable
    assert slot_reuse_of(swa, ["-m", str(swa), "--swa-full"]).reusable
    assert slot_reuse_of(write_gguf(tmp_path / "plain.gguf"), []).reusable
    # Weights it cannot read are kept as before (the restore's own checks still hold).
    assert slot_reuse_of(tmp_path / "missing.gguf", []).reusable
