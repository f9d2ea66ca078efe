"""Plain tokens and memory units shared by every layer (layer 1, no I/O)."""

from __future__ import annotations

from typing import Final

#: The unit of the roster's ``ram_gb``: 2^30 bytes, a GiB (as roster.rs ``residency::GB``).
#: The name follows the reference; every figure shown to people says "GiB".
GB: Final[int] = 1 << 30

_TOKEN_REST: Final[frozenset[str]] = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)


def valid_token(text: str, max_bytes: int) -> bool:
    """Whether ``text`` is a plain token of at most ``max_bytes`` UTF-8 bytes.

    A plain token is 1..``max_bytes`` bytes long, made only of ASCII letters,
    digits, ``.``, ``_`` and ``-``, and starts with an ASCII letter or digit
    (as the seed's ``workload_pkg::manifest::valid_token``). Plain tokens are
    safe to use as file names and process names.
    """
    if not 1 <= len(text.encode("utf-8", "surrogatepass")) <= max_bytes:
        return False
    first = text[0]
    if not (first.isascii() and first.isalnum()):
        return False
    return all(ch in _TOKEN_REST for ch in text)
