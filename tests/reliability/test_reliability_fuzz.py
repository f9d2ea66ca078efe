"""Coverage-guided fuzzing (atheris) of the roster, overlay and fleet readers and the router's
body parsing: every input is accepted or refused with one of rosterd's own errors.

Each target of tests/support/fuzz_targets.py runs in its own process (libFuzzer exits the
process when its runs are done) for ``Budget.fuzz_inputs`` inputs, seeded with
the example lab's files and a chat request; a crash is any other exception, and
libFuzzer saves the input that raised it under the test's temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.reliability import HERE, budget, print_figures

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

EXAMPLES = HERE.parents[1] / "examples"
SEEDS: dict[str, list[Path]] = {
    "roster": [EXAMPLES / "roster.yaml"],
    "overlay": [EXAMPLES / "overlay.yaml"],
    "fleet": [EXAMPLES / "fleet.yaml"],
    "body": [],
}
BODY_SEED = (
    b'\x00\x10\x01{"model": "chat", "messages": [{"role": "user", "content": "hi"}], '
    b'"stream": true, "max_tokens": 8, "temperature": 0.5}'
)


@pytest.mark.parametrize("target", sorted(SEEDS))
def test_fuzzed_input_raises_only_rosterd_errors(
    target: str, tmp_path: Path, long_reliability: bool
) -> None:
    runs = budget(long_reliability).fuzz_inputs
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for seed in SEEDS[target]:
        shutil.copy(seed, corpus / seed.name)
    (corpus / "request.json").write_bytes(BODY_SEED)
    argv = [sys.executable, str(HERE / "fuzz_targets.py"), target, str(corpus)]
    argv += [f"-runs={runs}", "-max_len=8192", f"-artifact_prefix={tmp_path}/", "-timeout=20"]
    if not long_reliability:
        # CI's bounded run is the same every time; the long run explores from a new seed.
        argv.append("-seed=1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1] / "src"), str(HERE)]))
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60 + runs / 100, env=env, check=False
    )
    tried = re.search(r"Done (\d+) runs", done.stderr)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash", "timeout")))
    print_figures(
        f"fuzz {target}",
        {"inputs_tried": tried.group(1) if tried else 0, "crashes": len(crashes)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert not crashes
    assert tried is not None
    assert int(tried.group(1)) >= runs
