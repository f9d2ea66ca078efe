"""The fake ``ollama`` (support/fake_ollama.py) as an executable named ``ollama``, as the
ollama adapter launches it."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

FAKE_OLLAMA = Path(__file__).resolve().parent / "fake_ollama.py"


def fake_ollama_binary(folder: Path) -> Path:
    """An executable named `ollama` that runs the fake with this interpreter."""
    binary = folder / "ollama"
    binary.write_text(f"#!{sys.executable}\n" + FAKE_OLLAMA.read_text())
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary
