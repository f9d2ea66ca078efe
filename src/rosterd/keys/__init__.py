"""API keys of the people and tools of a lab (DESIGN.md layer 2): the keys file, how a key is
made and stored (its hash, never the key) and what each key may do.

:mod:`rosterd.keys.values` holds the values (:class:`ApiKey`, :class:`KeyRing`,
:class:`Scope`), :mod:`rosterd.keys.reader` reads and writes the file's text. The router
checks them (``rosterd.router.auth``); ``rosterd keys`` edits the file.
"""

from __future__ import annotations

from rosterd.keys.reader import load_keys, parse_keys, render_keys
from rosterd.keys.values import (
    ALL_SCOPES,
    ApiKey,
    KeyLimits,
    KeyRing,
    Scope,
    key_digest,
    new_token,
)

__all__ = [
    "ALL_SCOPES",
    "ApiKey",
    "KeyLimits",
    "KeyRing",
    "Scope",
    "key_digest",
    "load_keys",
    "new_token",
    "parse_keys",
    "render_keys",
]
