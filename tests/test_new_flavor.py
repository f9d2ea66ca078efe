"""A new flavor is its adapter module and its lines in the two registries, nothing else.

The test adds a flavor, ``tinyserve``, to a copy of the package exactly that way: a
member of ``InferFlavor`` with its line in ``FLAVOR_FACTS`` (``rosterd/flavors.py``),
one adapter module, and its import and line in ``ADAPTERS``. It then runs that copy as
a user does (``rosterd plan`` on a roster whose entry says ``backend: tinyserve``,
with a fleet file that names the flavor) and builds the role's launch: the roster
import, the fleet file, the weights finder, the memory estimate and placement must
all take the flavor from those lines, without a branch of their own. No process of
a backend is started; the copy runs in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rosterd.flavors import FLAVOR_FACTS
from rosterd.spec import InferFlavor

SRC = Path(__file__).resolve().parent.parent / "src" / "rosterd"

#: The new flavor's adapter module: argv, probes and memory estimate are all its own.
TINYSERVE_MODULE = '''"""The ``tinyserve`` flavor: a test's server of GGUF files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rosterd.adapters.base import HttpProbe, Launch, OpenAICompatible
from rosterd.memory.estimate import MemoryEstimate
from rosterd.model_facts import ModelFacts
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import WeightsSource


@dataclass(frozen=True, slots=True)
class TinyServeAdapter(OpenAICompatible):
    @property
    def flavor(self) -> InferFlavor:
        return InferFlavor.TINYSERVE

    @property
    def shared_server(self) -> None:
        return None

    @property
    def slot_keeping(self) -> None:
        return None

    def launch(self, spec: InferenceSpec, source: WeightsSource, *, host: str, port: int) -> Launch:
        served = spec.model or spec.role
        argv = ("tinyserve", "--model", str(source.path), "--port", str(port), "--name", served)
        return Launch(argv, host, port, HttpProbe("GET", "/health"), served)

    def estimate_memory(
        self,
        facts: ModelFacts,
        *,
        ctx_size: int,
        parallel: int,
        extra_args: Sequence[str],
        keep_kv: bool = True,
        cache_ram_mb: int | None = None,
    ) -> MemoryEstimate:
        return MemoryEstimate(
            weights_bytes=facts.file_bytes,
            kv_bytes=ctx_size * parallel * 1024,
            overhead_bytes=7 << 20,
            weights_note="tinyserve: the file",
            kv_note="tinyserve: 1 KiB a token",
            overhead_note="tinyserve: 7 MiB",
        )
