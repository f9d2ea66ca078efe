"""The Ray path's install lines, as the guide (docs/ray.md) says them: rosterd is not on PyPI, so
the guide installs the ``ray`` extra from a checkout (``pip install '.[ray]'``) or from a wheel it
builds with a documented command. This test runs that build command on this checkout and
checks that the wheel is whole (the schemas and the page's files inside) and declares the
``ray`` extra, and that no line of the guide installs ``rosterd[ray]`` from the index.
The build fetches its backend (hatchling) as ``scripts/setup``'s install does.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The guide's page on the fleet on Ray, where the install lines are.
README = (ROOT / "docs" / "ray.md").read_text(encoding="utf-8")

#: The README's wheel build, as a user types it (``python3 -m pip wheel ...``).
BUILD = re.compile(r"^python3 -m pip wheel (?P<args>.+?)\s*(?:#.*)?$", re.MULTILINE)


def test_the_readme_never_installs_rosterd_from_the_package_index() -> None:
    assert "pip install 'rosterd[ray]'" not in README
    assert "python3 -m pip install '.[ray]'" in README  # from a checkout
    assert re.search(r"python3 -m pip install 'dist/rosterd-[^']+\.whl\[ray\]'", README)


@pytest.mark.slow
def test_the_readmes_wheel_build_makes_a_whole_wheel_with_the_ray_extra(tmp_path: Path) -> None:
    found = BUILD.search(README)
    assert found is not None, "README gives no wheel build command"
    args = shlex.split(found["args"])
    assert args[-1] == ".", args  # built from the checkout it is run in
    out = tmp_path / "dist"
    args = [a if a != "dist" else str(out) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("rosterd-*.whl")
    assert re.search(rf"dist/{re.escape(wheel.name.split('-')[0])}-", README)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    assert "Provides-Extra: ray" in text, text
    assert re.search(r"^Requires-Dist: ray>=[\d.]+; extra == 'ray'$", text, re.MULTILINE), text
    assert "rosterd/schemas/fleet.schema.json" in names
    assert any(n.startswith("rosterd/router/static/") for n in names), sorted(names)
