"""The parser of ``llama-server --list-devices`` (layer 2: pure; text in, devices out).

llama.cpp prints the devices its build can offload to (``common/arg.cpp``,
``common_print_available_devices``), CPU devices left out::

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23664 MiB free)
      CUDA1: NVIDIA GeForce RTX 3090 (24135 MiB, 23700 MiB free)

or ``  (none)`` for a CPU-only build. Backend start-up lines (``ggml_cuda_init: ...``,
``ggml_vulkan: ...``) come before the block and sometimes inside it on stderr merged
into stdout (llama.cpp#17536 shows ``ggml_backend_cuda_get_available_uma_memory: ...``
between the header and the device); they are skipped. A build with
``--list-devices-format json`` (llama.cpp PR #23676) prints a JSON object with a
``devices`` list (``name``, ``description``, ``type``, ``memory_total``,
``memory_free`` in bytes); both forms are read.

Rules, each from a recorded output (``tests/data/list_devices/``):

- a device with no memory (``BLAS: Accelerate (0 MiB, 0 MiB free)`` on a Mac) holds no
  pool and is left out;
- ``RPC[host:port]`` devices are another machine's memory and are left out;
- a free figure above the total (llama.cpp#17536: a discrete RTX 5090 taken for unified
  memory reports the host's free RAM) is capped at the total;
- figures are MiB as printed (floored by llama.cpp), turned into bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

MiB: Final[int] = 1 << 20

#: ``  ID: DESCRIPTION (TOTAL MiB, FREE MiB free)``; the description may hold parentheses
#: (``llvmpipe (LLVM 17.0.6, 256 bits)``), so the figures are matched at the line's end.
_DEVICE_LINE: Final = re.compile(
    r"^\s+(?P<id>[A-Za-z][\w\[\].:-]*):\s+(?P<desc>.*?)\s*"
    r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$"
)


@dataclass(frozen=True, slots=True)
class ListedDevice:
    """One device as the backend lists it.

    ``id`` is llama.cpp's device name (``CUDA0``, ``ROCm0``, ``Vulkan0``, ``MTL0`` or
    ``Metal``), the name ``--device`` takes; ``description`` its model name;
    ``total_bytes`` and ``free_bytes`` its memory when listed (``free <= total``).
    """

    id: str
    description: str
    total_bytes: int
    free_bytes: int

    @property
    def kind(self) -> str:
        """The backend: the id without its trailing index (``CUDA0`` -> ``CUDA``)."""
        return self.id.rstrip("0123456789") or self.id


def parse_list_devices(text: str) -> tuple[ListedDevice, ...]:
    """The devices in ``llama-server --list-devices`` output (text or JSON form), in the
    order listed; empty for a CPU-only build or text with no device block.

    Never raises: lines that are not device lines are skipped (see the module doc).
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        return _parse_json(stripped)
    devices: list[ListedDevice] = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("Available devices:"):
            in_block = True
            continue
        if not in_block:
            continue
        match = _DEVICE_LINE.match(line)
        if match is None:
            continue
        device = _device(
            match["id"], match["desc"], int(match["total"]) * MiB, int(match["free"]) * MiB
        )
        if device is not None:
            devices.append(device)
    return tuple(devices)


def _device(ident: str, description: str, total: int, free: int) -> ListedDevice | None:
    if total <= 0 or ident.upper().startswith("RPC"):
        return None
    return ListedDevice(
        id=ident, description=description, total_bytes=total, free_bytes=min(max(free, 0), total)
    )


def _parse_json(text: str) -> tuple[ListedDevice, ...]:
    """The ``--list-devices-format json`` form (llama.cpp PR #23676); non-GPU and malformed
    entries are skipped."""
    try:
        data = json.loads(text)
    except ValueError:
        return ()
    entries = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return ()
    devices: list[ListedDevice] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("type", "GPU") == "CPU":
            continue
        ident, total, free = entry.get("name"), entry.get("memory_total"), entry.get("memory_free")
        if not isinstance(ident, str) or not isinstance(total, int) or not isinstance(free, int):
            continue
        description = entry.get("description")
        device = _device(ident, description if isinstance(description, str) else "", total, free)
        if device is not None:
            devices.append(device)
    return tuple(devices)
