"""The one error tree: every error class is in ``rosterd.errors``, drawn in its docstring as
it is, and nothing raises the bare base class (each failure has its own type)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import rosterd.errors as errors_module
from rosterd.errors import RosterdError
from support.sources import parsed

SRC = Path(__file__).resolve().parent.parent / "src" / "rosterd"

#: Exceptions that never leave the module raising them (``errors``' docstring names them).
INTERNAL = {"ReadError", "YamlSyntaxError", "LocatedError"}


def _tree_classes() -> dict[str, type[RosterdError]]:
    return {
        name: cls
        for name, cls in vars(errors_module).items()
        if inspect.isclass(cls) and issubclass(cls, RosterdError)
    }


def _drawn_parents() -> dict[str, str | None]:
    """Class -> its parent as the docstring's tree draws it (by the column of its name)."""
    doc = errors_module.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│├└─ ]*))([A-Z]\w*Error)\b", line)
        if match is None:
            continue
        column, name = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((column, name))
    return parents


def test_every_error_class_of_the_package_is_in_errors_py() -> None:
    elsewhere = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef) and node.name not in INTERNAL:
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    elsewhere.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert not elsewhere, "error classes outside rosterd/errors.py:\n" + "\n".join(elsewhere)


def test_the_docstring_draws_the_tree_as_the_classes_are() -> None:
    drawn = _drawn_parents()
    real = {
        name: (None if cls is RosterdError else cls.__bases__[0].__name__)
        for name, cls in _tree_classes().items()
    }
    assert drawn == real


def test_nothing_raises_the_bare_base_class() -> None:
    bare = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "RosterdError"
            ):
                bare.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not bare, "give these a typed error from rosterd.errors:\n" + "\n".join(bare)
