"""This machine's devices as its llama-server lists them (layer 5: runs one short process).

:func:`list_devices_text` runs ``llama-server --list-devices`` (argv only, no shell; a
few seconds at most: the backends initialise and print, nothing is loaded) and returns
what it printed, stdout and stderr together as llama.cpp mixes them, or ``None`` with
the reason when it could not run. :func:`probe_pools` turns that and NVML's reading into
the node's pools (:mod:`rosterd.devices.pools`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from rosterd.adapters.llamacpp import help_lists_fit
from rosterd.devices.listing import ListedDevice, parse_list_devices
from rosterd.devices.nvml import read_nvml
from rosterd.devices.pools import NodePools, node_pools
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
    node: Node, llama_server: Path | None, own_pids: frozenset[int] = frozenset()
) -> tuple[NodePools, tuple[str, ...]]:
    """``node``'s pools on this machine: its declared devices plus what ``llama_server``
    lists and NVML reads. Returns the pools and notes on probes that could not run
    (never raises for a missing binary, driver or GPU)."""
    notes: list[str] = []
    listed: tuple[ListedDevice, ...] = ()
    if llama_server is not None:
        text, why = list_devices_text(llama_server)
        if text is None:
            notes.append(why or "llama-server --list-devices did not run")
        else:
            listed = parse_list_devices(text)
    reading = read_nvml()
    return node_pools(node, listed, reading.devices, own_pids), tuple(notes)


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
