"""Rust standard-library text rules the roster's reference relies on (layer 2 helper).

The reference reads ``ram_gb`` text with ``str::trim`` and ``str::parse::<f64>``,
picks a backend's first word with ``split_whitespace``, lowercases with
``to_ascii_lowercase``, and serde_yaml reads integers with ``from_str_radix``.
Python's own ``str.strip``, ``str.split``, ``str.lower``, ``int`` and ``float``
differ from these (other whitespace, Unicode case mapping and digits, ``_``
separators), so each rule is written out here over plain ASCII grammars. Used
by :mod:`rosterd.roster._serde_yaml` and :mod:`rosterd.roster.importer`;
private to :mod:`rosterd.roster`.
"""

from __future__ import annotations

import re
from typing import Final

_DIGITS: Final[dict[int, frozenset[str]]] = {
    2: frozenset("01"),
    8: frozenset("01234567"),
    10: frozenset("0123456789"),
    16: frozenset("0123456789abcdefABCDEF"),
}

# Rust's `f64::from_str`: sign, then inf/infinity/nan (any case) or decimal
# digits with an optional point and exponent; ASCII only, nothing else.
_RUST_F64: Final = re.compile(
    r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))"
)

#: Unicode White_Space, which Rust's `str::trim` and `split_whitespace` use.
RUST_WHITESPACE: Final[frozenset[str]] = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def rust_trim(text: str) -> str:
    """``text`` without leading and trailing Unicode White_Space (Rust's ``str::trim``)."""
    start, end = 0, len(text)
    while start < end and text[start] in RUST_WHITESPACE:
        start += 1
    while end > start and text[end - 1] in RUST_WHITESPACE:
        end -= 1
    return text[start:end]


def rust_split_whitespace(text: str) -> list[str]:
    """``text`` split on runs of Unicode White_Space (Rust's ``split_whitespace``)."""
    words: list[str] = []
    current: list[str] = []
    for ch in text:
        if ch in RUST_WHITESPACE:
            if current:
                words.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        words.append("".join(current))
    return words


def rust_parse_f64(text: str) -> float | None:
    """Rust's ``text.parse::<f64>()``: the value, or ``None`` if Rust rejects the text.

    Overflow gives an infinity and underflow zero, as in Rust.
    """
    if _RUST_F64.fullmatch(text) is None:
        return None
    return float(text)


def rust_from_str_radix(text: str, radix: int, *, signed: bool, bits: int) -> int | None:
    """Rust's ``{u,i}{bits}::from_str_radix(text, radix)``, or ``None`` on error.

    One optional sign (``-`` only for signed types), then at least one ASCII
    digit of ``radix``; out of range is an error.
    """
    negative = False
    body = text
    if body[:1] == "+":
        body = body[1:]
    elif body[:1] == "-" and signed:
        negative = True
        body = body[1:]
    digits = _DIGITS[radix]
    if not body or any(ch not in digits for ch in body):
        return None
    value = int(body, radix)
    if negative:
        value = -value
    if signed:
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        low, high = 0, (1 << bits) - 1
    return value if low <= value <= high else None


def rust_ascii_lowercase(text: str) -> str:
    """``text`` with ASCII ``A-Z`` lowercased and every other character kept (Rust's
    ``str::to_ascii_lowercase``)."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)
