"""How serde_yaml 0.9 turns YAML nodes into typed values (layer 2 helper, private to
:mod:`rosterd.roster`).

The roster import must read every field exactly as the reference
(``seed/roster.rs`` with serde and serde_yaml 0.9) does. This module holds
those rules, each named after the serde_yaml function it mirrors, over the
node graph of :mod:`rosterd.roster._yaml_nodes`:

* string fields take the literal text of any scalar (tags and quotes ignored);
* ``Option<u16>`` (the port) is strict: a plain (or ``!!int`` literal-block)
  scalar holding a YAML 1.2 core integer, ``null``/``~``/empty for none;
* ``bool`` is ``true|True|TRUE|false|False|FALSE`` only;
* ``serde_yaml::Value`` (``ram_gb``) resolves plain scalars by the YAML 1.2
  core schema, keeps quoted ones as strings, wraps local tags (``!x``) as
  tagged values, rejects duplicate mapping keys, integers in the 65..128-bit
  range, more than 128 levels of nesting and alias expansion beyond 100 per
  event (serde_yaml's recursion and repetition limits).

Numbers are checked with our own ASCII grammars (Rust's, in
:mod:`rosterd.roster._rust_std`), never with Python's ``int`` or ``float`` on
raw text (those accept ``_``, spaces and Unicode digits).

Failures raise :class:`ReadError` with the offending node;
:mod:`rosterd.roster.document` turns it into a located ``RosterError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from rosterd.roster._rust_std import rust_from_str_radix, rust_parse_f64
from rosterd.roster._yaml_nodes import (
    Alias,
    Document,
    Item,
    Mapping,
    Node,
    Scalar,
    ScalarStyle,
    Sequence,
)

TAG_BOOL: Final = "tag:yaml.org,2002:bool"
TAG_INT: Final = "tag:yaml.org,2002:int"
TAG_FLOAT: Final = "tag:yaml.org,2002:float"
TAG_NULL: Final = "tag:yaml.org,2002:null"

#: serde_yaml's ``remaining_depth`` at the document root.
ROOT_DEPTH: Final = 128


class ReadError(Exception):
    """A node cannot be read as the field's type.

    ``found`` describes what is there, ``expected`` what the field takes,
    ``hint`` (optional) how to fix it; ``item`` is the offending node.
    """

    def __init__(self, item: Item | None, found: str, expected: str, hint: str = "") -> None:
        super().__init__(f"found {found}, expected {expected}")
        self.item = item
        self.found = found
        self.expected = expected
        self.hint = hint


# --- scalar resolution -------------------------------------------------------


def digits_but_not_number(text: str) -> bool:
    """serde_yaml ``digits_but_not_number``: ``010`` or ``-00`` is a string in YAML 1.2."""
    body = text[1:] if text[:1] in ("+", "-") else text
    return len(body) > 1 and body[0] == "0" and all(ch in "0123456789" for ch in body[1:])


def parse_unsigned_int(text: str, bits: int) -> int | None:
    """serde_yaml ``parse_unsigned_int``: ``0x``/``0o``/``0b`` or decimal, optional ``+``."""
    unpositive = text[1:] if text[:1] == "+" else text
    for prefix, radix in (("0x", 16), ("0o", 8), ("0b", 2)):
        if unpositive.startswith(prefix):
            rest = unpositive[2:]
            if rest[:1] in ("+", "-"):
                return None
            value = rust_from_str_radix(rest, radix, signed=False, bits=bits)
            if value is not None:
                return value
    if unpositive[:1] in ("+", "-"):
        return None
    if digits_but_not_number(text):
        return None
    return rust_from_str_radix(unpositive, 10, signed=False, bits=bits)


def parse_negative_int(text: str, bits: int) -> int | None:
    """serde_yaml ``parse_negative_int``: ``-0x``/``-0o``/``-0b`` or a signed decimal."""
    for prefix, radix in (("-0x", 16), ("-0o", 8), ("-0b", 2)):
        if text.startswith(prefix):
            value = rust_from_str_radix("-" + text[3:], radix, signed=True, bits=bits)
            if value is not None:
                return value
    if digits_but_not_number(text):
        return None
    return rust_from_str_radix(text, 10, signed=True, bits=bits)


def parse_f64(text: str) -> float | None:
    """serde_yaml ``parse_f64``: ``.inf``/``.nan`` forms, else a finite Rust float."""
    unpositive = text
    if text[:1] == "+":
        unpositive = text[1:]
        if unpositive[:1] in ("+", "-"):
            return None
    if unpositive in (".inf", ".Inf", ".INF"):
        return math.inf
    if text in ("-.inf", "-.Inf", "-.INF"):
        return -math.inf
    if text in (".nan", ".NaN", ".NAN"):
        return math.nan
    value = rust_parse_f64(unpositive)
    if value is not None and math.isfinite(value):
        return value
    return None


def parse_null(text: str) -> bool:
    """serde_yaml ``parse_null``."""
    return text in ("null", "Null", "NULL", "~")


def parse_bool(text: str) -> bool | None:
    """serde_yaml ``parse_bool`` (YAML 1.2 core: no ``yes``/``on``)."""
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    return None


def parse_tag(tag: str | None) -> str | None:
    """serde_yaml ``parse_tag``: a local tag (``!x`` → ``x``, ``!`` → ``!``), else ``None``."""
    if not tag or tag[0] != "!":
        return None
    return tag[1:] or tag


# --- values ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Number:
    """A ``serde_yaml::Number``: ``kind`` is ``"int"`` (64-bit, either sign) or ``"float"``."""

    kind: str
    value: int | float

    def as_f64(self) -> float:
        """``Number::as_f64``."""
        return float(self.value)


@dataclass(frozen=True, slots=True)
class Tagged:
    """A ``serde_yaml::Value::Tagged`` (a local tag such as ``!custom``)."""

    tag: str


#: The top of a ``serde_yaml::Value`` as the roster needs it: ``None`` (null),
#: ``bool``, :class:`Number`, ``str``, ``list`` (sequence), ``dict`` (mapping)
#: or :class:`Tagged`. Only the top level is kept; nested content is checked
#: (for the reference's errors) but not materialized.
ValueTop = None | bool | Number | str | list[None] | dict[None, None] | Tagged


class DocumentReader:
    """Reads typed fields from one document with serde_yaml 0.9's rules and limits.

    Counts every alias followed against the reference's repetition limit
    (``100 * event_count``). ``Value`` reads are memoized per (node, depth) and
    mapping keys are hash-consed, so an alias bomb costs time linear in the
    file, never in its expansion.
    """

    def __init__(self, document: Document) -> None:
        self.document = document
        self.jump_limit = document.event_count * 100
        self.jumps = 0
        self._value_memo: dict[tuple[int, int], tuple[int, int]] = {}
        self._value_top: dict[int, ValueTop] = {}
        self._intern: dict[object, int] = {}
        self._keep: list[Node] = []

    # -- aliases ----------------------------------------------------------

    def _count_jumps(self, count: int, item: Item) -> None:
        self.jumps += count
        if self.jumps > self.jump_limit:
            raise ReadError(
                item,
                "aliases that expand to more than 100 nodes per node of the file",
                "a file whose aliases stay small (an alias bomb?)",
            )

    def deref(self, item: Item) -> Node:
        """The node ``item`` names, counting one alias jump if it is an alias."""
        if isinstance(item, Alias):
            self._count_jumps(1, item)
            return item.target
        return item

    # -- strings, struct keys -------------------------------------------------

    def read_str(self, item: Item, expected: str = "a string") -> str:
        """serde ``String``: the literal text of any scalar (``deserialize_str``)."""
        node = self.deref(item)
        if isinstance(node, Scalar):
            return node.value
        kind = "a sequence" if isinstance(node, Sequence) else "a mapping"
        raise ReadError(item, kind, expected)

    # -- structs, sequences -------------------------------------------------------

    def read_struct(self, item: Item | None, expected: str) -> list[tuple[Item, Item]]:
        """``deserialize_struct``/``deserialize_map``: the pairs of a mapping, ``[]``
        for an empty plain scalar or an empty stream (``item`` is ``None``)."""
        if item is None:
            return []
        node = self.deref(item)
        if isinstance(node, Mapping):
            return node.pairs
        if isinstance(node, Scalar) and node.value == "" and node.style is ScalarStyle.PLAIN:
            return []
        raise ReadError(item, _found(node), expected)

    def read_seq(self, item: Item, expected: str) -> list[Item]:
        """``deserialize_seq``: the items of a sequence, ``[]`` for an empty plain scalar."""
        node = self.deref(item)
        if isinstance(node, Sequence):
            return node.items
        if isinstance(node, Scalar) and node.value == "" and node.style is ScalarStyle.PLAIN:
            return []
        raise ReadError(item, _found(node), expected)

    # -- port: Option<u16> ------------------------------------------------------

    def read_optional_u16(self, item: Item) -> int | None:
        """``Option<u16>`` (``deserialize_option`` then ``deserialize_u64``)."""
        node = self.deref(item)
        expected = "a port number 1..65535 (or nothing)"
        if isinstance(node, Scalar) and node.style is ScalarStyle.PLAIN:
            if node.tag is not None:
                if node.tag == TAG_NULL:
                    if parse_null(node.value):
                        return None
                    raise ReadError(item, _found(node), expected, "a value tagged !!null is null")
            elif node.value == "" or parse_null(node.value):
                return None
        if isinstance(node, Scalar) and (
            node.style is ScalarStyle.PLAIN
            or (node.style is ScalarStyle.LITERAL and node.tag == TAG_INT)
        ):
            value = parse_unsigned_int(node.value, 64)
            if value is None:
                hint = ""
                if node.value.startswith("-"):
                    hint = "a port cannot be negative"
                elif node.value.startswith("0") and node.value.isdigit():
                    hint = "write the port without leading zeros"
                elif "_" in node.value:
                    hint = "write the port without `_`"
                elif rust_parse_f64(node.value) is not None:
                    hint = "write the port as a whole number"
                raise ReadError(item, _found(node), expected, hint)
            if value > 65535:
                raise ReadError(item, _found(node), expected, "ports go up to 65535")
            return value
        hint = ""
        if isinstance(node, Scalar) and node.style in (
            ScalarStyle.SINGLE_QUOTED,
            ScalarStyle.DOUBLE_QUOTED,
        ):
            hint = "write the port without quotes"
        raise ReadError(item, _found(node), expected, hint)

    # -- bool -------------------------------------------------------------------

    def read_bool(self, item: Item) -> bool:
        """serde ``bool`` (``deserialize_bool``)."""
        node = self.deref(item)
        if isinstance(node, Scalar) and (
            node.style is ScalarStyle.PLAIN
            or (node.style is ScalarStyle.LITERAL and node.tag == TAG_BOOL)
        ):
            value = parse_bool(node.value)
            if value is not None:
                return value
        hint = ""
        if isinstance(node, Scalar) and node.value.lower() in ("yes", "no", "on", "off", "y", "n"):
            hint = "YAML 1.2 booleans are only true and false"
        elif isinstance(node, Scalar) and node.style is not ScalarStyle.PLAIN:
            hint = "write true or false without quotes"
        raise ReadError(item, _found(node), "true or false", hint)

    # -- unit enum --------------------------------------------------------------

    def read_unit_enum(self, item: Item, variants: tuple[str, ...]) -> str:
        """A serde unit-variant enum (``deserialize_enum``): the variant name.

        A scalar's text names the variant; a local tag (``!batch`` with an
        empty or null value) does too, as in serde_yaml.
        """
        node = self.deref(item)
        expected = " or ".join(f"`{v}`" for v in variants)
        if isinstance(node, Scalar):
            tag = parse_tag(node.tag)
            if tag is not None:
                name = tag
                if not (
                    node.style is ScalarStyle.PLAIN and (node.value == "" or parse_null(node.value))
                ):
                    raise ReadError(item, _found(node), expected)
            else:
                name = node.value
            if name in variants:
                return name
            hint = ""
            if name.lower() in variants:
                hint = f"write it in lowercase: {name.lower()}"
            raise ReadError(item, f"`{name}`", expected, hint)
        raise ReadError(item, _found(node), expected)

    # -- serde_yaml::Value --------------------------------------------------------

    def read_value(self, item: Item, depth: int) -> ValueTop:
        """``serde_yaml::Value`` (``deserialize_any``) at serde's ``remaining_depth``.

        Returns the top of the value; raises :class:`ReadError` where the
        reference fails the whole file.
        """
        value_id = self._value_id(item, depth, tagged_already=False)
        return self._value_top[value_id]

    def _value_id(self, item: Item, depth: int, *, tagged_already: bool) -> int:
        if isinstance(item, Alias):
            self._count_jumps(1, item)
            return self._value_id(item.target, depth, tagged_already=tagged_already)
        memo_key = (id(item), depth * 2 + int(tagged_already))
        found = self._value_memo.get(memo_key)
        if found is not None:
            value_id, jumps = found
            self._count_jumps(jumps, item)
            return value_id
        before = self.jumps
        value_id = self._compute_value(item, depth, tagged_already=tagged_already)
        self._value_memo[memo_key] = (value_id, self.jumps - before)
        self._keep.append(item)  # keep ids stable while memoized
        return value_id

    def _intern_value(self, key: object, top: ValueTop) -> int:
        value_id = self._intern.get(key)
        if value_id is None:
            value_id = len(self._intern)
            self._intern[key] = value_id
            self._value_top[value_id] = top
        return value_id

    def _compute_value(self, node: Node, depth: int, *, tagged_already: bool) -> int:
        if not tagged_already:
            local = parse_tag(node.tag)
            if local is not None:
                inner = self._compute_value(node, depth, tagged_already=True)
                bare = local[1:] if local.startswith("!") and len(local) > 1 else local
                return self._intern_value(("tagged", bare, inner), Tagged(local))
        if isinstance(node, Scalar):
            return self._scalar_value(node, tagged_already=tagged_already)
        if depth <= 0:
            raise ReadError(
                node, "more than 128 levels of nesting", "a shallower value (serde_yaml's limit)"
            )
        if isinstance(node, Sequence):
            ids = tuple(
                self._value_id(child, depth - 1, tagged_already=False) for child in node.items
            )
            return self._intern_value(("seq", ids), [])
        seen: set[int] = set()
        pairs: list[tuple[int, int]] = []
        for key, value in node.pairs:
            key_id = self._value_id(key, depth - 1, tagged_already=False)
            if key_id in seen:
                raise ReadError(key, "a key given twice in one mapping", "unique keys")
            seen.add(key_id)
            pairs.append((key_id, self._value_id(value, depth - 1, tagged_already=False)))
        return self._intern_value(("map", frozenset(pairs)), {})

    def _scalar_value(self, node: Scalar, *, tagged_already: bool) -> int:
        text = node.value
        tag = None if tagged_already else node.tag
        top: ValueTop
        if tag == TAG_BOOL:
            parsed_bool = parse_bool(text)
            if parsed_bool is None:
                raise ReadError(node, _found(node), "a boolean (it is tagged !!bool)")
            top = parsed_bool
        elif tag == TAG_INT:
            number = _visit_int(node, text)
            if number is None:
                raise ReadError(node, _found(node), "an integer (it is tagged !!int)")
            top = number
        elif tag == TAG_FLOAT:
            parsed_float = parse_f64(text)
            if parsed_float is None:
                raise ReadError(node, _found(node), "a float (it is tagged !!float)")
            top = Number("float", parsed_float)
        elif tag == TAG_NULL:
            if not parse_null(text):
                raise ReadError(node, _found(node), "null (it is tagged !!null)")
            top = None
        elif node.style is ScalarStyle.PLAIN and (tag is None or tag.startswith("!")):
            top = _untagged_plain(node)
        else:
            top = text
        return self._intern_value(_value_key(top), top)


def _value_key(top: ValueTop) -> object:
    if isinstance(top, Number):
        if top.kind == "float":
            value = float(top.value)
            if math.isnan(value):
                return ("float", "nan")
            return ("float", value + 0.0)  # -0.0 equals 0.0, as in serde_yaml
        return ("int", top.value)
    if isinstance(top, bool):
        return ("bool", top)
    if top is None:
        return ("null",)
    return ("str", top)


def _visit_int(node: Scalar, text: str) -> Number | None:
    """serde_yaml ``visit_int`` into a ``Value``: 64-bit, or an error for 128-bit."""
    value = parse_unsigned_int(text, 64)
    if value is None:
        value = parse_negative_int(text, 64)
    if value is not None:
        return Number("int", value)
    if parse_unsigned_int(text, 128) is not None or parse_negative_int(text, 128) is not None:
        raise ReadError(
            node, f"the integer {text}, beyond 64 bits", "a number that fits in 64 bits"
        )
    return None


def _untagged_plain(node: Scalar) -> ValueTop:
    """serde_yaml ``visit_untagged_scalar``: YAML 1.2 core resolution of a plain scalar."""
    text = node.value
    if text == "" or parse_null(text):
        return None
    boolean = parse_bool(text)
    if boolean is not None:
        return boolean
    number = _visit_int(node, text)
    if number is not None:
        return number
    if not digits_but_not_number(text):
        value = parse_f64(text)
        if value is not None:
            return Number("float", value)
    return text


def _found(node: Node) -> str:
    if isinstance(node, Sequence):
        return "a sequence"
    if isinstance(node, Mapping):
        return "a mapping"
    text = node.value if len(node.value) <= 60 else node.value[:57] + "..."
    if node.style is ScalarStyle.PLAIN:
        return f"`{text}`" if text else "an empty value"
    if node.style in (ScalarStyle.LITERAL, ScalarStyle.FOLDED):
        return f"the block text {text!r}"
    return f"the quoted text {text!r}"
