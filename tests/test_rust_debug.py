"""Rust's ``{:?}`` quoting and ``f64`` grammar, checked against rustc's own output.

``tests/data/rust_debug_vectors.json`` holds ``[text, format!("{:?}", text)]``
pairs and ``tests/data/rust_f64_vectors.json`` holds ``[text, bits or null]``
for ``text.parse::<f64>()``, both produced by rustc 1.95 over hand-picked and
random inputs (every code point whose treatment differs between Rust's and
Python's Unicode data is among them).
"""

from __future__ import annotations

import json
import re
import struct
import unicodedata
from pathlib import Path
from typing import Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from rosterd.roster._rust_std import rust_parse_f64, rust_split_whitespace, rust_trim
from rosterd.rust_debug import rust_debug_str

NO_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
DATA = Path(__file__).resolve().parent / "data"


def test_debug_quoting_matches_rustc_vectors() -> None:
    vectors = json.loads((DATA / "rust_debug_vectors.json").read_text(encoding="utf-8"))
    assert len(vectors) > 1000
    mismatches = [(text, rust) for text, rust in vectors if rust_debug_str(text) != rust]
    assert mismatches == []


def test_debug_quoting_examples() -> None:
    assert rust_debug_str("mlx-audio") == '"mlx-audio"'
    assert rust_debug_str('a"b\\c') == '"a\\"b\\\\c"'
    assert rust_debug_str("\t\r\n\0") == '"\\t\\r\\n\\0"'
    assert rust_debug_str("\x1f\x7f") == '"\\u{1f}\\u{7f}"'
    assert rust_debug_str("é\u0301") == '"é\\u{301}"'
    assert rust_debug_str("\u00a0 \u3000") == '"\\u{a0} \\u{3000}"'
    assert rust_debug_str("'") == '"\'"'
    assert rust_debug_str("😀") == '"😀"'
    assert rust_debug_str("\u09be\uff9e") == '"\\u{9be}\\u{ff9e}"'  # Other_Grapheme_Extend


_ESCAPE = re.compile(r"\\(u\{([0-9a-f]+)\}|.)")


def _unescape(quoted: str) -> str:
    assert quoted[0] == quoted[-1] == '"'
    simple = {"t": "\t", "r": "\r", "n": "\n", "0": "\0", "\\": "\\", '"': '"'}

    def one(match: re.Match[str]) -> str:
        if match.group(2) is not None:
            return chr(int(match.group(2), 16))
        return simple[match.group(1)]

    return _ESCAPE.sub(one, quoted[1:-1])


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=NO_SURROGATES)))
def test_debug_quoting_is_reversible_and_never_shows_controls(text: str) -> None:
    quoted = rust_debug_str(text)
    assert _unescape(quoted) == text
    inner = _ESCAPE.sub("", quoted[1:-1])
    assert '"' not in inner
    # Unassigned code points may show as they are (Rust's Unicode is newer); controls never.
    assert all(unicodedata.category(ch) not in ("Cc", "Zl", "Zp") for ch in inner)


def test_f64_grammar_matches_rustc_vectors() -> None:
    vectors = json.loads((DATA / "rust_f64_vectors.json").read_text(encoding="utf-8"))
    assert len(vectors) > 1000
    mismatches = []
    for text, bits in vectors:
        value = rust_parse_f64(text)
        got = None if value is None else f"{struct.unpack('<Q', struct.pack('<d', value))[0]:016x}"
        if value is not None and value != value and bits is not None:
            got = bits if int(bits, 16) & 0x7FF0000000000000 == 0x7FF0000000000000 else got
        if got != bits:
            mismatches.append((text, bits, got))
    assert mismatches == []


def test_rust_whitespace_helpers() -> None:
    assert rust_trim("\u00a0\t x \u3000\n") == "x"
    assert rust_trim("\x1cx\x1f") == "\x1cx\x1f"  # not Unicode White_Space
    assert rust_split_whitespace("a\u2003b\x0bc\x1fd ") == ["a", "b", "c\x1fd"]
    assert rust_split_whitespace("   ") == []
