"""rosterd's YAML layer against serde_yaml 0.9 itself.

The ``ryaml`` package wraps serde_yaml 0.9.34 over unsafe-libyaml 0.2.11 (the
reference's reader) and loads a document into a ``serde_yaml::Value``. The
roster's ``ram_gb`` is exactly such a Value, and every other field is read
from the same events, so for any document both must agree on whether it is
accepted: the libyaml syntax checks, the single-document rule, undefined
aliases, the 128-level recursion limit, the repetition limit on aliases,
duplicate mapping keys, 128-bit integers and the core tags.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from rosterd.roster._serde_yaml import ROOT_DEPTH, DocumentReader, Number, ReadError, Tagged
from rosterd.roster._yaml_nodes import Mapping, YamlSyntaxError, load_single_document

ryaml = pytest.importorskip("ryaml")


def _oracle_is_serde_yaml_09() -> bool:
    for path in Path(ryaml.__file__).parent.glob("_ryaml*"):
        if b"serde_yaml-0.9." in path.read_bytes():
            return True
    return False


pytestmark = pytest.mark.skipif(
    not _oracle_is_serde_yaml_09(), reason="the installed ryaml is not built on serde_yaml 0.9"
)


def ours(text: str) -> bool:
    """Whether rosterd accepts ``text`` as one document read as a serde_yaml Value."""
    try:
        document = load_single_document(text.encode("utf-8"))
        if document.root is not None:
            DocumentReader(document).read_value(document.root, ROOT_DEPTH)
    except (YamlSyntaxError, ReadError):
        return False
    return True


def serde(text: str) -> bool | None:
    """Whether serde_yaml accepts ``text``; ``None`` if only ryaml's conversion to
    Python failed (e.g. a mapping used as a key), which says nothing about serde."""
    try:
        ryaml.loads(text)
    except ryaml.InvalidYamlError:
        return False
    except (TypeError, ValueError):
        return None
    return True


BITS = [
    "a", "b", ": ", "\n", "  ", "- ", "&x ", "*x", "&y ", "*y", "!t ", "!!int ", "!!str ",
    "!!float ", "!!null ", "!!bool ", "! ", "'", '"', "[", "]", "{", "}", ", ", "? ", "#",
    "~", "0x1F", "1", "-1", "1e3", ".inf", "true", "yes", "\t", "---\n", "...\n",
    "%YAML 1.1\n", "%YAML 1.2\n", "%TAG !e! tag:e,2000:\n", "!e!x ", "|\n", ">\n", "é",
    "\ufeff", "\ufeff", "\r\n", "\ufeffa: 1\n", "\ufeff- x\n", "\t- ", "99999999999999999999",
    "0.0", "-0.0", ".nan", "<<: ", "\\", "\x85", "\u2028", "%", "@", "`",
    "!<tag:yaml.org,2002:int> ", "!<!x> ", "0o7", "0b1", "+1", "010", "null", "\x01",
]  # fmt: skip


def test_random_documents_are_accepted_exactly_when_serde_yaml_accepts_them() -> None:
    rng = random.Random(20260)
    compared = 0
    mismatches = []
    for _ in range(4000):
        text = "".join(rng.choice(BITS) for _ in range(rng.randint(1, 14)))
        expected = serde(text)
        if expected is None:
            continue
        compared += 1
        if ours(text) != expected:
            mismatches.append((text, expected))
    assert compared > 3500
    assert mismatches == []


@pytest.mark.parametrize(
    "text",
    [
        "\ufeffroster: []\n",
        "\ufeffa: 1\nb: 2\n",  # two documents for serde_yaml: its BOM shifts line 1
        "\ufeff\na: 1\nb: 2\n",
        "\ufeff...\n",
        "a: 1\n\ufeffb: 2\n",
        "a: {x: 1, x: 2}",
        "a: {0.0: 1, -0.0: 2}",
        "a: {.nan: 1, .NaN: 2}",
        "a: {1: x, 1.0: y}",
        "a: {[1, 2]: x, [1, 2]: y}",
        "a: {{a: 1, b: 2}: x, {b: 2, a: 1}: y}",
        "a: {!t x: 1, !t x: 2}",
        "a: 99999999999999999999",
        "a: 0xFFFFFFFFFFFFFFFFFF",
        "a: 1" + "0" * 45,
        "a: !!int abc",
        "a: !!bool 1",
        "a: &s [*s]",
        "[" * 128 + "]" * 128,
        "[" * 129 + "]" * 129,
        "%YAML 1.1\n---\na: 1\n",
        "%YAML 1.3\n---\na: 1\n",
        "a:\t1\n",
        "a: 1\n\tb: 2\n",
        "",
        "~",
    ],
)
def test_known_corners_agree_with_serde_yaml(text: str) -> None:
    assert ours(text) == serde(text)


@pytest.mark.parametrize("copies", [207, 208])
def test_repetition_limit_trips_at_the_same_alias_count(copies: int) -> None:
    inner = ", ".join(["*a0"] * 200)
    outer = ", ".join(["*a1"] * copies)
    text = f"a0: &a0 [x]\na1: &a1 [{inner}]\nb: [{outer}]\n"
    assert ours(text) == serde(text) == (copies == 207)


def _same_value(theirs: object, mine: object) -> bool:
    if isinstance(mine, Number):
        kind = int if mine.kind == "int" else float
        if type(theirs) is not kind:
            return False
        if isinstance(theirs, float) and math.isnan(theirs):
            return math.isnan(mine.value)
        return theirs == mine.value
    if isinstance(mine, Tagged):
        return isinstance(theirs, dict) and next(iter(theirs)) in ("!" + mine.tag, mine.tag)
    return type(theirs) is type(mine) and theirs == mine


def test_scalar_resolution_matches_serde_yaml() -> None:
    """Numbers, booleans, nulls and strings resolve as in serde_yaml, tagged or not."""
    rng = random.Random(5)
    alphabet = [*"0123456789" * 2, *".eE+-_xobXOB~ ", "inf", "nan", ".inf", ".nan", "null"]
    alphabet += ["true", "False", "0x", "0o", "0b", "a"]
    mismatches = []
    for _ in range(2500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))).strip()
        if not text:
            continue
        for form in (text, f"!!int {text}", f"!!float {text}", f"!!str {text}", f"!t {text}"):
            document_text = f"v: {form}\n"
            try:
                theirs: object = ryaml.loads(document_text)["v"]
            except ryaml.InvalidYamlError:
                theirs = ReadError
            try:
                document = load_single_document(document_text.encode())
                assert isinstance(document.root, Mapping)
                item = document.root.pairs[0][1]
                mine: object = DocumentReader(document).read_value(item, ROOT_DEPTH - 1)
            except (YamlSyntaxError, ReadError):
                mine = ReadError
            same = theirs is mine if ReadError in (theirs, mine) else _same_value(theirs, mine)
            if not same:
                mismatches.append((document_text, theirs, mine))
    assert mismatches == []