'''

ROSTER = """\
roster:
  - id: tiny
    role: a test model
    name: tiny
    repo: local/tiny-GGUF
    ram_gb: 0.5
    backend: TinyServe (the test's server)
    port: 8399
"""

FLEET = """\
nodes:
  - name: box
    memory_gb: 4
    reserved_gb: 1
    platform: linux-x86_64
    flavors: [tinyserve]
models:
  tiny: tiny.gguf
"""

CHECK = """
import json, sys
from pathlib import Path
from rosterd.adapters import adapter_for
from rosterd.cli import main
from rosterd.fleet.reader import load_fleet
from rosterd.flavors import Platform
from rosterd.roster.importer import load_roster
from rosterd.spec import InferFlavor
from rosterd.weights import resolve_for_fleet

work = Path(sys.argv[1])
status = main(["plan", str(work / "roster.yaml"), "--fleet", str(work / "fleet.yaml"), "--json"])
roster, fleet = load_roster(work / "roster.yaml"), load_fleet(work / "fleet.yaml")
spec = roster.specs[0].spec
weights = resolve_for_fleet(spec, fleet)
launch = adapter_for(spec.flavor).launch(spec, weights, host="127.0.0.1", port=8399)
print(json.dumps({
    "status": status,
    "flavor": spec.flavor.id,
    "every_platform_runs_it": all(
        InferFlavor.TINYSERVE in p.supported_flavors() for p in Platform
    ),
    "argv": list(launch.argv),
}))
"""


def _insert_after(text: str, line: int, addition: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join([*lines[:line], addition, *lines[line:]])


def _add_tinyserve(package: Path) -> None:
    """Add the flavor to the package copy at ``package`` as a contributor would."""
    flavors = package / "flavors.py"
    text = flavors.read_text(encoding="utf-8")
    tree = ast.parse(text)
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InferFlavor")
    last_member = [n for n in enum.body if isinstance(n, ast.Assign)][-1]
    facts = next(
        n
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "FLAVOR_FACTS"
    )
    table = next(n for n in ast.walk(facts) if isinstance(n, ast.Dict))
    last_entry = table.values[-1]
    assert last_entry.end_lineno is not None
    assert last_member.end_lineno is not None
    text = _insert_after(
        text,
        last_entry.end_lineno,
        "        InferFlavor.TINYSERVE: FlavorFacts(roster_backends=('tinyserve',), "
        "platforms=frozenset(Platform), weights=WeightsKind.GGUF_FILE),\n",
    )
    text = _insert_after(text, last_member.end_lineno, '    TINYSERVE = "tinyserve"\n')
    flavors.write_text(text, encoding="utf-8")

    (package / "adapters" / "tinyserve.py").write_text(TINYSERVE_MODULE, encoding="utf-8")

    registry = package / "adapters" / "__init__.py"
    text = registry.read_text(encoding="utf-8")
    tree = ast.parse(text)
    adapters = next(
        n
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "ADAPTERS"
    )
    table = next(n for n in ast.walk(adapters) if isinstance(n, ast.Dict))
    assert table.values[-1].end_lineno is not None
    text = _insert_after(
        text, table.values[-1].end_lineno, "        InferFlavor.TINYSERVE: TinyServeAdapter,\n"
    )
    first_import = next(n for n in tree.body if isinstance(n, ast.ImportFrom))
    text = _insert_after(
        text, first_import.lineno, "from rosterd.adapters.tinyserve import TinyServeAdapter\n"
    )
    registry.write_text(text, encoding="utf-8")


def test_a_new_flavor_is_one_module_and_its_registry_lines(tmp_path: Path, tiny_gguf: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "rosterd", ignore=shutil.ignore_patterns("__pycache__"))
    _add_tinyserve(copy / "rosterd")
    work = tmp_path / "lab"
    work.mkdir()
    (work / "roster.yaml").write_text(ROSTER, encoding="utf-8")
    (work / "fleet.yaml").write_text(FLEET, encoding="utf-8")
    shutil.copy(tiny_gguf, work / "tiny.gguf")

    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    plan, checked = json.loads("\n".join(lines[:-1])), json.loads(lines[-1])
    assert checked["status"] == 0, done.stderr
    assert checked["flavor"] == "tinyserve"  # the roster's backend word, from its facts
    assert checked["every_platform_runs_it"]
    assert plan["placements"] == {"tiny": "box"}
    memory = plan["memory"]["tiny"]
    assert memory["estimate"]["overhead_bytes"] == 7 << 20  # the adapter's own estimate
    assert memory["estimate"]["kv_bytes"] == 4096 * 1 * 1024  # at rosterd's launch defaults
    assert checked["argv"][:3] == ["tinyserve", "--model", str(work / "tiny.gguf")]


def test_every_flavor_has_its_facts_and_the_fleet_schema_lists_them() -> None:
    """The facts table is whole, and the fleet file's JSON Schema (for editors) offers every
    flavor: a new flavor's author is told to add it there too."""
    assert set(FLAVOR_FACTS) == set(InferFlavor)
    schema = json.loads((SRC / "schemas" / "fleet.schema.json").read_text(encoding="utf-8"))
    flavors = next(
        node["flavors"]["items"]["enum"]
        for node in _walk(schema)
        if isinstance(node, dict) and "items" in node.get("flavors", {})
    )
    assert sorted(flavors) == sorted(f.id for f in InferFlavor)


def _walk(node: object) -> list[object]:
    found = [node]
    if isinstance(node, dict):
        for value in node.values():
            found += _walk(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk(value)
    return found


@pytest.mark.parametrize("flavor", list(InferFlavor))
def test_no_module_below_the_adapters_names_a_flavor(flavor: InferFlavor) -> None:
    """Only ``rosterd/flavors.py`` and the adapters name a flavor's member: elsewhere a
    flavor is asked for its facts or its adapter, never compared with one."""
    member = f"InferFlavor.{flavor.name}"
    named = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if path.name != "flavors.py"
        and "adapters" not in path.relative_to(SRC).parts
        and member in path.read_text(encoding="utf-8")
    ]
    assert not named, f"{member} is named outside rosterd/flavors.py and the adapters: {named}"
