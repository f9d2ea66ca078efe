"""The error tree (layer 1). Every error a user can cause is a ``RosterdError``.

The CLI turns these into a message and exit code 2; nothing else reaches the
user as a traceback.
"""

from __future__ import annotations


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
