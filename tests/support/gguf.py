"""GGUF files the tests write themselves: shapes given by the test (scripts/make_tiny_gguf.py's
writer) and the tiny random llama model that llama-server loads in a second."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[2]


def write_gguf(path: Path, seed: int = 0, **shape: object) -> Path:
    """A random GGUF at ``path`` of the given ``shape`` (``arch``, ``blocks``, ``heads``, ...:
    ``scripts/make_tiny_gguf.write_tiny_gguf``'s keywords)."""
    module = load_script("make_tiny_gguf")
    writer = cast(Callable[..., Path], module.write_tiny_gguf)  # type: ignore[attr-defined]
    return writer(path, seed, **shape)


def load_script(name: str) -> object:
    """The module ``scripts/NAME.py``, loaded from its file (``scripts/`` is no package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """``scripts/make_tiny_gguf.write_tiny_gguf``: a tiny random llama GGUF at ``path``."""
    module = load_script("make_tiny_gguf")
    writer = cast(Callable[[Path, int], Path], module.write_tiny_gguf)  # type: ignore[attr-defined]
    return writer(path, seed)
