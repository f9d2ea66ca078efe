"""The error tree (layer 1): every error rosterd raises is one of these, each for one reason.

::

    RosterdError                          base only: any error rosterd reports to a person
    ├── SpecError                         an inference spec failed validation (the seed's text)
    ├── InputError                        a file given by the operator cannot be used as a whole
    │   ├── RosterError                   the roster or its overlay is rejected; nothing imported
    │   └── FleetError                    the fleet file is rejected
    ├── OptionError                       a command-line option or argument has no usable value
    ├── WeightsError                      a role's weights cannot be found or are not allowed
    ├── ModelFactsError                   a weights file or folder cannot be read as a model
    ├── MeasuredPeaksError                a measured peak cannot be stored in the state folder
    ├── AdapterError                      a role cannot be served by its flavor's adapter
    │   ├── OllamaError                   the ollama server refused a load, unload or query
    │   └── SlotFileError                 a backend refused or failed a KV cache save or restore
    ├── SupervisorError                   base only: a backend process could not be managed
    │   ├── BackendNameError              a backend name is not a plain token
    │   ├── BackendAlreadySupervisedError start() of a name that is already supervised
    │   ├── BackendNotSupervisedError     probe() of a name that is not supervised
    │   ├── BackendStartError             the process exited before it was ready
    │   │   ├── BackendNotReadyError      not ready before the deadline; it was killed
    │   │   └── BackendStoppedError       stop() came while it was still starting
    │   ├── PortInUseError                another process listens on the backend's port
    │   ├── StateDirLockedError           another rosterd holds the state folder's lock
    │   └── StateDirError                 the state folder or a file in it cannot be written
    ├── SchedulerError                    a request could not get its role (retry_after_s)
    │   ├── UnknownRoleError              the role is not placed on any node served here
    │   │   └── RoleMovedError            a re-plan moved it while the request waited (re-queued)
    │   ├── QueueFullError                the role's queue is full (HTTP 429)
    │   ├── QueueTimeoutError             the request waited queue_timeout_s (HTTP 503)
    │   ├── RoleRefusedError              the residency policy refused the load; its reason
    │   ├── LoadFailedError               the backend failed to start, or its restart was given up
    │   ├── LoadBackoffError              its last loads failed: no new try until the backoff ends
    │   ├── RoleUnavailableError          the role cannot be served at all (weights missing)
    │   └── ShuttingDownError             rosterd is stopping
    ├── ClusterError                      running the fleet on a Ray cluster failed
    │   ├── RayNotInstalledError          --ray-address without the ``ray`` extra
    │   ├── ClusterConnectError           the cluster cannot be joined
    │   └── NodeAgentError                a node agent failed (not a backend's failure)
    │       ├── NodeUnreachableError      a node agent did not answer: its node's verdict is Ray's
    │       └── NodeLostError             a node's Ray node or its agent died
    ├── CarriedError                      a node agent's error on its way to the head, kept whole
    ├── UpstreamError                     base only: a request to a backend failed (HTTP 502)
    │   ├── UpstreamConnectError          the backend could not be reached
    │   ├── UpstreamClosedError           it closed the connection before any byte of its answer
    │   ├── UpstreamTimeoutError          it sent nothing for the read timeout
    │   └── UpstreamProtocolError         its answer was not valid HTTP/1.1, or was cut mid-body
    ├── StalledError                      a backend sent no byte within a deadline (it is probed)
    ├── ClientGoneError                   the HTTP client left before its answer was complete
    ├── RouterError                       one error answer: its code's row of ``error_table``
    ├── ServeError                        base only: ``rosterd up`` cannot serve
    │   ├── ListenError                   the router cannot listen on its address
    │   ├── NothingToServeError           no node of the fleet runs here (or on the Ray cluster)
    │   ├── ReloadRefusedError            the fleet scheduler refused a configuration whole
    │   ├── SystemRefusedError            the OS refused a folder, file or program serving needs
    │   └── EndedBeforeServingError       the run ended before it served (run() raises why)
    └── ControlError                      base only: asking a running ``rosterd up`` failed
        ├── NotRunningError               no running ``rosterd up`` answers ps/load/unload
        ├── RequestRefusedError           it refused the request (HTTP 4xx/5xx; its message)
        └── AnswerError                   it answered, but not with the JSON asked for

A "base only" class is never raised itself: catch it to handle any of its kinds.
A dependency's error is mapped to one of these once, at its boundary, with ``raise
... from exc`` (the upstream connection's in ``rosterd.router.openai_errors``, OS
errors of processes in ``rosterd.supervisor``, Ray's in ``rosterd.node_agent``). The
CLI turns a ``RosterdError`` into its message and exit status in ``rosterd.cli.edge``.

Internal exceptions never leave the module that raises them and are not part of
the tree: the roster reader's ``ReadError`` (``roster._serde_yaml``),
``YamlSyntaxError`` (``roster._yaml_nodes``) and ``LocatedError``
(``roster.document``) are turned into ``RosterError`` before the import returns.
"""

