"""The fleet when no fleet file is given: this machine alone (layer 2; reads the machine).

Apart from the value types because it reads the machine (its OS and CPU from
:mod:`platform`, its memory from psutil, which gives it portably), and apart
from the file reader because no file is involved.
"""

from __future__ import annotations

import platform as _platform

import psutil

from rosterd.errors import FleetError
from rosterd.fleet.model import Fleet, Node, Platform, default_reserved_bytes


def detect_platform() -> Platform:
    """This machine's :class:`Platform` (from :mod:`platform`).

    Raises:
        FleetError: the OS/architecture is not one rosterd supports.
    """
    system = _platform.system().lower()
    machine = _platform.machine().lower()
    if system == "darwin" and machine in {"arm64", "aarch64"}:
        return Platform.MACOS_ARM64
    if system == "linux" and machine in {"x86_64", "amd64"}:
        return Platform.LINUX_X86_64
    if system == "linux" and machine in {"arm64", "aarch64"}:
        return Platform.LINUX_ARM64
    raise FleetError(
        f"this machine ({system} {machine}) is not a supported platform; "
        f"expected one of {', '.join(p.value for p in Platform)}; write a fleet file"
    )


def local_fleet() -> Fleet:
    """The fleet when no fleet file is given: this machine alone.

    One node ``local`` at 127.0.0.1 with total memory from psutil, the default reserve
    (:func:`default_reserved_bytes`), the detected platform and its default flavors;
    no ``models`` and no ``model_roots``.

    Raises:
        FleetError: unsupported platform.
    """
    memory = int(psutil.virtual_memory().total)
    plat = detect_platform()
    node = Node(
        name="local",
        memory_bytes=memory,
        reserved_bytes=default_reserved_bytes(memory),
        platform=plat,
        flavors=plat.supported_flavors(),
    )
    return Fleet(nodes=(node,))
