"""Who is asking (DESIGN.md layer 7): the key of the request being served, and which roles
it may see.

The key gate (:mod:`rosterd.router.auth`) sets :data:`CALLER` for the request's task
before anything else runs; what a request resolves or lists (``ModelNames.resolve``,
``/v1/models``, ``/api/tags``, the page's roles) asks :func:`may_use` here rather than
taking the key as an argument through every layer of the router. A context variable is
per task: a request never sees another's key, and the tasks a request starts inherit its
own.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from typing import Final

from rosterd.keys.values import ApiKey

#: The key of the request being served; ``None``: no key was asked for (an open router).
CALLER: Final[ContextVar[ApiKey | None]] = ContextVar("rosterd_caller", default=None)


def caller() -> ApiKey | None:
    """The key of the request being served (``None``: an open router, or no request)."""
    return CALLER.get()


def may_use(names: Iterable[str]) -> bool:
    """Whether the caller may use the role reached by ``names`` (its id, model name and
    aliases): always without a key; else as its key's ``models`` say."""
    key = CALLER.get()
    return key is None or key.may_use(names)