from __future__ import annotations

from pathlib import Path

from rosterd.error_table import ERROR_KINDS, error_body, retry_after_header


class RosterdError(Exception):
    """Base of every error rosterd reports to a user: the message says what to fix.
    Never raised itself: each failure has its own type below."""


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


class OptionError(RosterdError):
    """A command-line option or argument (or the environment variable standing for one, such
    as ``ROSTERD_API_KEY``) has a value that cannot be used; the message names it and what
    is expected."""


class WeightsError(RosterdError):
    """A role's weights cannot be found or are not allowed; the message says where it looked."""


class ModelFactsError(RosterdError):
    """A weights file or folder cannot be read as a model; the message names it and says why."""


class MeasuredPeaksError(RosterdError):
    """A measured peak cannot be stored (bad node or role name, or the folder is not writable)."""


class AdapterError(RosterdError):
    """A role cannot be served by its flavor's adapter; the message says why and what to fix."""


class OllamaError(AdapterError):
    """The ollama server refused or failed a load, unload or residency query."""


class SlotFileError(AdapterError):
    """A backend refused or failed to save a slot's KV cache to a file, or to restore it."""


class SupervisorError(RosterdError):
    """Base of the supervisor's errors. ``client_message``: the short reason an HTTP client
    may be told (no pids, command lines or paths); ``None``: the message's first line."""

    client_message: str | None = None


class BackendNameError(SupervisorError):
    """Raised by ``Supervisor.start`` when a backend name is not a plain token (it names a log
    and a record file; DESIGN.md: ids are plain tokens before they name a file or process)."""


class BackendAlreadySupervisedError(SupervisorError):
    """Raised by ``Supervisor.start`` for a name that is already supervised (stop it first)."""


class BackendNotSupervisedError(SupervisorError):
    """Raised by ``Supervisor.probe`` for a name that is not supervised."""


