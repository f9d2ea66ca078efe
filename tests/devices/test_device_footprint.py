"""A process's physical footprint on macOS (``proc_pid_rusage``, ``rusage_info_v4``). This
machine is not a Mac: a stand-in for libproc's ``proc_pid_rusage`` fills the struct as the
macOS kernel does, at the offsets of Apple's ``<sys/resource.h>``; on Linux the real reader
reads nothing and raises nothing."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

import pytest

from rosterd.devices.footprint import (
    RUSAGE_INFO_V4,
    RusageInfoV4,
    footprints_by_roles,
    read_phys_footprints,
)

GiB = 1 << 30
#: Apple's struct rusage_info_v4 (xnu bsd/sys/resource.h): a 16-byte UUID, then uint64_t
#: fields; ri_resident_size is the 7th (index 6), ri_phys_footprint the 8th,
#: ri_lifetime_max_phys_footprint the 29th; 35 of them.
RESIDENT_AT = 16 + 6 * 8
FOOTPRINT_AT = 16 + 7 * 8
LIFETIME_MAX_AT = 16 + 28 * 8


class _MacKernel:
    """Stands in for macOS's ``proc_pid_rusage`` (this machine is Linux): writes each known
    pid's figures into the caller's buffer by byte offset, as the kernel does, and fails
    (-1) for a pid it does not know (a process gone, or another user's)."""

    def __init__(self, footprints: Mapping[int, int], resident: Mapping[int, int]) -> None:
        self.footprints = footprints
        self.resident = resident
        self.flavors: list[int] = []

    def __call__(self, pid: int, flavor: int, buffer: ctypes._Pointer[RusageInfoV4], /) -> int:
        self.flavors.append(flavor)
        if pid not in self.footprints:
            return -1
        base = ctypes.addressof(buffer.contents)
        for offset, value in (
            (RESIDENT_AT, self.resident[pid]),
            (FOOTPRINT_AT, self.footprints[pid]),
            (LIFETIME_MAX_AT, self.footprints[pid] + GiB),
        ):
            ctypes.c_uint64.from_address(base + offset).value = value
        return 0


def test_the_struct_is_laid_out_as_apples_header() -> None:
    assert ctypes.sizeof(RusageInfoV4) == 16 + 35 * 8
    assert RusageInfoV4.ri_resident_size.offset == RESIDENT_AT
    assert RusageInfoV4.ri_phys_footprint.offset == FOOTPRINT_AT
    assert RusageInfoV4.ri_lifetime_max_phys_footprint.offset == LIFETIME_MAX_AT
    assert RUSAGE_INFO_V4 == 4


def test_the_footprint_of_each_readable_pid_is_read_and_metals_memory_counts() -> None:
    # mlx_lm.server (pid 501): 9 GiB wired by Metal that its RSS (1 GiB) misses.
    kernel = _MacKernel({501: 10 * GiB, 502: 3 * GiB}, {501: 1 * GiB, 502: 2 * GiB})
    found = read_phys_footprints([501, 502, 999], kernel)
    assert found == {501: 10 * GiB, 502: 3 * GiB}  # 999: gone, left out
    assert kernel.flavors == [RUSAGE_INFO_V4] * 3


def test_a_call_that_raises_leaves_the_pid_out_and_the_rest_read() -> None:
    kernel = _MacKernel({501: 10 * GiB}, {501: 1 * GiB})

    def flaky(pid: int, flavor: int, buffer: ctypes._Pointer[RusageInfoV4], /) -> int:
        if pid == 7:
            raise OSError("the library went away")
        return kernel(pid, flavor, buffer)

    assert read_phys_footprints([7, 501], flaky) == {501: 10 * GiB}


def test_footprints_go_to_the_roles_whose_backends_they_are() -> None:
    held = footprints_by_roles({501: 10 * GiB, 7: 1 * GiB}, {"writer": 501, "chat": 502}, "MTL0")
    assert held == {"writer": {"MTL0": 10 * GiB}}  # chat's pid: no figure; 7: nobody's


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS the real reader reads")
def test_off_macos_the_real_reader_reads_nothing_and_never_raises() -> None:
    assert read_phys_footprints([os.getpid()]) == {}
    assert read_phys_footprints([]) == {}
