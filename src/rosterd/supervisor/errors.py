"""The supervisor's errors (DESIGN.md layer 5): each raised for one reason, named below.

::

    RosterdError                          (rosterd.errors)
    └── SupervisorError                   base only: never raised itself
        ├── BackendNameError              a backend name is not a plain token
        ├── BackendAlreadySupervisedError start() of a name that is already supervised
        ├── BackendNotSupervisedError     probe() of a name that is not supervised
        ├── BackendStartError             the process exited before it was ready
        │   ├── BackendNotReadyError      not ready before the deadline; it was killed
        │   └── BackendStoppedError       stop() came while it was still starting
        ├── PortInUseError                another process listens on the backend's port
        └── StateDirLockedError           another rosterd holds the state folder's lock

Every ``SupervisorError`` may carry ``client_message``: the short reason an
HTTP client may be told (no pids, command lines or paths).
"""

from __future__ import annotations

from pathlib import Path

from rosterd.errors import RosterdError


class SupervisorError(RosterdError):
    """Base of the supervisor's errors; catch it to handle any of them. Never raised itself.

    ``client_message``: the short reason an HTTP client may be told (no pids,
    command lines or paths), or ``None`` when the message's first line will do.
    """

    client_message: str | None = None


class BackendNameError(SupervisorError):
    """Raised by ``Supervisor.start`` when a backend name is not a plain token.

    The name becomes a log and a record file name, so it must be one (DESIGN.md:
    ids must be plain tokens before they name a file or process).
    """


class BackendAlreadySupervisedError(SupervisorError):
    """Raised by ``Supervisor.start`` for a name that is already supervised (stop it first)."""


class BackendNotSupervisedError(SupervisorError):
    """Raised by ``Supervisor.probe`` for a name that is not supervised."""


class BackendStartError(SupervisorError):
    """Raised when a backend's process exited (or was killed) before it became ready.

    Its subclasses are raised for the other ways a start ends without a ready
    backend. ``name`` is the backend, ``pid`` its process (gone by the time this
    is raised), ``exit_code`` its exit status (negative: killed by that signal;
    ``None``: still running when given up on), ``output_tail`` the last lines
    of its stdout/stderr, ``log_path`` its full log.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str,
        pid: int,
        exit_code: int | None,
        output_tail: tuple[str, ...],
        log_path: Path,
    ) -> None:
        self.name = name
        self.pid = pid
        self.exit_code = exit_code
        self.output_tail = output_tail
        self.log_path = log_path
        tail = "\n".join(f"  | {line}" for line in output_tail) or "  | (no output)"
        super().__init__(f"{message}\nlast lines of {log_path}:\n{tail}")


class BackendNotReadyError(BackendStartError):
    """Raised when a backend did not pass its readiness probe before the deadline; it was killed."""


class BackendStoppedError(BackendStartError):
    """Raised by a ``start`` that a ``stop`` of the same backend ended before it was ready."""


class PortInUseError(SupervisorError):
    """Raised when another process listens on the backend's port.

    ``host``/``port`` are the address; ``holder`` names the process
    (``pid 123 (llama-server)``) or is ``None`` when the OS does not tell us.
    """

    def __init__(self, host: str, port: int, holder: str | None) -> None:
        self.host = host
        self.port = port
        self.holder = holder
        who = f"by {holder}" if holder else "by another process (its owner is not visible)"
        self.client_message = (
            f"port {port} is in use by another process; stop it or give the role another port"
        )
        super().__init__(
            f"port {port} on {host} is already in use {who}; "
            "stop that process or give the role another port"
        )


class StateDirLockedError(SupervisorError):
    """Raised by ``lock_state_dir`` when another running rosterd holds the state folder's lock.

    ``lock_path`` is the lock file, ``owner_pid`` the pid written in it (``None``
    when it cannot be read).
    """

    def __init__(self, lock_path: Path, owner_pid: int | None) -> None:
        self.lock_path = lock_path
        self.owner_pid = owner_pid
        who = f"pid {owner_pid}" if owner_pid is not None else "a process whose pid is unknown"
        super().__init__(
            f"another rosterd ({who}) is running with the state folder {lock_path.parent}; "
            "stop it first, or give this one its own folder with --state-dir"
        )