class BackendStartError(SupervisorError):
    """Raised when a backend's process exited (or was killed) before it became ready; its
    subclasses for the other ways a start ends without a ready backend.

    ``name`` is the backend, ``pid`` its process (gone by now), ``exit_code`` its exit
    status (negative: killed by that signal; ``None``: still running when given up on),
    ``output_tail`` the last lines of its stdout/stderr, ``log_path`` its full log.
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
    """Raised when another process listens on the backend's port (``host``/``port``);
    ``holder`` names it (``pid 123 (llama-server)``), ``None`` when the OS does not tell."""

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
    """Raised by ``lock_state_dir`` when another running rosterd holds the state folder's lock:
    ``lock_path`` is the lock file, ``owner_pid`` the pid in it (``None``: unreadable)."""

    def __init__(self, lock_path: Path, owner_pid: int | None) -> None:
        self.lock_path = lock_path
        self.owner_pid = owner_pid
        who = f"pid {owner_pid}" if owner_pid is not None else "a process whose pid is unknown"
        super().__init__(
            f"another rosterd ({who}) is running with the state folder {lock_path.parent}; "
            "stop it first, or give this one its own folder with --state-dir"
        )


class StateDirError(SupervisorError):
    """The state folder, or a file in it (its lock, a backend's log), cannot be created or
    written; the message is the OS's reason and the path."""


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
    ``NodeDirectory.acquire`` queues the request again on the new node within what is left of
    its queue timeout; a client sees it (404) only if the role moved again and again."""


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


class NodeUnreachableError(NodeAgentError):
    """A node agent did not answer a call (unreachable, or past the call's bound): not a
    backend's failure; whether the node is lost is Ray's to say (its node-death signal)."""


class NodeLostError(NodeAgentError):
    """A fleet node's Ray node died, or its agent did: nothing of that node runs any more."""


class CarriedError(RosterdError):
    """A rosterd error on its way from a node agent to the head over Ray, kept whole: plain
    exception pickling loses keyword arguments, so this carries the class, ``args`` and
    attributes, and :meth:`unwrap` rebuilds it. Only ``map_ray_errors`` sees it."""

    def __init__(self, error: RosterdError) -> None:
        super().__init__(str(error))
        self.error_type = type(error)
        self.error_args = error.args
        self.error_state = dict(vars(error))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_carried, (self.error_type, self.error_args, self.error_state))

    def unwrap(self) -> RosterdError:
        """The carried error: the same class, ``args`` and attributes."""
        error = self.error_type.__new__(self.error_type)
        error.args = self.error_args
        error.__dict__.update(self.error_state)
        return error


def _rebuild_carried(
    error_type: type[RosterdError], args: tuple[object, ...], state: dict[str, object]
) -> CarriedError:
    carried = CarriedError.__new__(CarriedError)
    RosterdError.__init__(carried, *args)
    carried.error_type, carried.error_args, carried.error_state = error_type, args, state
    return carried


class UpstreamError(RosterdError):
    """Base of the failures of a request to a backend (the router answers 502 ``backend_error``)."""


class UpstreamConnectError(UpstreamError):
    """The backend could not be reached (refused, unreachable, connect timeout)."""


class UpstreamClosedError(UpstreamError):
    """The backend closed or reset the connection before any byte of its answer."""


class UpstreamTimeoutError(UpstreamError):
    """The backend sent nothing for the read timeout."""


class UpstreamProtocolError(UpstreamError):
    """The backend's answer was not valid HTTP/1.1, or it was cut mid-body."""


class StalledError(RosterdError):
    """The backend produced no byte within a deadline; ``first_byte``: none at all yet.
    ``waited_s``: the deadline that passed, seconds."""

    def __init__(self, message: str, *, first_byte: bool, waited_s: float) -> None:
        super().__init__(message)
        self.first_byte = first_byte
        self.waited_s = waited_s


class ClientGoneError(RosterdError):
    """The client disconnected before its answer was complete (no answer is sent)."""


class RouterError(RosterdError):
    """One error answer: ``code`` (a key of ``rosterd.error_table.ERROR_KINDS``), ``message``.

    ``retry_after_s`` (seconds) overrides the table's default ``Retry-After`` when given;
    ``status``, ``err_type`` and ``headers()`` come from the table. A code missing from
    the table raises ``KeyError`` (a bug, not a request's fault).
    """

    def __init__(self, code: str, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = ERROR_KINDS[code]
        self.code = code
        self.message = message
        self.retry_after_s = self.kind.retry_after_s if retry_after_s is None else retry_after_s

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.kind.status

    @property
    def err_type(self) -> str:
        """The OpenAI error type."""
        return self.kind.type

    def headers(self) -> dict[str, str]:
        """The answer's extra headers: the table's, ``Retry-After`` when there is one, and
        ``X-Rosterd-Error``, rosterd's own code whatever the path's envelope calls it (the
        access log's ``code``)."""
        headers = dict(self.kind.headers)
        headers["X-Rosterd-Error"] = self.code
        if self.retry_after_s is not None:
            headers["Retry-After"] = retry_after_header(self.retry_after_s)
        return headers

    def body(self) -> dict[str, object]:
        """The OpenAI error body of this error."""
        return error_body(self.message, self.err_type, self.code)


class ServeError(RosterdError):
    """Base of why ``rosterd up`` cannot serve (or serve a reloaded configuration)."""


class ListenError(ServeError):
    """The router cannot listen on its address (the port is taken, the host is not here)."""


class NothingToServeError(ServeError):
    """No node of the fleet is this machine, nor (``--ray-address``) on the Ray cluster."""


class ReloadRefusedError(ServeError):
    """The fleet scheduler refused a configuration as a whole (a role would lose usable
    weights, it serves no role while roles are served, a node agent could not start, a
    node on Ray got a new address); the message says why; the running one stays."""


class SystemRefusedError(ServeError):
    """The operating system refused what serving needs (a folder, a file, a program to run);
    the message is its reason and the path."""


class EndedBeforeServingError(ServeError):
    """The run ended before its router listened (``UpRun.serving``; ``UpRun.run`` raises why)."""


class ControlError(RosterdError):
    """Base of why a command asking a running ``rosterd up`` got no usable answer."""


class NotRunningError(ControlError):
    """No running ``rosterd up`` answers at the URL that ``ps``, ``load`` or ``unload`` was
    given (nothing listens, or what answers does not speak HTTP); exit status 3."""


class RequestRefusedError(ControlError):
    """The running ``rosterd up`` refused the request: ``status`` its HTTP status (4xx, 5xx),
    the message its error message after the status."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class AnswerError(ControlError):
    """The running ``rosterd up`` answered, but not with the JSON the command asked for."""
