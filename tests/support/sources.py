"""The package's source files, read and parsed once per test session: the structure tests
(layers, the error tree) each walk every module, and parsing them all again in each test
took seconds of the quick tier."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def source(path: Path) -> str:
    """``path``'s text (UTF-8)."""
    return path.read_text(encoding="utf-8")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path`` parsed; raises ``SyntaxError`` as ``ast.parse`` does."""
    return ast.parse(source(path), filename=str(path))
