"""The supervisor (DESIGN.md layer 5): backend processes and their lifecycle.

One ``Supervisor`` per node starts, watches, restarts and stops the backend
servers that adapters describe (``Launch``). Its parts, one concept each:

- ``process``: spawn from an argv (never a shell) in its own process group
  with a parent-death signal, stop a group SIGTERM -> grace -> SIGKILL, wait
  until it is gone, describe an exit, a log's tail or its latest run's output, a
  process tree's RSS;
- ``probes``: run an adapter's HTTP probe, wait for readiness, the readiness
  deadline that grows with the weights' size;
- ``logs``: a backend's output piped into its log file, rotated by size, read
  by a thread of its own so that a backend never blocks on rosterd;
- ``backend_http``: the HTTP client towards backends, made in one place;
- ``ports``: refuse a port another process listens on (naming it), pick a free one;
- ``run_records``: the state folder's lock, the ``run/<name>.json`` records
  and the reaping of an earlier run's leftovers (never anyone else's);
- ``lifecycle``: the ``Supervisor`` itself, its ``Backend`` snapshots and the
  ``BackendEvent``s it gives, restarts with capped exponential backoff;
- the plain values it gives (``BackendEvent``, ``EventKind``, ``ProbeResult``) are
  in :mod:`rosterd.backends.values`, re-exported here;
- its errors (``SupervisorError`` and subclasses) are in :mod:`rosterd.errors`,
  re-exported here.

Every name below is importable from ``rosterd.supervisor``.
"""

from __future__ import annotations

from rosterd.backends.values import BackendEvent, EventKind, ProbeResult
from rosterd.errors import (
    BackendAlreadySupervisedError,
    BackendNameError,
    BackendNotReadyError,
    BackendNotSupervisedError,
    BackendStartError,
    BackendStoppedError,
    PortInUseError,
    StateDirLockedError,
    SupervisorError,
)
from rosterd.supervisor.lifecycle import Backend, Supervisor, backoff_delay
from rosterd.supervisor.ports import check_port_free, free_port, port_holder
from rosterd.supervisor.probes import (
    READY_BASE_S,
    READY_FIRST_POLL_S,
    READY_MAX_S,
    READY_PER_GB_S,
    READY_POLL_S,
    ready_timeout_for,
    run_probe,
    wait_ready,
)
from rosterd.supervisor.process import (
    TAIL_LINES,
    describe_exit,
    latest_run_output,
    output_tail,
    process_tree_peak_rss_bytes,
    tree_rss_bytes,
)
from rosterd.supervisor.run_records import (
    StateDirLock,
    default_state_dir,
    lock_state_dir,
    reap_leftovers,
)

__all__ = [
    "READY_BASE_S",
    "READY_FIRST_POLL_S",
    "READY_MAX_S",
    "READY_PER_GB_S",
    "READY_POLL_S",
    "TAIL_LINES",
    "Backend",
    "BackendAlreadySupervisedError",
    "BackendEvent",
    "BackendNameError",
    "BackendNotReadyError",
    "BackendNotSupervisedError",
    "BackendStartError",
    "BackendStoppedError",
    "EventKind",
    "PortInUseError",
    "ProbeResult",
    "StateDirLock",
    "StateDirLockedError",
    "Supervisor",
    "SupervisorError",
    "backoff_delay",
    "check_port_free",
    "default_state_dir",
    "describe_exit",
    "free_port",
    "latest_run_output",
    "lock_state_dir",
    "output_tail",
    "port_holder",
    "process_tree_peak_rss_bytes",
    "ready_timeout_for",
    "reap_leftovers",
    "run_probe",
    "tree_rss_bytes",
    "wait_ready",
]
