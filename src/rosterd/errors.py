"""The error tree (layer 1): every error rosterd raises is one of these, each for one reason.

::

    RosterdError                          base: any error rosterd reports to a person
    ├── SpecError                         an inference spec failed validation (the seed's text)
    ├── InputError                        a file given by the operator cannot be used as a whole
    │   ├── RosterError                   the roster or its overlay is rejected; nothing imported
    │   └── FleetError                    the fleet file is rejected
    ├── WeightsError                      a role's weights cannot be found or are not allowed
    ├── ModelFactsError                   a weights file or folder cannot be read as a model
    ├── MeasuredPeaksError                a measured peak cannot be stored in the state folder
    ├── AdapterError                      a role cannot be served by its flavor's adapter
    │   └── OllamaError                   the ollama server refused a load, unload or query
    ├── SupervisorError                   base only: a backend process could not be managed
    │   ├── BackendNameError              a backend name is not a plain token
    │   ├── BackendAlreadySupervisedError start() of a name that is already supervised
    │   ├── BackendNotSupervisedError     probe() of a name that is not supervised
    │   ├── BackendStartError             the process exited before it was ready
    │   │   ├── BackendNotReadyError      not ready before the deadline; it was killed
    │   │   └── BackendStoppedError       stop() came while it was still starting
    │   ├── PortInUseError                another process listens on the backend's port
    │   └── StateDirLockedError           another rosterd holds the state folder's lock
    ├── SchedulerError                    a request could not get its role (retry_after_s)
    │   ├── UnknownRoleError              the role is not placed on any node served here
    │   ├── QueueFullError                the role's queue is full (HTTP 429)
    │   ├── QueueTimeoutError             the request waited queue_timeout_s (HTTP 503)
    │   ├── RoleRefusedError              the residency policy refused the load; its reason
    │   ├── LoadFailedError               the backend failed to start, or its restart was given up
    │   ├── LoadBackoffError              its last loads failed: no new try until the backoff ends
    │   ├── RoleUnavailableError          the role cannot be served at all (weights missing)
    │   └── ShuttingDownError             rosterd is stopping
    ├── ConfigRefusedError                a configuration (the start's, a reload's) was refused
    │                                     whole: nothing serves it, or it would break what runs
    ├── ClusterError                      running the fleet on a Ray cluster failed
    │   ├── RayNotInstalledError          --ray-address without the ``ray`` extra
    │   ├── ClusterConnectError           the cluster cannot be joined
    │   └── NodeAgentError                a node agent failed (not a backend's failure)
    │       └── NodeLostError             a node's Ray node or its agent died
    ├── ClientGoneError                   the HTTP client left before its answer was complete
    ├── RouterError                       one OpenAI error answer (rosterd.router.openai_errors:
    │                                     it carries its row of the status/type/code table)
    └── NotRunningError                   no running ``rosterd up`` answers ps/load/unload

Where an error of a dependency crosses into rosterd it is mapped to one of these
once, at that boundary, with ``raise ... from exc`` (httpx errors in
``rosterd.router.openai_errors``; OS errors of processes in ``rosterd.supervisor``;
Ray's errors in ``rosterd.node_agent.map_ray_errors``).
``RouterError`` lives with the router's error table because its status, type and
code come from that table. The CLI turns a ``RosterdError`` into its message and
an exit status in one place (``rosterd.cli.edge``).

Internal exceptions never leave the module that raises them and are not part of
the tree: the roster reader's ``ReadError`` (``roster._serde_yaml``),
``YamlSyntaxError`` (``roster._yaml_nodes``) and ``LocatedError``
(``roster.document``) are turned into ``RosterError`` before the import returns.
"""

from __future__ import annotations

from pathlib import Path


class RosterdError(Exception):
    """Base of every error rosterd reports to a user: the message says what to fix."""


class SpecError(RosterdError):
    """An inference spec failed ``InferenceSpec.validate()``; the message is the seed's text."""


