"""What the package docstrings and CONTRIBUTING.md say of the modules is what exists.

A hand-written list of modules drifts as modules are added, split and renamed, so
each one a newcomer reads to find their way is checked against the folders, both ways:

- a package docstring that lists its modules (a bullet list whose items start with a
  module's name, ``name`` or :mod:`~rosterd.package.name`) lists every module and
  sub-package of its package, and nothing else;
- every Sphinx reference to a rosterd name in the sources (:mod:`rosterd.a.b`,
  :class:`~rosterd.a.b.C`, ...) names something that exists;
- CONTRIBUTING.md's "Where each concept lives" table names every module of
  ``src/rosterd`` and only modules that exist: a row's first cells name top-level
  modules (``errors.py``) and packages (``router/``); in its concept cell, a
  backticked plain lower-case name (``proxy``) is a module of the row's packages, while
  functions are written with their parentheses (``is_this_machine()``) and routes with
  their path (``/api/ps``).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE_DIR = SRC / "rosterd"

_BARE = r"``(?P<bare>[a-z_][a-z0-9_]*)``"
_DOTTED = r":mod:`~?(?P<dotted>rosterd(?:\.\w+)+)`"
_REF = rf"(?:{_BARE}|{_DOTTED})"
_UNNAMED_REF = re.sub(r"\?P<\w+>", "", _REF)
#: A bullet item whose head names modules: "- ``a``: ...", "* ``a``, ``b``: ...".
_LISTING_ITEM = re.compile(
    rf"^\s*[-*]\s+(?P<head>{_UNNAMED_REF}(?:(?:,\s*|\s+and\s+|/){_UNNAMED_REF})*)"
)
_SPHINX_REF = re.compile(r":(?P<role>\w+):`~?(?P<target>rosterd(?:\.\w+)+)`")
_MODULE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _is_module(dotted: str) -> bool:
    path = SRC / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _modules_of(package_dir: Path) -> set[str]:
    """The modules and sub-packages of one package, by their names in it."""
    modules = {path.stem for path in package_dir.glob("*.py") if path.stem != "__init__"}
    subpackages = {path.parent.name for path in package_dir.glob("*/__init__.py")}
    return modules | subpackages


def _packages() -> list[Path]:
    return sorted(init.parent for init in PACKAGE_DIR.rglob("__init__.py"))


def _dotted_name(package_dir: Path) -> str:
    return ".".join(package_dir.relative_to(SRC).parts)


def listed_modules(docstring: str, package: str) -> set[str]:
    """The modules a package's docstring lists: the names at the head of its bullet items.

    ``package`` is the package's dotted name; a :mod: reference at an item's head
    counts as the module of ``package`` it falls in (``rosterd.fleet.model.Node``:
    ``model``), and one outside ``package`` is no listing of it.
    """
    listed: set[str] = set()
    for line in docstring.splitlines():
        item = _LISTING_ITEM.match(line)
        if item is None:
            continue
        for ref in re.finditer(_REF, item.group("head")):
            if ref.group("bare") is not None:
                listed.add(ref.group("bare"))
            elif ref.group("dotted").startswith(package + "."):
                listed.add(ref.group("dotted")[len(package) + 1 :].split(".")[0])
    return listed


@pytest.mark.parametrize(
    ("docstring", "expected"),
    [
        ("Parts:\n\n- ``app``: the wiring;\n- ``auth``: the gate.", {"app", "auth"}),
        ("* :mod:`~rosterd.fleet.model` holds values", {"model"}),
        ("- ``_a``, ``_b`` and ``c``: private parts", {"_a", "_b", "c"}),
        ("- its errors are in :mod:`rosterd.errors`.", set()),
        ("- :mod:`rosterd.errors`: elsewhere", set()),
        ("- ``GET /health``: an endpoint", set()),
        ("Prose naming ``app`` is no listing.", set()),
    ],
)
def test_a_listing_is_the_names_at_the_head_of_bullet_items(
    docstring: str, expected: set[str]
) -> None:
    assert listed_modules(docstring, "rosterd.fleet") == expected


def test_package_docstrings_that_list_modules_list_them_all() -> None:
    wrong: list[str] = []
    for package_dir in _packages():
        tree = ast.parse((package_dir / "__init__.py").read_text(encoding="utf-8"))
        docstring = ast.get_docstring(tree) or ""
        listed = listed_modules(docstring, _dotted_name(package_dir))
        if not listed:
            continue
        actual = _modules_of(package_dir)
        if listed != actual:
            wrong.append(
                f"{package_dir.relative_to(ROOT)}/__init__.py: missing {sorted(actual - listed)}, "
                f"no such module {sorted(listed - actual)}"
            )
    assert not wrong, "package docstrings list modules as they are not:\n" + "\n".join(wrong)


def _resolves(role: str, target: str) -> bool:
    if role == "mod":
        return _is_module(target)
    parts = target.split(".")
    module_parts = next(n for n in range(len(parts), 0, -1) if _is_module(".".join(parts[:n])))
    found: object = importlib.import_module(".".join(parts[:module_parts]))
    for attribute in parts[module_parts:]:
        if not hasattr(found, attribute):
            return False
        found = getattr(found, attribute)
    return True


def test_every_sphinx_reference_names_what_exists() -> None:
    broken = [
        f"{path.relative_to(ROOT)}: {ref.group(0)}"
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        for ref in _SPHINX_REF.finditer(path.read_text(encoding="utf-8"))
        if not _resolves(ref.group("role"), ref.group("target"))
    ]
    assert not broken, "references to nothing:\n" + "\n".join(broken)


def _concept_table() -> list[tuple[list[str], str]]:
    """CONTRIBUTING.md's "Where each concept lives" rows: (module cell's spans, concept)."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Where each concept lives", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[list[str], str]] = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if not line.startswith("| ") or len(cells) != 3 or cells[0] in ("layer", "---"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[1]), cells[2]))
    return rows


def test_the_concept_table_names_every_module_and_only_modules() -> None:
    rows = _concept_table()
    assert rows, "CONTRIBUTING.md has no 'Where each concept lives' table"
    named: set[str] = set()
    not_modules: list[str] = []
    for module_spans, concept in rows:
        packages = [span.rstrip("/") for span in module_spans if span.endswith("/")]
        for span in module_spans:
            dotted = "rosterd." + span.removesuffix(".py").rstrip("/").replace("/", ".")
            if not _is_module(dotted):
                not_modules.append(f"`{span}`")
            named.add(dotted)
        for span in re.findall(r"`([^`]+)`", concept):
            if _MODULE_NAME.fullmatch(span) is None:
                continue
            in_packages = [f"rosterd.{p.replace('/', '.')}.{span}" for p in packages]
            existing = [dotted for dotted in in_packages if _is_module(dotted)]
            if not existing:
                not_modules.append(f"`{span}` (in the row of {', '.join(module_spans)})")
            named.update(existing)
    every_module = {
        _dotted_name(path.with_suffix("")) if path.stem != "__init__" else _dotted_name(path.parent)
        for path in PACKAGE_DIR.rglob("*.py")
    } - {"rosterd"}
    unnamed = sorted(every_module - named)
    assert not not_modules, "the table names modules that do not exist: " + ", ".join(not_modules)
    assert not unnamed, "the table does not name these modules: " + ", ".join(unnamed)
