"""A process's physical footprint on macOS, read with libproc's ``proc_pid_rusage`` through
``ctypes`` (layer 2: reading is the only I/O).

On a Mac, peak RSS misses the memory Metal wires for a process's GPU buffers (an
``mlx_lm.server``'s arrays, llama-server's Metal buffers), and that memory is what a Mac's
GPU share holds (issue 29). macOS keeps a ledger per process of the memory charged to it,
Metal's included: its *physical footprint* (``phys_footprint``, what Activity Monitor
shows as "Memory"). :func:`read_phys_footprints` reads it per pid as
``rusage_info_v4.ri_phys_footprint`` (``proc_pid_rusage(pid, RUSAGE_INFO_V4, &info)``;
psutil does not give it). The struct's layout is Apple's ``<sys/resource.h>``
(apple-oss-distributions/xnu ``bsd/sys/resource.h``: ``struct rusage_info_v4``, a 16-byte
UUID then 35 ``uint64_t`` fields; ``RUSAGE_INFO_V4`` is 4); the function is declared in
``<libproc.h>`` and exported by libSystem. The current figure is read, not
``ri_lifetime_max_phys_footprint``: it is followed live, every few seconds, as NVML's
per-process figure is on a GPU.

Anywhere but macOS, or where the library or the call fails (a process gone, another
user's), a pid has no figure: the reader returns what it could read and never raises.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterable, Mapping
from typing import Final, Protocol

#: ``proc_pid_rusage``'s flavor for ``struct rusage_info_v4`` (``<sys/resource.h>``).
RUSAGE_INFO_V4: Final = 4

#: Where libproc's ``proc_pid_rusage`` is exported on macOS, tried in order.
_LIBRARIES: Final = ("/usr/lib/libSystem.B.dylib", "/usr/lib/libproc.dylib")

#: ``struct rusage_info_v4``'s ``uint64_t`` fields after ``ri_uuid``, in Apple's order
#: (xnu ``bsd/sys/resource.h``): v0's ten, v1's six, v2's two, v3's nine, v4's eight.
_V4_FIELDS: Final = (
    "ri_user_time",
    "ri_system_time",
    "ri_pkg_idle_wkups",
    "ri_interrupt_wkups",
    "ri_pageins",
    "ri_wired_size",
    "ri_resident_size",
    "ri_phys_footprint",
    "ri_proc_start_abstime",
    "ri_proc_exit_abstime",
    "ri_child_user_time",
    "ri_child_system_time",
    "ri_child_pkg_idle_wkups",
    "ri_child_interrupt_wkups",
    "ri_child_pageins",
    "ri_child_elapsed_abstime",
    "ri_diskio_bytesread",
    "ri_diskio_byteswritten",
    "ri_cpu_time_qos_default",
    "ri_cpu_time_qos_maintenance",
    "ri_cpu_time_qos_background",
    "ri_cpu_time_qos_utility",
    "ri_cpu_time_qos_legacy",
    "ri_cpu_time_qos_user_initiated",
    "ri_cpu_time_qos_user_interactive",
    "ri_billed_system_time",
    "ri_serviced_system_time",
    "ri_logical_writes",
    "ri_lifetime_max_phys_footprint",
    "ri_instructions",
    "ri_cycles",
    "ri_billed_energy",
    "ri_serviced_energy",
    "ri_interval_max_phys_footprint",
    "ri_runnable_time",
)


class RusageInfoV4(ctypes.Structure):
    """Apple's ``struct rusage_info_v4`` (296 bytes): ``ri_uuid`` (16 bytes), then the
    ``uint64_t`` fields of :data:`_V4_FIELDS`; memory fields in bytes."""

    _fields_ = [("ri_uuid", ctypes.c_uint8 * 16), *((name, ctypes.c_uint64) for name in _V4_FIELDS)]


class ProcPidRusage(Protocol):
    """``int proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer)``: fills ``buffer``
    with the ``flavor`` struct of ``pid``'s usage, returns 0, or -1 (``errno`` set) when
    the process is gone or not the caller's to read."""

    def __call__(self, pid: int, flavor: int, buffer: ctypes._Pointer[RusageInfoV4], /) -> int:
        """Fill ``buffer``; 0 on success."""
        ...


def read_phys_footprints(
    pids: Iterable[int], proc_pid_rusage: ProcPidRusage | None = None
) -> dict[int, int]:
    """Pid -> its physical footprint in bytes (``ri_phys_footprint``), for each of ``pids``
    the call could read; ``{}`` anywhere but macOS. ``proc_pid_rusage``: the call to use
    (``None``: libproc's, loaded on macOS; tests pass a stand-in). Never raises."""
    call = proc_pid_rusage if proc_pid_rusage is not None else _libproc_call()
    if call is None:
        return {}
    found: dict[int, int] = {}
    for pid in pids:
        info = RusageInfoV4()
        with contextlib.suppress(OSError, ctypes.ArgumentError, OverflowError):
            if call(pid, RUSAGE_INFO_V4, ctypes.pointer(info)) == 0:
                found[pid] = int(info.ri_phys_footprint)
    return found


def footprints_by_roles(
    footprints: Mapping[int, int], pids: Mapping[str, int], device: str
) -> dict[str, dict[str, int]]:
    """Role -> ``{device: bytes}``: each role's backend's footprint (``footprints``: pid ->
    bytes, :func:`read_phys_footprints`; ``pids``: role -> its backend's pid) counted on
    ``device``, the Mac's GPU share. A role whose pid has no figure is left out."""
    return {role: {device: footprints[pid]} for role, pid in pids.items() if pid in footprints}


def _libproc_call() -> ProcPidRusage | None:
    """libproc's ``proc_pid_rusage`` on macOS, typed for :class:`RusageInfoV4`; ``None``
    elsewhere, or where no library exports it."""
    if sys.platform != "darwin":
        return None
    for path in _LIBRARIES:
        try:
            call = ctypes.CDLL(path, use_errno=True).proc_pid_rusage
        except (OSError, AttributeError):
            continue
        call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(RusageInfoV4)]
        call.restype = ctypes.c_int
        found: ProcPidRusage = call
        return found
    return None