class InputError(RosterdError):
    """A file given by the operator cannot be used as a whole.

    Attributes give where: ``file`` (path or ``None`` for text given directly),
    ``path`` (field path such as ``roster[3].port``, or ``None``), ``line`` and
    ``column`` (1-based, or ``None``). ``str(err)`` is the full message naming
    all of them.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        path: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.path = path
        self.line = line
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.path:
            where += f": {self.path}"
        return f"{where}: {self.message}"

    def with_file(self, file: str) -> InputError:
        """A copy of this error that names ``file``."""
        return type(self)(
            self.message, file=file, path=self.path, line=self.line, column=self.column
        )


class RosterError(InputError):
    """The roster (or its overlay) is rejected as a whole; nothing is imported."""


class FleetError(InputError):
    """The fleet file is rejected as a whole."""


# ------------------------------------------------------------------ weights (layer 2)


class WeightsError(RosterdError):
    """A role's weights cannot be found or are not allowed; the message says where it looked."""


class ModelFactsError(RosterdError):
    """A weights file or folder cannot be read as a model; the message names it and says why."""


# ------------------------------------------------- measured peaks (layer 5)


class MeasuredPeaksError(RosterdError):
    """A measured peak cannot be stored (bad node or role name, or the folder is not writable)."""


# ----------------------------------------------------------------- adapters (layer 4)


class AdapterError(RosterdError):
    """A role cannot be served by its flavor's adapter; the message says why and what to fix."""


class OllamaError(AdapterError):
    """The ollama server refused or failed a load, unload or residency query."""


# --------------------------------------------------------------- supervisor (layer 5)


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


# ---------------------------------------------------------------- scheduler (layer 6)


class SchedulerError(RosterdError):
    """A request could not get its role; ``retry_after_s`` (seconds) when retrying may help."""

    retry_after_s: float | None = None

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class UnknownRoleError(SchedulerError):
    """The role is not placed on any node this process runs."""


class RoleMovedError(UnknownRoleError):
    """A re-plan moved the role to another node while the request waited for it here.

    ``Scheduler.acquire`` takes it and queues the request again on the role's new
    node within what is left of its queue timeout; it reaches a client (404, as
    ``UnknownRoleError``) only if the role moved away again and again.
    """


class QueueFullError(SchedulerError):
    """The role's queue holds ``max_queue`` waiters already (the router answers 429)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s)


class QueueTimeoutError(SchedulerError):
    """The request waited ``queue_timeout_s`` for its role (the router answers 503)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s)


class RoleRefusedError(SchedulerError):
    """The residency policy refused to load the role; the message is its reason."""


class LoadFailedError(SchedulerError):
    """The role's backend failed to start or become ready; the message says why."""


class LoadBackoffError(SchedulerError):
    """The role's last loads failed and the next try waits out a backoff (as crash restarts
    do); the message gives the last failure's short reason, ``retry_after_s`` the time left."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s)


class RoleUnavailableError(SchedulerError):
    """The role cannot be served at all (found at start, e.g. its weights are missing);
    no load is tried. The router answers 503 ``model_unavailable``."""


class ShuttingDownError(SchedulerError):
    """rosterd is stopping and takes no new requests."""


# ---------------------------------------------------- the fleet on Ray (layer 6)


class ConfigRefusedError(RosterdError):
    """A configuration was refused as a whole by the fleet scheduler (no node of it runs,
    it serves no role while roles are served, a role would lose usable weights, a node
    agent could not start); the configuration in force stays. The message says why."""


class ClusterError(RosterdError):
    """Running the fleet on a Ray cluster failed; the message says which node and why."""


class RayNotInstalledError(ClusterError):
    """``--ray-address`` was asked for but Ray (the ``ray`` extra) is not installed."""


class ClusterConnectError(ClusterError):
    """The Ray cluster at the given address cannot be joined (unreachable, refused, bad address)."""


class NodeAgentError(ClusterError):
    """A node agent failed in a way that is not a backend's failure (a fault in the agent,
    or Ray could not reach it for a moment). ``node`` names the fleet node."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.node, str(self)))


class NodeLostError(NodeAgentError):
    """A fleet node's Ray node died, or its agent did: nothing of that node runs any more."""


# ------------------------------------------------------------------- router (layer 7)


class ClientGoneError(RosterdError):
    """The client disconnected before its answer was complete (no answer is sent)."""


# ---------------------------------------------------------------------- cli (layer 8)


class NotRunningError(RosterdError):
    """No running ``rosterd up`` answers at the URL that ``ps``, ``load`` or ``unload`` was
    given (nothing listens, or what answers does not speak HTTP); exit status 3."""
