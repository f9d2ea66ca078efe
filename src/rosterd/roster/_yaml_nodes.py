"""One YAML document as a graph of plain nodes, read at the event level (layer 2 helper,
private to :mod:`rosterd.roster`; the fleet reader uses PyYAML's composed nodes instead).

Why events, and why libyaml: the roster's reference reader is serde_yaml 0.9,
which drives libyaml (as ``unsafe-libyaml``) and interprets the *events* itself:
each scalar's literal text, style and explicit tag, anchors and aliases. PyYAML
(well kept, already a dependency) exposes exactly those events from the same
libyaml through ``CParser``, so the syntax layer (tabs, control characters, BOM,
directives, flow/block rules) is libyaml's own, as in the reference. We never
call PyYAML's constructor: no Python object is ever built from a tag, and no
alias is ever expanded here (an alias is an :class:`Alias` pointing at the
node it names, so an "alias bomb" costs only its own size).

libyaml 0.2.6, bundled with recent PyYAML wheels, caps nesting at 1000 levels;
the reference's libyaml (0.2.5) has no cap, and a deeply nested *unknown* field
is accepted there. :func:`load_single_document` therefore raises the cap to
:data:`MAX_NESTING` for the duration of one parse when the bundled libyaml
exports the setting (restored afterwards, under a lock). It is not lifted
entirely because libyaml's flow-level bookkeeping is quadratic in depth: 10,000
levels parse in a fraction of a second, 200,000 would take over a minute (in
the reference too). That bound is rosterd's one deliberate difference from the
reference. Building nodes is iterative, so depth costs no Python stack.

If PyYAML was built without libyaml, the pure-Python parser is used; its
syntax checks differ from libyaml's in rare corners (documented limitation).
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, cast

import yaml

#: Whether PyYAML's libyaml binding (the reference's parser) is in use.
HAVE_LIBYAML: Final[bool] = bool(getattr(yaml, "__with_libyaml__", False))

_Loader: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = (
    yaml.CSafeLoader if HAVE_LIBYAML else yaml.SafeLoader
)


class ScalarStyle(enum.Enum):
    """How a scalar was written; serde_yaml treats plain scalars differently."""

    PLAIN = ""
    SINGLE_QUOTED = "'"
    DOUBLE_QUOTED = '"'
    LITERAL = "|"
    FOLDED = ">"


@dataclass(frozen=True, slots=True)
class Mark:
    """A position in the file: 1-based ``line`` and ``column`` (in characters)."""

    line: int
    column: int


@dataclass(eq=False, slots=True)
class Scalar:
    """A scalar node: its literal ``value``, ``style``, explicit ``tag`` (resolved by
    libyaml, e.g. ``tag:yaml.org,2002:int`` or ``!custom``; ``None`` if none was
    written) and where it starts."""

    value: str
    style: ScalarStyle
    tag: str | None
    mark: Mark


@dataclass(eq=False, slots=True)
class Sequence:
    """A sequence node; ``items`` may hold :class:`Alias` references."""

    tag: str | None
    mark: Mark
    items: list[Item] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class Mapping:
    """A mapping node: ``pairs`` in file order, duplicates kept (the reader decides)."""

    tag: str | None
    mark: Mark
    pairs: list[tuple[Item, Item]] = field(default_factory=list)


Node = Scalar | Sequence | Mapping


@dataclass(eq=False, slots=True)
class Alias:
    """An alias (``*name``) where it was written, pointing at the node it names.

    Kept apart from its target because the reference counts every alias it
    follows (serde_yaml's repetition limit).
    """

    target: Node
    mark: Mark


Item = Node | Alias


@dataclass(frozen=True, slots=True)
class Document:
    """The single document of a YAML stream.

    ``root`` is ``None`` for a stream without any document (empty file or only
    comments). ``event_count`` is the number of node events serde_yaml 0.9 keeps
    for the document (scalars, aliases, collection starts and ends, or one
    placeholder for an empty stream); it bounds how many aliases the reference
    follows (100 per event).
    """

    root: Item | None
    event_count: int


class YamlSyntaxError(Exception):
    """The text is not one well-formed YAML document; ``line``/``column`` are 1-based."""

    def __init__(self, message: str, line: int | None, column: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


#: Deepest nesting of flow or block collections read (see the module docstring).
MAX_NESTING: Final = 10_000

_NEST_LOCK: Final = threading.Lock()
_UTF8_BOM: Final = b"\xef\xbb\xbf"


def _libyaml_nest_setting() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """libyaml's (get, set) max-nest-level functions, if the binding exports them."""
    if not HAVE_LIBYAML:  # pragma: no cover
        return None
    try:
        from yaml import _yaml

        lib = ctypes.CDLL(_yaml.__file__)
        get = lib.yaml_get_max_nest_level
        set_ = lib.yaml_set_max_nest_level
    except (ImportError, OSError, AttributeError):
        return None
    get.restype = ctypes.c_int
    get.argtypes = []
    set_.restype = None
    set_.argtypes = [ctypes.c_int]
    return cast("Callable[[], int]", get), cast("Callable[[int], None]", set_)


_NEST_SETTING: Final = _libyaml_nest_setting()


@contextlib.contextmanager
def _no_nesting_cap() -> Iterator[None]:
    """Raise libyaml's nesting cap to MAX_NESTING for one parse (see the module docstring)."""
    if _NEST_SETTING is None:
        yield
        return
    get, set_ = _NEST_SETTING
    with _NEST_LOCK:
        previous = int(get())
        set_(MAX_NESTING)
        try:
            yield
        finally:
            set_(previous)


def _mark(event: yaml.Event) -> Mark:
    start = event.start_mark
    if start is None:  # pragma: no cover - libyaml always marks events
        return Mark(0, 0)
    return Mark(start.line + 1, start.column + 1)


def _line_column_of_offset(data: bytes, offset: int) -> tuple[int, int]:
    before = data[: max(0, offset)]
    line = before.count(b"\n") + 1
    last_newline = before.rfind(b"\n")
    column = len(before[last_newline + 1 :].decode("utf-8", "replace")) + 1
    return line, column


def _syntax_error(data: bytes, err: yaml.YAMLError) -> YamlSyntaxError:
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        parts = [p for p in (err.context, err.problem) if p]
        message = ", ".join(parts) or "invalid YAML"
        if "maximum nesting depth" in message:
            message = f"collections nested deeper than {MAX_NESTING} levels"
        if mark is not None:
            return YamlSyntaxError(message, mark.line + 1, mark.column + 1)
        return YamlSyntaxError(message, None, None)
    if isinstance(err, yaml.reader.ReaderError):
        line, column = _line_column_of_offset(data, err.position)
        return YamlSyntaxError(f"{err.reason} (character {err.character!r})", line, column)
    return YamlSyntaxError(str(err) or "invalid YAML", None, None)


_STYLES: Final[dict[str | None, ScalarStyle]] = {
    None: ScalarStyle.PLAIN,
    "": ScalarStyle.PLAIN,
    "'": ScalarStyle.SINGLE_QUOTED,
    '"': ScalarStyle.DOUBLE_QUOTED,
    "|": ScalarStyle.LITERAL,
    ">": ScalarStyle.FOLDED,
}


def load_single_document(data: bytes) -> Document:
    """Parse UTF-8 ``data`` into its one document, as serde_yaml 0.9 loads it.

    Anchors name the node being built from its start (so a collection may
    contain an alias of itself); a later anchor of the same name replaces the
    earlier one. Nothing is expanded or constructed.

    Raises:
        YamlSyntaxError: a libyaml syntax error, an alias of an undefined
            anchor, or more than one document in the stream.
    """
    anchors: dict[str, Node] = {}
    stack: list[Sequence | Mapping] = []
    pending_key: list[Item | None] = []
    root: Item | None = None
    documents = 0
    events = 0

    def attach(item: Item) -> None:
        nonlocal root
        if not stack:
            root = item
            return
        parent = stack[-1]
        if isinstance(parent, Sequence):
            parent.items.append(item)
        elif pending_key[-1] is None:
            pending_key[-1] = item
        else:
            key = pending_key[-1]
            parent.pairs.append((key, item))
            pending_key[-1] = None

    parsed = data
    if HAVE_LIBYAML and data.startswith(_UTF8_BOM):
        # The reference sets libyaml's encoding to UTF-8 up front, so a leading
        # BOM is not consumed as an encoding mark: it reaches the scanner, which
        # skips it as it skips a BOM at the start of any line, leaving the first
        # line's content at column 1 (so `\ufeffa: 1` then `b: 2` is two
        # documents there). PyYAML lets libyaml detect the encoding, which eats
        # one BOM; giving it one more reproduces the reference exactly.
        parsed = _UTF8_BOM + data
    with _no_nesting_cap():
        try:
            for event in yaml.parse(parsed, Loader=_Loader):
                if isinstance(event, yaml.DocumentStartEvent):
                    documents += 1
                    if documents > 1:
                        raise YamlSyntaxError(
                            "the file holds more than one YAML document "
                            "(only one is read; remove the extra `---`)",
                            *_mark_tuple(event),
                        )
                elif isinstance(event, yaml.ScalarEvent):
                    events += 1
                    node: Node = Scalar(
                        event.value,
                        _STYLES.get(event.style, ScalarStyle.PLAIN),
                        event.tag,
                        _mark(event),
                    )
                    if event.anchor is not None:
                        anchors[event.anchor] = node
                    attach(node)
                elif isinstance(event, yaml.AliasEvent):
                    events += 1
                    target = anchors.get(event.anchor or "")
                    if target is None:
                        raise YamlSyntaxError(
                            f"alias *{event.anchor} names no anchor defined before it",
                            *_mark_tuple(event),
                        )
                    attach(Alias(target, _mark(event)))
                elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
                    events += 1
                    collection: Sequence | Mapping
                    if isinstance(event, yaml.SequenceStartEvent):
                        collection = Sequence(event.tag, _mark(event))
                    else:
                        collection = Mapping(event.tag, _mark(event))
                    if event.anchor is not None:
                        anchors[event.anchor] = collection
                    attach(collection)
                    stack.append(collection)
                    pending_key.append(None)
                elif isinstance(event, yaml.SequenceEndEvent | yaml.MappingEndEvent):
                    events += 1
                    stack.pop()
                    pending_key.pop()
        except yaml.YAMLError as err:
            raise _syntax_error(parsed, err) from None
    if documents == 0:
        events = 1  # serde_yaml's placeholder event for an empty stream
    return Document(root, events)


def _mark_tuple(event: yaml.Event) -> tuple[int, int]:
    mark = _mark(event)
    return mark.line, mark.column
