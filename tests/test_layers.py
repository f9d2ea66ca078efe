"""The import-layer contract of DESIGN.md: imports only point down the list of layers.

Every module of the package is given a layer here (by its dotted name or the
nearest package that has one); a module may import only modules of its own layer
or a lower one. Imports inside functions count too (a lazy import is still a
dependency). A new module without a layer fails the test, so the map stays whole.

The pure modules (layers 1 and 3, the node state machine and the values it reads
from the backends boundary) import no I/O module, even transitively: the check
follows every rosterd import (inside functions and under ``TYPE_CHECKING`` too) and
counts that importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first.
"""

from __future__ import annotations

import ast
import re
import tokenize
from io import StringIO
from pathlib import Path

import pytest

from support.sources import parsed, source

SRC = Path(__file__).resolve().parent.parent / "src"

#: DESIGN.md's layers, by module or package (the longest matching prefix wins).
LAYERS: dict[str, int] = {
    # 1. value types, validation, the error tree; no I/O
    "rosterd": 1,
    "rosterd.tokens": 1,
    "rosterd.errors": 1,
    "rosterd.error_table": 1,
    "rosterd.spec": 1,
    "rosterd.flavors": 1,
    "rosterd.rust_debug": 1,
    # the plain values that cross the backends boundary: the supervisor (5) produces them
    # and the pure node machine (6) reads them, so they sit below both
    "rosterd.backends.values": 1,
    # the names of a role's copies on one supervisor: the supervisor (5) checks them and
    # the backends (6) and `up` (8) give and read them
    "rosterd.backends.copy_names": 1,
    # 2. files in, frozen specs out
    "rosterd.roster": 2,
    "rosterd.fleet": 2,
    "rosterd.weights": 2,
    "rosterd.schemas": 2,
    "rosterd.keys": 2,
    "rosterd.model_facts": 2,
    "rosterd.model_facts.facts": 2,
    "rosterd.model_facts.gguf_file": 2,
    "rosterd.model_facts.mlx_folder": 2,
    "rosterd.model_facts.reader": 2,
    "rosterd.model_facts.slot_reuse": 2,
    # a node's devices: the listing and breakdown parsers and NVML's reading are files in,
    # values out; a node's pools are a pure decision; the probe runs llama-server
    "rosterd.devices": 2,
    "rosterd.devices.listing": 2,
    "rosterd.devices.breakdown": 2,
    "rosterd.devices.load_buffers": 2,
    "rosterd.devices.nvml": 2,
    "rosterd.devices.footprint": 2,
    "rosterd.devices.pools": 3,
    "rosterd.devices.probe": 5,
    # 3. pure decisions
    "rosterd.residency": 3,
    "rosterd.replica_choice": 3,
    "rosterd.placement": 3,
    "rosterd.memory": 3,
    "rosterd.memory.estimate": 3,
    "rosterd.memory.count": 3,
    "rosterd.memory.split": 3,
    # a role's estimate by pool reads its weights' facts and the adapter's launch (5)
    "rosterd.memory.by_pool": 5,
    # 4. adapters: argv and probe builders per flavor
    "rosterd.adapters": 4,
    # 5. processes and the state folder
    "rosterd.supervisor": 5,
    "rosterd.memory.peaks": 5,
    "rosterd.usage": 5,
    "rosterd.memory.gathering": 5,
    # 6. the scheduler and the backends boundary it applies effects through
    "rosterd.metrics": 6,
    "rosterd.backends": 6,
    "rosterd.scheduler": 6,
    "rosterd.scheduler.grants": 6,
    "rosterd.scheduler.health": 6,
    "rosterd.scheduler.loop": 6,
    "rosterd.node_agent": 6,
    "rosterd.node_agent.actor": 6,
    "rosterd.node_agent.head": 6,
    "rosterd.ray_cluster": 6,
    "rosterd.ray_match": 6,
    "rosterd.memory.watch": 6,
    "rosterd.fleet_scheduler": 6,
    # 7. HTTP
    "rosterd.router": 7,
    # 8. the command and the runtime of `rosterd up`
    "rosterd.up": 8,
    "rosterd.cli": 8,
    "rosterd.__main__": 8,
}

