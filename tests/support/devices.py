"""A declared GPU on a machine without one, for the tests of ``rosterd up`` that pin a
device (issue 29): a ``llama-server`` wrapper that stands in for a CUDA build, and the
roster, fleet and request those tests share (one node ``box`` declaring its GPUs, the
example's tiny models)."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx

from support.up import MODELS, write_box_fleet

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


def tiny_llama_entry(role: str, name: str) -> dict[str, object]:
    """A live llama.cpp roster entry ``role`` serving the example's tiny model ``name``
    (``tiny-a``, ``tiny-b``) with the roster's 0.1 GiB."""
    return {
        "id": role,
        "role": "test",
        "name": name,
        "repo": f"local/{name}",
        "ram_gb": 0.1,
        "backend": "llama.cpp",
        "status": "live",
    }


def tiny_model(name: str, **more: object) -> dict[str, object]:
    """The fleet's ``models:`` entry of the example's tiny model ``name``: its file, a
    256-token context, one slot, and ``more``."""
    return {"path": str(MODELS / f"{name}.gguf"), "ctx_size": 256, "parallel": 1, **more}


def gpu_box_fleet(path: Path, models: dict[str, dict[str, object]], *gpus_gb: float) -> Path:
    """A fleet file of one node ``box`` at ``127.0.0.1`` (4 GiB, 1 reserved) declaring one
    CUDA device per figure of ``gpus_gb`` (``CUDA0``, ``CUDA1``, ..., GiB each)."""
    devices: list[dict[str, object]] = [
        {"id": f"CUDA{index}", "memory_gb": gb} for index, gb in enumerate(gpus_gb)
    ]
    return write_box_fleet(path, models, address="127.0.0.1", devices=devices)


def chat(url: str, model: str, content: str = "hi", max_tokens: int = 4) -> httpx.Response:
    """One chat completion of ``model`` at the router ``url``, waiting up to 120 s (a load)."""
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        url + "/v1/chat/completions",
        json=body | {"max_tokens": max_tokens},
        timeout=120,
        trust_env=False,
    )
