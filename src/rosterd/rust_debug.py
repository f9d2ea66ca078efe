"""Rust's ``{:?}`` formatting of a ``&str`` (layer 1), for reason texts that match the seed.

Rust escapes ``\\0 \\t \\r \\n \\\\ \\"``, and writes ``\\u{hex}`` for characters that
are not printable (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than
the ASCII space — the same definition as Python's ``str.isprintable``) or are
grapheme extenders (combining marks); other characters stay as they are.
"""

from __future__ import annotations

import unicodedata
from typing import Final

_SIMPLE: Final[dict[str, str]] = {
    "\0": "\\0",
    "\t": "\\t",
    "\r": "\\r",
    "\n": "\\n",
    "\\": "\\\\",
    '"': '\\"',
}


def _grapheme_extend(ch: str) -> bool:
    return unicodedata.category(ch) in ("Mn", "Me")


def rust_debug_str(text: str) -> str:
    """``text`` quoted and escaped as Rust's ``format!("{:?}", text)`` prints it."""
    out = ['"']
    for ch in text:
        simple = _SIMPLE.get(ch)
        if simple is not None:
            out.append(simple)
        elif not ch.isprintable() or _grapheme_extend(ch):
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
