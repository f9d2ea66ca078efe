"""The parser of what llama-server logs allocating per buffer as it loads (layer 2: pure; log
text in, bytes per pool out).

While it loads, every llama.cpp build names each buffer it allocates, its type and its size
in MiB (``%.2f``), one line each (upstream's ``LLAMA_LOG_INFO`` in ``src/llama-model.cpp``,
``src/llama-kv-cache.cpp``, ``src/llama-memory-recurrent.cpp`` and
``src/llama-context.cpp``)::

    load_tensors:        CUDA0 model buffer size =  5434.38 MiB
    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    llama_kv_cache:      ROCm0 KV buffer size =  4352.00 MiB
    llama_context:  CUDA_Host  output buffer size =     1.95 MiB
    sched_reserve:     Vulkan0 compute buffer size =  1174.00 MiB

Older builds print the model's buffers without the word ``model``
(``llm_load_tensors:      CUDA0 buffer size = ...``) and other function names
(``llama_kv_cache_init:``, ``llama_new_context_with_model:``); a line may carry a time
stamp, a level and colour codes before it. Builds whose common log shows libllama's
information at trace level (``common_log_default_callback``: verbosity 4) print these lines
only with ``-lv 4``, which rosterd passes to the llama-server of a role it pins to a device
(:func:`rosterd.adapters.llamacpp.pinned_args`).

Each buffer's pool is the device its type names: ``CUDA0``, ``ROCm0``, ``Vulkan0``,
``SYCL0``, ``MTL0`` (and ``MTL0_Mapped``, the GGUF mapped into Metal's working set; ``Metal``
and ``Metal_Mapped`` on older builds); a type of the host (``CPU``, ``CPU_Mapped``,
``CPU_REPACK``, ``AMX``, ``CUDA_Host``, any ``*_Host``) is the host's. This is the backend's
own report of what it allocated on each device (issue 29, item 4): it counts no GPU runtime
context (about 0.5 GiB per process on CUDA, llama.cpp PR #23137), which NVML's per-process
figure does. Every load in the text is summed, so a draft model's buffers add to the main
model's, as they do on the device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

MiB: Final[int] = 1 << 20

#: The pool of a buffer whose type is the host's (see the module docstring).
HOST: Final[str] = "host"

#: The kinds of buffer llama.cpp names before ``buffer size``: the model's weights, the KV
#: cache, a recurrent model's state (``RS``), the output logits and the compute graph.
BUFFER_KINDS: Final[tuple[str, ...]] = ("model", "KV", "RS", "output", "compute")

#: Terminal colour codes (llama.cpp colours its log on a terminal, ``--log-colors``).
_COLOUR: Final = re.compile(r"\x1b\[[0-9;]*m")
_LINE: Final = re.compile(
    r"(?:^|[\s:])(?P<type>[A-Za-z][\w]*)\s+(?:(?P<kind>" + "|".join(BUFFER_KINDS) + r")\s+)?"
    r"buffer size\s*=\s*(?P<mib>\d+(?:\.\d+)?)\s*MiB"
)
#: A device's buffer type: a backend's name and the device's index (``CUDA0``, ``ROCm1``),
#: with ``_Mapped`` for weights mapped from the file into the device's memory (Metal).
_DEVICE: Final = re.compile(r"(?P<device>(?!CPU)[A-Za-z]+\d+)(?:_Mapped)?")
_HOST_TYPES: Final = frozenset({"CPU", "AMX"})


@dataclass(frozen=True, slots=True)
class LoadBuffer:
    """One buffer llama-server logged allocating: its ``type`` (``CUDA0``, ``CPU_Mapped``),
    its ``kind`` (one of :data:`BUFFER_KINDS`; ``model`` for an older build's line without
    one) and its size in bytes (the MiB printed, rounded to a byte)."""

    type: str
    kind: str
    size_bytes: int

    @property
    def pool(self) -> str | None:
        """The pool this buffer's memory is in (:func:`pool_of_buffer`)."""
        return pool_of_buffer(self.type)


@dataclass(frozen=True, slots=True)
class LoadReport:
    """Every buffer one llama-server run logged as it loaded, in the order logged."""

    buffers: tuple[LoadBuffer, ...]

    def device_bytes(self) -> dict[str, int]:
        """Device id -> bytes allocated there (every kind); ``{}`` for a run on the host alone."""
        found: dict[str, int] = {}
        for buffer in self.buffers:
            pool = buffer.pool
            if pool is not None and pool != HOST:
                found[pool] = found.get(pool, 0) + buffer.size_bytes
        return found

    def host_bytes(self, *kinds: str) -> int:
        """Bytes allocated in the host's buffers, of ``kinds`` only where given (``"model"``,
        ``"KV"``, ...)."""
        return sum(
            b.size_bytes for b in self.buffers if b.pool == HOST and (not kinds or b.kind in kinds)
        )


def pool_of_buffer(buffer_type: str) -> str | None:
    """The pool of llama.cpp buffer type ``buffer_type``: :data:`HOST` for the host's
    (``CPU``, ``CPU_Mapped``, ``CPU_REPACK``, ``AMX``, ``*_Host``), the device id for a
    device's (``CUDA0``, ``ROCm0``, ``Vulkan0``, ``MTL0``; ``MTL0_Mapped`` is ``MTL0``;
    ``Metal``/``Metal_Mapped`` is ``Metal``, as older builds list the Mac's GPU), ``None``
    for one that is neither (a row split over devices, ``CUDA_Split``; a remote ``RPC``)."""
    host = buffer_type.startswith("CPU_") or buffer_type.endswith("_Host")
    if host or buffer_type in _HOST_TYPES:
        return HOST
    if buffer_type in ("Metal", "Metal_Mapped"):
        return "Metal"
    device = _DEVICE.fullmatch(buffer_type)
    return device["device"] if device is not None else None


def parse_load_report(text: str) -> LoadReport:
    """Every buffer llama-server logged allocating in ``text`` (its log, or one run's part
    of it), in order; an empty report when ``text`` has none (a build that logs them only
    at trace level, run without ``-lv 4``; another backend's log). Never raises."""
    buffers = []
    for line in _COLOUR.sub("", text).splitlines():
        match = _LINE.search(line)
        if match is not None:
            buffers.append(
                LoadBuffer(
                    type=match["type"],
                    kind=match["kind"] or "model",
                    size_bytes=round(float(match["mib"]) * MiB),
                )
            )
    return LoadReport(tuple(buffers))


def largest_per_device(
    *readings: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, int]]:
    """``readings`` of what roles hold per device (role -> device id -> bytes: NVML's
    per-process figure, the backend's own load report, ...) as one, the larger figure where
    two give one for the same role and device: each reading misses something (the load
    report a GPU runtime's context, NVML memory not yet touched), and the count follows
    the largest evidence (DESIGN.md, Memory)."""
    merged: dict[str, dict[str, int]] = {}
    for reading in readings:
        for role, devices in reading.items():
            held = merged.setdefault(role, {})
            for device, n_bytes in devices.items():
                held[device] = max(held.get(device, 0), n_bytes)
    return {role: held for role, held in merged.items() if held}
