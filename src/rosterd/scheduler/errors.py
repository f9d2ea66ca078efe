"""The scheduler's errors (DESIGN.md layer 6): why a request could not get its role.

::

    RosterdError
    └── SchedulerError            (retry_after_s: seconds, when retrying may help)
        ├── UnknownRoleError      the role is not placed on any node served here
        ├── QueueFullError        the role's queue is full (the router answers 429)
        ├── QueueTimeoutError     the request waited queue_timeout_s (503)
        ├── RoleRefusedError      the residency policy refused the load; its reason
        ├── LoadFailedError       the backend failed to start or its restart was given up
        ├── LoadBackoffError      its last loads failed: no new try until the backoff ends (503)
        ├── RoleUnavailableError  the role cannot be served at all (weights missing)
        └── ShuttingDownError     rosterd is stopping
"""

from __future__ import annotations

from rosterd.errors import RosterdError


class SchedulerError(RosterdError):
    """A request could not get its role; ``retry_after_s`` (seconds) when retrying may help."""

    retry_after_s: float | None = None

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class UnknownRoleError(SchedulerError):
    """The role is not placed on any node this process runs."""


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
