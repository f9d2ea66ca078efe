"""The import-layer contract of DESIGN.md: imports only point down the list of layers.

Every module of the package is given a layer here (by its dotted name or the
nearest package that has one); a module may import only modules of its own layer
or a lower one. Imports inside functions count too (a lazy import is still a
dependency). A new module without a layer fails the test, so the map stays whole.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: DESIGN.md's layers, by module or package (the longest matching prefix wins).
LAYERS: dict[str, int] = {
    # 1. value types, validation, the error tree; no I/O
    "rosterd": 1,
    "rosterd.tokens": 1,
    "rosterd.errors": 1,
    "rosterd.spec": 1,
    "rosterd.rust_debug": 1,
    # 2. files in, frozen specs out
    "rosterd.roster": 2,
    "rosterd.fleet": 2,
    "rosterd.weights": 2,
    "rosterd.schemas": 2,
    "rosterd.model_facts": 2,
    "rosterd.model_facts.facts": 2,
    "rosterd.model_facts.gguf_file": 2,
    "rosterd.model_facts.mlx_folder": 2,
    # 3. pure decisions
    "rosterd.residency": 3,
    "rosterd.placement": 3,
    "rosterd.memory": 3,
    "rosterd.memory.estimate": 3,
    "rosterd.memory.count": 3,
    # 4. adapters: argv and probe builders per flavor
    "rosterd.adapters": 4,
    # 5. processes and the state folder
    "rosterd.supervisor": 5,
    "rosterd.memory.peaks": 5,
    "rosterd.memory.gathering": 5,
    # 6. the scheduler and the backends boundary it applies effects through
    "rosterd.metrics": 6,
    "rosterd.backends": 6,
    "rosterd.scheduler": 6,
    "rosterd.scheduler.grants": 6,
    "rosterd.scheduler.liveness": 6,
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

#: The node state machine's modules: pure (DESIGN.md layer 6, "a pure state machine").
_PURE_STATE_MACHINE = (
    "rosterd.scheduler.machine",
    "rosterd.scheduler.state",
    "rosterd.scheduler.events",
    "rosterd.scheduler.replan",
    "rosterd.scheduler.grants",
    "rosterd.scheduler.liveness",
    # the fleet machine (DESIGN.md: "a pure function of (fleet state, event)")
    "rosterd.fleet_scheduler.values",
    "rosterd.fleet_scheduler.events",
    "rosterd.fleet_scheduler.effects",
    "rosterd.fleet_scheduler.machine",
    "rosterd.fleet_scheduler.served",
    "rosterd.fleet_scheduler.notices",
    "rosterd.fleet_scheduler.views",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


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
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
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


def test_the_node_state_machine_does_no_io() -> None:
    """The pure state machine reads no clock, logs nothing and knows nothing of asyncio."""
    for module in _PURE_STATE_MACHINE:
        path = SRC / Path(*module.split(".")).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        impure = names & {"asyncio", "time", "logging", "socket", "subprocess", "os", "httpx"}
        assert not impure, f"{module} imports {sorted(impure)}"