#: The node state machine's modules: pure (DESIGN.md layer 6, "a pure state machine"), with
#: the values they read from the backends boundary. Every module of layers 1 and 3 is pure too.
_PURE_STATE_MACHINE = (
    "rosterd.scheduler.machine",
    "rosterd.scheduler.state",
    "rosterd.scheduler.events",
    "rosterd.scheduler.replan",
    "rosterd.scheduler.grants",
    "rosterd.scheduler.health",
    "rosterd.scheduler.transition",
    "rosterd.scheduler.loads",
    "rosterd.scheduler.kv_saves",
    "rosterd.scheduler.shutdown",
    "rosterd.scheduler.values",
    "rosterd.scheduler.views",
    "rosterd.backends.interface",
    "rosterd.backends.values",
    # the fleet machine (DESIGN.md: "a pure function of (fleet state, event)")
    "rosterd.fleet_scheduler.values",
    "rosterd.fleet_scheduler.events",
    "rosterd.fleet_scheduler.effects",
    "rosterd.fleet_scheduler.machine",
    "rosterd.fleet_scheduler.state",
    "rosterd.fleet_scheduler.losses",
    "rosterd.fleet_scheduler.served",
    "rosterd.fleet_scheduler.notices",
    "rosterd.fleet_scheduler.views",
)

#: What "I/O" means for a pure module: modules it must not import, even through another
#: rosterd module, each with why. Only imports written in rosterd count (what a library
#: imports for itself is its own business: pathlib imports os, yet a ``Path`` is a value).
IO_MODULES: dict[str, str] = {
    "asyncio": "an event loop: tasks, sleeps, subprocesses and sockets",
    "socket": "the network",
    "ssl": "the network (TLS)",
    "http": "HTTP (http.client, http.server)",
    "urllib": "HTTP (urllib.request)",
    "httpx": "HTTP, our client",
    "httptools": "HTTP parsing for uvicorn's server",
    "uvicorn": "the HTTP server",
    "starlette": "the HTTP application",
    "prometheus_client": "metrics, with their own HTTP server and locks",
    "subprocess": "processes",
    "signal": "processes' signals",
    "multiprocessing": "processes",
    "concurrent": "thread and process pools",
    "threading": "threads",
    "select": "waiting on file descriptors",
    "selectors": "waiting on file descriptors",
    "fcntl": "file locks",
    "resource": "the process's limits",
    "os": "the environment, processes and files (os.path too: `import os.path` binds all "
    "of os, and a pure module joins paths with pathlib's values)",
    "shutil": "files and executables on PATH",
    "tempfile": "files",
    "mmap": "files mapped into memory (the GGUF reader)",
    "gguf": "reads GGUF files",
    "huggingface_hub": "the Hugging Face cache, and the network",
    "psutil": "the machine's processes and memory",
    "platform": "the machine's OS and CPU",
    "time": "the clock (a pure decision is given `now`)",
    "logging": "logs (a pure decision returns what to record)",
    "ray": "the cluster",
    "rich": "the terminal",
    "typer": "the command line",
}


def _module_name(path: Path) -> str:
    return _module_name_in(SRC, path)


