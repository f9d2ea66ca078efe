"""When the router sends a request again (DESIGN.md layer 7): every retry of a proxied
request in one table, in the order they nest, and the tests that allow each.

A request is sent again only where the backend never took it, so no request is ever
generated twice. From the innermost (tried first) to the outermost:

=====  ========================  =====================================  ===========================
order  retry                     when                                   how often (``RetryPolicy``)
=====  ========================  =====================================  ===========================
1      a fresh connection        the backend closed or reset a pooled   ``fresh_connection``: once
                                 connection before any answer byte      (never on a pooled one)
2      another copy              the backend could not be reached       ``other_copy``: once, to a
                                 (:func:`backend_unreachable`) and      copy ready now (replicas)
                                 another copy of the role is ready
3      the restarted backend     the backend could not be reached and   ``restart_waits``: 2 sends
                                 no other copy is ready (or one was     after an unreachable
                                 tried)                                 backend in all, 2 and 3
                                                                        together; each a lease of a
                                                                        newer generation
4      where the role is now     the node was lost under the request    ``resends``: 2, a new lease
                                 before any answer byte                 wherever the role is
                                 (:func:`may_resend`)
=====  ========================  =====================================  ===========================

Every wait for a lease (2 to 4) stays within the queue timeout; a client is told when
to retry itself by the ``Retry-After`` of its 429 or 503 (``rosterd.router.openai_errors``).
The proxy (:mod:`rosterd.router.proxy`) applies 1 through
:func:`~rosterd.router.backend_requests.send_upstream`, 2 and 3 in ``_serve_leased``, 4 in
``_serve``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rosterd.errors import RouterError, UpstreamClosedError, UpstreamConnectError
from rosterd.router.client_side import CutReason
from rosterd.scheduler.values import Revocation

#: Failures before any response byte that mean "the backend is not there": it could not be
#: connected to (refused, unreachable, connect timeout), or it closed or reset the connection
#: before any byte of its answer (it died with the request in flight).
_UNREACHABLE = (UpstreamConnectError, UpstreamClosedError)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times one request is sent again, per retry of the module's table
    (``fresh_connection``: whether; it is never tried more than once)."""

    fresh_connection: bool = True
    other_copy: int = 1
    restart_waits: int = 2
    resends: int = 2


#: The router's retries (the module's table).
RETRIES: Final[RetryPolicy] = RetryPolicy()


def backend_unreachable(err: RouterError) -> bool:
    """Whether ``err`` (raised before any response byte) means the backend could not be
    reached or dropped the request unanswered, so another copy or its restart may take it
    (retries 2 and 3).

    Looks at the upstream client's error that ``upstream_errors`` chained as the cause:
    :class:`UpstreamConnectError` or :class:`UpstreamClosedError`."""
    return err.code == "backend_error" and isinstance(err.__cause__, _UNREACHABLE)


def may_resend(why: CutReason, answer_status: int) -> bool:
    """Whether a request cut for ``why`` may be sent where its role is now (retry 4): its
    revocation allows it (the node was lost) and no status was sent to the client
    (``answer_status`` 0)."""
    return isinstance(why, Revocation) and why.resend and not answer_status
