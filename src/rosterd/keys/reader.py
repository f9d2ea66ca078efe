"""The keys file (DESIGN.md layer 2; reading is the only I/O): YAML in, a
:class:`~rosterd.keys.values.KeyRing`'s keys out, and the text ``rosterd keys add`` and
``remove`` write back.

A keys file is YAML::

    keys:
      - name: alice                 # plain token: what logs, metrics and usage show
        hash: sha256:9f86d08...     # of the key (``rosterd keys add`` writes it)
        scopes: [use, watch]        # use | watch | operate (default: [use])
        models: [chat, "qwen-*"]    # role ids, model names, aliases or fnmatch patterns
                                    # a `use` key may reach (default: ["*"], all)
        priority: batch             # interactive | batch: the queue its requests wait
                                    # in (default: the role's own latency class)
        limits:                     # default: none
          in_flight: 4              # requests at once
          requests_per_minute: 60
          tokens_per_day: 2000000   # prompt + completion tokens, per UTC day

Errors are :class:`~rosterd.errors.InputError` (the tree's "a file given by the operator
cannot be used as a whole"; no subclass of its own) naming the file, field path
(``keys[1].scopes[0]``), line and column, as the fleet file's do
(:mod:`rosterd.fleet.reader`). A message never shows text that could be a key: a
``hash`` value is never echoed, and any other text that looks like one (the ``rk-``
prefix, or longer than :data:`SHOWN_MAX_CHARS`) is shown by its length only.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Final

import yaml
from yaml.constructor import SafeConstructor

from rosterd.errors import InputError
from rosterd.keys.values import DIGEST_PREFIX, TOKEN_PREFIX, ApiKey, KeyLimits, Scope
from rosterd.spec import LatencyClass
from rosterd.tokens import valid_token

#: Largest keys file read, in bytes.
MAX_KEYS_BYTES: Final[int] = 1_048_576
#: Text longer than this is never echoed in an error (it could be a key pasted by mistake).
SHOWN_MAX_CHARS: Final[int] = 24

_TOP_KEYS: Final = ("keys",)
_KEY_KEYS: Final = ("name", "hash", "scopes", "models", "priority", "limits")
_LIMIT_KEYS: Final = ("in_flight", "requests_per_minute", "tokens_per_day")
_DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
_MODEL_PATTERN_MAX_CHARS: Final = 256


def shown(value: object) -> str:
    """``value`` as an error may show it: ``repr`` of short text that does not look like a
    key, else ``text of N characters``."""
    if isinstance(value, str):
        if len(value) > SHOWN_MAX_CHARS or TOKEN_PREFIX in value:
            return f"text of {len(value)} characters"
        return repr(value)
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)
    return f"a value of type {type(value).__name__}"


def check_name(name: str) -> str | None:
    """Why ``name`` cannot name a key (``None``: it can): it must be a plain token of at
    most 64 bytes that does not look like a key."""
    if valid_token(name, 64) and not name.startswith(TOKEN_PREFIX):
        return None
    return (
        "expected a plain token of at most 64 bytes (letters, digits, . _ -; starting "
        f"with a letter or digit; not a key), found {shown(name)}"
    )


def check_pattern(pattern: str) -> str | None:
    """Why ``pattern`` cannot be one of a key's ``models`` (``None``: it can)."""
    if (
        pattern
        and len(pattern) <= _MODEL_PATTERN_MAX_CHARS
        and not any(ch.isspace() for ch in pattern)
    ):
        return None
    return (
        f"expected a role id, model name, alias or pattern (such as qwen-*) of 1 to "
        f"{_MODEL_PATTERN_MAX_CHARS} characters without spaces, found {shown(pattern)}"
    )