def _layer(module: str) -> int | None:
    best: str | None = None
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    # "rosterd" alone only names the package itself, not every module under it.
    if best == "rosterd" and module != "rosterd":
        return None
    return None if best is None else LAYERS[best]


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """The rosterd modules ``path`` imports, with line numbers."""
    tree = parsed(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("rosterd")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                target = node.module or ""
            if target.startswith("rosterd"):
                found.append((target, node.lineno))
    return found


def _modules() -> list[tuple[Path, str]]:
    return sorted((p, _module_name(p)) for p in (SRC / "rosterd").rglob("*.py"))


def _import_graph(src: Path) -> dict[str, tuple[set[str], set[str]]]:
    """Module -> (the rosterd modules importing it runs, the other top-level modules it imports).

    Every import counts, wherever it is written (module level, inside a function, under
    ``TYPE_CHECKING``). ``from a.b import c`` imports the module ``a.b.c`` when there is
    one; importing a module runs each package ``__init__`` above it, so those count too.
    """
    paths = {_module_name_in(src, p): p for p in (src / "rosterd").rglob("*.py")}

    def existing(name: str) -> str:
        while name not in paths and "." in name:
            name = name.rpartition(".")[0]
        return name

    def with_parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    graph: dict[str, tuple[set[str], set[str]]] = {}
    for module, path in paths.items():
        tree = parsed(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        ours: set[str] = with_parents(package) if package else set()
        theirs: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                else:
                    target = node.module or ""
                names = [target, *(f"{target}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                if name == "rosterd" or name.startswith("rosterd."):
                    ours |= with_parents(existing(name))
                else:
                    theirs.add(name.split(".")[0])
        ours.discard(module)
        theirs.discard("")
        graph[module] = (ours, theirs)
    return graph


def _io_reached(graph: dict[str, tuple[set[str], set[str]]], module: str) -> dict[str, str]:
    """I/O module -> the import chain by which ``module`` reaches it (``a <- b <- module``)."""
    came_from: dict[str, str | None] = {module: None}
    queue = [module]
    found: dict[str, str] = {}
    while queue:
        current = queue.pop(0)
        ours, theirs = graph.get(current, (set(), set()))
        for io in sorted(theirs & IO_MODULES.keys()):
            if io not in found:
                chain = [io, current]
                while (previous := came_from[chain[-1]]) is not None:
                    chain.append(previous)
                found[io] = " <- ".join(chain)
        for nxt in sorted(ours):
            if nxt not in came_from:
                came_from[nxt] = current
                queue.append(nxt)
    return found


def _module_name_in(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _pure_modules() -> list[str]:
    """Every module of layers 1 and 3, and the node state machine's."""
    by_layer = [name for _, name in _modules() if _layer(name) in (1, 3)]
    return sorted({*by_layer, *_PURE_STATE_MACHINE} - {"rosterd"})


def test_every_module_has_a_layer() -> None:
    missing = [name for _, name in _modules() if _layer(name) is None]
    assert not missing, f"give these modules a layer in tests/test_layers.py: {missing}"


def test_imports_only_point_down_the_layers() -> None:
    upward: list[str] = []
    for path, name in _modules():
        own = _layer(name)
        if own is None:
            continue
        for target, line in _imports(path, name):
            theirs = _layer(target)
            if theirs is not None and theirs > own:
                upward.append(f"{name}:{line} (layer {own}) imports {target} (layer {theirs})")
    assert not upward, "imports that point up DESIGN.md's layers:\n" + "\n".join(upward)


def test_the_pure_modules_import_no_io_even_transitively() -> None:
    """Layers 1 and 3 and the node state machine read no clock, log nothing, know nothing of
    asyncio, processes or the network, through any chain of imports."""
    graph = _import_graph(SRC)
    impure = [
        f"{module} reaches {io} ({IO_MODULES[io]}): {chain}"
        for module in _pure_modules()
        for io, chain in _io_reached(graph, module).items()
    ]
    assert not impure, "pure modules that import I/O:\n" + "\n".join(impure)


@pytest.mark.parametrize(
    ("files", "reached"),
    [
        # a package __init__ that re-exports a heavy module makes its pure submodule impure
        (
            {
                "rosterd/pkg/__init__.py": "from rosterd.pkg.heavy import x\n",
                "rosterd/pkg/heavy.py": "import asyncio\nx = 1\n",
                "rosterd/pkg/pure.py": "y = 2\n",
            },
            {"asyncio"},
        ),
        # an import inside a function, and one under TYPE_CHECKING, still count
        (
            {
                "rosterd/pkg/__init__.py": "",
                "rosterd/pkg/pure.py": "def f():\n    from rosterd.pkg import lazy\n",
                "rosterd/pkg/lazy.py": "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import os.path\n",
            },
            {"os"},
        ),
        # `from package import submodule` imports the submodule
        (
            {
                "rosterd/pkg/__init__.py": "",
                "rosterd/pkg/pure.py": "from . import clock\n",
                "rosterd/pkg/clock.py": "from time import monotonic\n",
            },
            {"time"},
        ),
        # nothing heavy anywhere: pure
        (
            {
                "rosterd/pkg/__init__.py": "",
                "rosterd/pkg/pure.py": "from dataclasses import dataclass\nimport rosterd.pkg.b\n",
                "rosterd/pkg/b.py": "import enum\n",
            },
            set(),
        ),
    ],
)
def test_the_transitive_check_counts_packages_functions_and_type_checking(
    tmp_path: Path, files: dict[str, str], reached: set[str]
) -> None:
    (tmp_path / "rosterd").mkdir()
    (tmp_path / "rosterd" / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert set(_io_reached(_import_graph(tmp_path), "rosterd.pkg.pure")) == reached


def _explicit_imports(src: Path) -> dict[str, set[str]]:
    """Module -> the rosterd modules it names in an import statement (anywhere: module level,
    inside a function, under ``TYPE_CHECKING``); ``from a import b`` names ``a.b`` when it
    is a module, else ``a``. The package ``__init__`` an import runs is not counted: a
    package and its own modules are one concept."""
    paths = {_module_name_in(src, p): p for p in (src / "rosterd").rglob("*.py")}

    def existing(name: str) -> str:
        while name not in paths and "." in name:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = parsed(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                else:
                    target = node.module or ""
                names = [
                    f"{target}.{a.name}" if f"{target}.{a.name}" in paths else target
                    for a in node.names
                ]
            else:
                continue
            found |= {existing(n) for n in names if n == "rosterd" or n.startswith("rosterd.")}
        found.discard(module)
        edges[module] = found
    return edges


def test_no_import_cycle_between_modules() -> None:
    """No two modules of rosterd import each other, however indirectly, counting imports
    inside functions and under ``TYPE_CHECKING`` (a lazy import is still a dependency)."""
    edges = _explicit_imports(SRC)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert not cycles, "modules that import each other:\n" + "\n".join(map(str, cycles))


#: The size rule's purpose: one concept per module, small enough to read in one sitting
#: (CONTRIBUTING.md). It counts lines of code only: docstrings and comments are the
#: documentation we want more of, and counting them pushed modules apart at odd seams.
MAX_CODE_LINES = 400

#: Modules known to be over the rule, each with why and what brings it back under. An entry
#: that no longer applies fails the test, so the list only shrinks.
OVER_THE_RULE: dict[str, str] = {}


def code_lines(text: str, tree: ast.Module | None = None) -> int:
    """How many lines of ``text`` (Python source; ``tree``: its parse, when at hand) hold
    code.

    A line counts when a token other than a comment lies on it; a string that stands alone
    as a statement (a module, class or function docstring, or an attribute's docstring) is
    documentation and does not count, nor do blank lines.
    """
    documentation: set[int] = set()
    for node in ast.walk(tree if tree is not None else ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            documentation.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    code: set[int] = set()
    not_code = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    for token in tokenize.generate_tokens(StringIO(text).readline):
        if token.type not in not_code:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - documentation)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"""A module."""\n\nx = 1  # one\n', 1),
        ('def f() -> int:\n    """Doc\n\n    more.\n    """\n    # why\n    return 1\n', 2),
        ('X = 1\n"""X\'s docstring."""\ny = """a\nb"""\n', 3),
        ("call(\n    1,\n\n    2,\n)\n", 4),
    ],
)
def test_code_lines_skip_docstrings_comments_and_blank_lines(text: str, expected: int) -> None:
    assert code_lines(text) == expected


def test_no_module_is_over_400_lines_of_code() -> None:
    """One concept a module, small enough to read in one sitting (CONTRIBUTING.md)."""
    counts = {
        path.relative_to(SRC).as_posix(): code_lines(source(path), parsed(path))
        for path in (SRC / "rosterd").rglob("*.py")
    }
    long = {
        name: n for name, n in counts.items() if n > MAX_CODE_LINES and name not in OVER_THE_RULE
    }
    assert not long, f"modules over {MAX_CODE_LINES} lines of code (split by concept): {long}"
    back_under = [name for name in OVER_THE_RULE if counts.get(name, 0) <= MAX_CODE_LINES]
    assert not back_under, f"remove from OVER_THE_RULE, now within the rule: {back_under}"


#: An import line that names a test module or a conftest somewhere in it.
_NAMES_A_TEST_MODULE = re.compile(
    r"^[ \t]*(?:from|import)[ \t][^\n]*\b(?:test_\w+|conftest)\b", re.MULTILINE
)


def test_no_test_module_imports_another_test_module() -> None:
    """What tests share lives in ``tests/support`` (imported as ``support``): a test module
    imported by another runs its tests' module-level code twice and ties the two together."""
    tests = Path(__file__).resolve().parent
    found: list[str] = []
    for path in sorted(tests.rglob("*.py")):
        if not _NAMES_A_TEST_MODULE.search(source(path)):
            continue  # no import line names one: spares parsing every test file
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                head = name.split(".")[0]
                if head.startswith("test_") or head == "conftest":
                    found.append(f"{path.relative_to(tests)}:{node.lineno} imports {name}")
    assert not found, "import what tests share from tests/support instead:\n" + "\n".join(found)
