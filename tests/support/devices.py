"""A declared GPU on a machine without one, for the tests of ``rosterd up`` that pin a
device (issue 29): a ``llama-server`` wrapper that stands in for a CUDA build."""

from __future__ import annotations

import stat
from pathlib import Path


def cuda_stand_in(tmp: Path, real: Path, argv_log: Path) -> Path:
    """A ``llama-server`` that logs its argv to ``argv_log`` and runs ``real`` with the
    pinned device replaced by ``none`` (it stands in for a CUDA build this machine lacks)."""
    script = tmp / "llama-server"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" >> '{argv_log}'\n"
        'args=("$@")\n'
        'for i in "${!args[@]}"; do\n'
        '  if [ "${args[$i]}" = "--device" ]; then args[$((i+1))]=none; fi\n'
        "done\n"
        f"exec '{real}' \"${{args[@]}}\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