def load_keys(path: Path) -> tuple[ApiKey, ...]:
    """Read and validate the keys file at ``path`` (opened read-only).

    Raises:
        InputError: it cannot be read, is not valid YAML, or a field is wrong (file, field
            path, line and column named).
    """
    file = str(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KEYS_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read the keys file: {err.strerror or err}", file=file) from None
    if len(data) > MAX_KEYS_BYTES:
        raise InputError(f"the keys file is larger than {MAX_KEYS_BYTES} bytes", file=file)
    return parse_keys(data, file=file)


def _without_keys(problem: str) -> str:
    """PyYAML's ``problem`` with every word that could be a key (see :func:`shown`) given
    by its length only: it quotes what it stumbled on (``found undefined alias 'rk-...'``
    for a key pasted after a ``*``)."""
    return re.sub(
        r"\S+",
        lambda word: (
            f"<text of {len(word.group())} characters>"
            if len(word.group()) > SHOWN_MAX_CHARS or TOKEN_PREFIX in word.group()
            else word.group()
        ),
        problem,
    )


def parse_keys(text: str | bytes, *, file: str | None = None) -> tuple[ApiKey, ...]:
    """Validate keys YAML given as text (see :func:`load_keys`); an empty document or
    ``keys: []`` is no key.

    Raises:
        InputError: as :func:`load_keys`.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"the keys file is not UTF-8 (byte {err.start})", file=file) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise InputError(
            f"not valid YAML: {_without_keys(err.problem or err.context or '')}",
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError:
        raise InputError("not valid YAML", file=file) from None
    except RecursionError:
        raise InputError("not valid YAML: nested too deeply", file=file) from None
    return _KeysReader(file).read(root)


def render_keys(keys: tuple[ApiKey, ...], file: str = "FILE") -> str:
    """The keys file's text for ``keys`` (what ``rosterd keys add`` and ``remove`` write):
    every field given, defaults included, so that a reader sees what each key may do;
    ``file``: its path, in the comment that says how to add a key."""
    lines = [
        "# rosterd keys: only hashes of the keys are kept here; to add a key:",
        f"#   rosterd keys add NAME --keys {_shell_word(file)}",
        "keys:",
    ]
    if not keys:
        lines[-1] = "keys: []"
    for key in keys:
        lines.append(f"  - name: {key.name}")
        lines.append(f"    hash: {key.digest}")
        scopes = ", ".join(s.value for s in Scope if s in key.scopes)
        lines.append(f"    scopes: [{scopes}]")
        models = ", ".join(_yaml_text(m) for m in key.models)
        lines.append(f"    models: [{models}]")
        if key.priority is not None:
            lines.append(f"    priority: {key.priority.value}")
        limits = key.limits
        if limits.any():
            lines.append("    limits:")
            for name in _LIMIT_KEYS:
                value = getattr(limits, name)
                if value is not None:
                    lines.append(f"      {name}: {value}")
    return "\n".join(lines) + "\n"


def _yaml_text(text: str) -> str:
    """``text`` as a YAML flow scalar: JSON's quoting, which YAML reads back as it was."""
    import json

    return json.dumps(text, ensure_ascii=False)


def _shell_word(text: str) -> str:
    """``text`` as one word of a shell command (a hint the user pastes as printed)."""
    return shlex.quote(text)


def _add_hint(file: str | None) -> str:
    """The command that writes a key into ``file`` (``FILE`` when it is not known)."""
    return f"`rosterd keys add NAME --keys {_shell_word(file or 'FILE')}`"


class _KeysReader:
    """Walks the composed YAML tree, raising InputError at the first wrong field."""

    def __init__(self, file: str | None) -> None:
        self.file = file
        self._constructor = SafeConstructor()

    def fail(self, node: yaml.Node | None, path: str | None, message: str) -> InputError:
        mark = node.start_mark if node is not None else None
        return InputError(
            message,
            file=self.file,
            path=path,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        )

    def scalar(self, node: yaml.Node) -> object:
        if not isinstance(node, yaml.ScalarNode):
            return None
        try:
            return self._constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError, IndexError, TypeError):
            # A malformed typed scalar (``!!int`` with no digits raises IndexError inside
            # PyYAML, found by fuzzing): never a valid field, so every check reports it.
            return _UNREADABLE

    def found(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        value = self.scalar(node)
        return "an unreadable value" if value is _UNREADABLE else shown(value)

    def mapping(
        self, node: yaml.Node, path: str | None, allowed: tuple[str, ...], what: str
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node)
            if not isinstance(key, str):
                raise self.fail(
                    key_node, path, f"expected text keys, found key {self.found(key_node)}"
                )
            sub = f"{path}.{key}" if path else key
            if key not in allowed:
                where = path or None
                raise self.fail(
                    key_node,
                    where,
                    f"unknown key {shown(key)}; allowed keys are {', '.join(allowed)}",
                )
            if key in out:
                raise self.fail(key_node, sub, f"duplicate key {key!r}")
            out[key] = (key_node, value_node)
        return out

    def sequence(self, node: yaml.Node, path: str, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        return list(node.value)

    def text(self, node: yaml.Node, path: str, what: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not value:
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        return value

    def limit(self, node: yaml.Node, path: str) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(node, path, f"expected a whole number > 0, found {self.found(node)}")
        return value

    def read(self, root: yaml.Node | None) -> tuple[ApiKey, ...]:
        if root is None:
            return ()
        top = self.mapping(root, None, _TOP_KEYS, "a mapping with `keys:`")
        if "keys" not in top:
            raise self.fail(root, "keys", "missing `keys:` (a list of keys)")
        keys_node = top["keys"][1]
        if isinstance(keys_node, yaml.ScalarNode) and self.scalar(keys_node) is None:
            return ()
        keys: list[ApiKey] = []
        names: dict[str, int] = {}
        digests: dict[str, int] = {}
        for index, item in enumerate(self.sequence(keys_node, "keys", "a list of keys")):
            path = f"keys[{index}]"
            key = self.read_key(item, path)
            if key.name in names:
                raise self.fail(
                    item,
                    f"{path}.name",
                    f"duplicate name {key.name!r} (first at keys[{names[key.name]}])",
                )
            if key.digest in digests:
                raise self.fail(
                    item,
                    f"{path}.hash",
                    f"the same hash as keys[{digests[key.digest]}]: one key cannot have two names",
                )
            names[key.name] = digests[key.digest] = index
            keys.append(key)
        return tuple(keys)

    def read_key(self, item: yaml.Node, path: str) -> ApiKey:
        fields = self.mapping(item, path, _KEY_KEYS, "a key mapping (name, hash, scopes, ...)")
        for required in ("name", "hash"):
            if required not in fields:
                raise self.fail(
                    item,
                    f"{path}.{required}",
                    f"missing required key {required!r}; every key needs `name` (a plain token) "
                    f"and `hash` ({_add_hint(self.file)} writes both)",
                )
        name_node = fields["name"][1]
        name = self.scalar(name_node)
        if not isinstance(name, str):
            raise self.fail(
                name_node, f"{path}.name", f"expected a plain token, found {self.found(name_node)}"
            )
        problem = check_name(name)
        if problem is not None:
            raise self.fail(name_node, f"{path}.name", problem)
        hash_node = fields["hash"][1]
        digest = self.scalar(hash_node)
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            # Never echoed: a key pasted here by mistake must not reach a log.
            raise self.fail(
                hash_node,
                f"{path}.hash",
                f"expected {DIGEST_PREFIX} and 64 lowercase hex digits (the key's SHA-256, as "
                f"{_add_hint(self.file)} writes it), found something else; never put the key "
                "itself in this file",
            )
        scopes = frozenset({Scope.USE})
        if "scopes" in fields:
            scopes = self.read_scopes(fields["scopes"][1], f"{path}.scopes")
        models: tuple[str, ...] = ("*",)
        if "models" in fields:
            models = self.read_models(fields["models"][1], f"{path}.models")
        priority = None
        if "priority" in fields:
            node = fields["priority"][1]
            text = self.scalar(node)
            allowed = ", ".join(c.value for c in LatencyClass)
            try:
                priority = LatencyClass(text)
            except ValueError:
                raise self.fail(
                    node, f"{path}.priority", f"expected one of {allowed}, found {self.found(node)}"
                ) from None
        limits = KeyLimits()
        if "limits" in fields:
            limits = self.read_limits(fields["limits"][1], f"{path}.limits")
        return ApiKey(name, digest, scopes, models, priority, limits)

    def read_scopes(self, node: yaml.Node, path: str) -> frozenset[Scope]:
        allowed = ", ".join(s.value for s in Scope)
        out: set[Scope] = set()
        for i, entry in enumerate(self.sequence(node, path, f"a list of scopes ({allowed})")):
            value = self.scalar(entry)
            try:
                scope = Scope(value)
            except ValueError:
                raise self.fail(
                    entry, f"{path}[{i}]", f"expected one of {allowed}, found {self.found(entry)}"
                ) from None
            if scope in out:
                raise self.fail(entry, f"{path}[{i}]", f"duplicate scope {scope.value!r}")
            out.add(scope)
        if not out:
            raise self.fail(node, path, "expected at least one scope, found an empty list")
        return frozenset(out)

    def read_models(self, node: yaml.Node, path: str) -> tuple[str, ...]:
        what = "a role id, model name, alias or pattern (such as qwen-*)"
        out: list[str] = []
        for i, entry in enumerate(self.sequence(node, path, "a list of models or patterns")):
            text = self.text(entry, f"{path}[{i}]", what)
            problem = check_pattern(text)
            if problem is not None:
                raise self.fail(entry, f"{path}[{i}]", problem)
            if text not in out:
                out.append(text)
        if not out:
            raise self.fail(
                node,
                path,
                "expected at least one model or pattern, found an empty list (leave `models` "
                'out, or give ["*"], for every model)',
            )
        return tuple(out)

    def read_limits(self, node: yaml.Node, path: str) -> KeyLimits:
        fields = self.mapping(node, path, _LIMIT_KEYS, "a mapping of limits")
        values = {
            name: self.limit(value_node, f"{path}.{name}")
            for name, (_key_node, value_node) in fields.items()
        }
        return KeyLimits(**values)


_UNREADABLE: Final = object()
