"""A declared GPU on a machine without one, for the tests of ``rosterd up`` that pin a
device (issue 29): a ``llama-server`` wrapper that stands in for a CUDA build."""

from __future__ import annotations

import stat
from pathlib import Path

#: What the stand-in CUDA build lists (``--list-devices``): one 24 GiB GPU, all of it free.
STAND_IN_LISTING = "Available devices:\n  CUDA0: Stand-in GPU (24576 MiB, 24576 MiB free)\n"


def cuda_stand_in(
    tmp: Path, real: Path, argv_log: Path, listing: str | None = STAND_IN_LISTING
) -> Path:
    """A ``llama-server`` that logs its argv to ``argv_log`` and runs ``real`` with the
    pinned device replaced by ``none`` (it stands in for a CUDA build this machine lacks);
    ``--list-devices`` prints ``listing``: by default one GPU, ``CUDA0``, as such a build
    would; ``None``: what ``real`` lists (here, no device)."""
    listed = (
        ""
        if listing is None
        else f"if [ \"$1\" = \"--list-devices\" ]; then printf '%s' '{listing}'; exit 0; fi\n"
    )
    script = tmp / "llama-server"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"printf '%s\\n' \"$*\" >> '{argv_log}'\n"
        f"{listed}"
        'args=("$@")\n'
        'for i in "${!args[@]}"; do\n'
        '  if [ "${args[$i]}" = "--device" ]; then args[$((i+1))]=none; fi\n'
        "done\n"
        f"exec '{real}' \"${{args[@]}}\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def logging_gpu_stand_in(tmp: Path, real: Path, argv_log: Path, load_lines: str) -> Path:
    """:func:`cuda_stand_in` that first logs ``load_lines`` when it serves a model (``-m``):
    what a GPU build logs allocating on its device as it loads, which this machine's build,
    allocating on none, cannot log itself."""
    inner = cuda_stand_in(tmp, real, argv_log)
    script = tmp / "llama-server-gpu"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'case " $* " in *" -m "*) cat <<\'EOF\'\n'
        f"{load_lines.rstrip()}\n"
        "EOF\n"
        ";; esac\n"
        f"exec '{inner}' \"$@\"\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script
