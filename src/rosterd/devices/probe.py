"""This machine's devices as its llama-server lists them (layer 5: runs one short process).

:func:`list_devices_text` runs ``llama-server --list-devices`` (argv only, no shell; a
few seconds at most: the backends initialise and print, nothing is loaded) and returns
what it printed, stdout and stderr together as llama.cpp mixes them, or ``None`` with
the reason when it could not run. :func:`probe_pools` turns that and NVML's reading into
the node's pools (:mod:`rosterd.devices.pools`). :func:`probe_node` is how a node agent
probes the node it runs on: the same probes, run where ``rosterd up`` would run them for a
node of its own machine (a declared device, or an NVIDIA GPU NVML finds).
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

from rosterd.adapters.llamacpp import find_llama_server, help_lists_fit
from rosterd.devices.listing import ListedDevice, parse_list_devices
from rosterd.devices.nvml import NvmlReading, read_nvml
from rosterd.devices.pools import NodePools, node_pools
from rosterd.errors import AdapterError
from rosterd.fleet.model import Node

#: Seconds ``--list-devices`` may take: CUDA's initialisation takes a second or two.
LIST_DEVICES_TIMEOUT_S: float = 30.0


def list_devices_text(
    llama_server: Path, timeout_s: float = LIST_DEVICES_TIMEOUT_S
) -> tuple[str | None, str | None]:
    """``(output, None)`` from ``llama_server --list-devices``, or ``(None, reason)`` when it
    could not run, timed out or failed."""
    try:
        done = subprocess.run(
            [str(llama_server), "--list-devices"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{llama_server} --list-devices did not run: {err}"
    if done.returncode != 0:
        return None, f"{llama_server} --list-devices exited with {done.returncode}"
    return done.stdout + done.stderr, None


def probe_pools(
    node: Node,
    llama_server: Path | None,
    own_pids: frozenset[int] = frozenset(),
    nvml: NvmlReading | None = None,
) -> tuple[NodePools, tuple[str, ...]]:
    """``node``'s pools on this machine: its declared devices plus what ``llama_server``
    lists and NVML reads (``nvml``: a reading already taken; ``None``: read now). Returns
    the pools and notes on probes that could not run (never raises for a missing binary,
    driver or GPU)."""
    notes: list[str] = []
    listed: tuple[ListedDevice, ...] = ()
    listing_ran = False
    if llama_server is not None:
        text, why = list_devices_text(llama_server)
        if text is None:
            notes.append(why or "llama-server --list-devices did not run")
        else:
            listed, listing_ran = parse_list_devices(text), True
    reading = read_nvml() if nvml is None else nvml
    pools = node_pools(node, listed, reading.devices, own_pids, listing_ran=listing_ran)
    return pools, tuple(notes)


def probe_node(
    node: Node, own_pids: frozenset[int] = frozenset()
) -> tuple[NodePools, tuple[str, ...]]:
    """``node``'s pools probed on this machine, the one it runs on (blocking: a few seconds
    at most), as ``rosterd up`` probes its own machine's nodes: only where ``node`` declares
    a device or NVML finds a GPU (else host RAM alone, without running llama-server), with
    this machine's ``llama-server`` (``find_llama_server``; none: NVML and the declaration
    alone). ``own_pids``: rosterd's backends on this machine (what they hold on a GPU is
    not others'). Returns the pools (with one warning per declared device no probe saw)
    and, where ``node`` declares devices, why a probe could not run. Never raises for a
    missing binary, driver or GPU."""
    reading = read_nvml()
    if not node.devices and not reading.devices:
        return node_pools(node, probed=False), ()
    binary = None
    with contextlib.suppress(AdapterError):  # no llama.cpp here: NVML, the fleet file
        binary = find_llama_server()
    found, notes = probe_pools(node, binary, own_pids, reading)
    return found, notes if node.devices else ()


def server_lists_fit(llama_server: Path, timeout_s: float = LIST_DEVICES_TIMEOUT_S) -> bool:
    """Whether ``llama_server --help`` lists ``--fit`` (``help_lists_fit``); ``False`` when it
    does not run, so no ``--fit off`` is passed to a build that may not know the flag."""
    try:
        done = subprocess.run(
            [str(llama_server), "--help"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return help_lists_fit(done.stdout + done.stderr)
