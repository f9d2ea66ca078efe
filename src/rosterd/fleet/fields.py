"""Typed reads of a composed YAML tree's fields for the fleet file (layer 2; no I/O).

Each read names the file, the field path (``nodes[1].memory_gb``), the line and column,
the value found and what was expected in its :class:`~rosterd.errors.FleetError`.
PyYAML's ``compose`` keeps those marks; its ``SafeConstructor`` builds each scalar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from rosterd.errors import FleetError


@dataclass(frozen=True)
class Unreadable:
    """A scalar PyYAML cannot construct; shown in errors with its tag."""

    tag: str
    text: str

    def __repr__(self) -> str:
        return f"{self.text!r} tagged {self.tag}"


class YamlFields:
    """The typed reads of one composed YAML file's fields, each raising :class:`FleetError`
    with the file, the field path, the line and column, the value found and what was
    expected. ``file``: the file's name in messages (``None``: text given directly);
    ``base``: the folder relative paths are read against."""

    def __init__(self, file: str | None, base: Path) -> None:
        self.file = file
        self.base = base
        self._constructor = SafeConstructor()

    # -- helpers ---------------------------------------------------------------

    def fail(self, node: yaml.Node | None, path: str | None, message: str) -> FleetError:
        mark = node.start_mark if node is not None else None
        return FleetError(
            message,
            file=self.file,
            path=path,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        )

    def found(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        return repr(self.scalar(node))

    def scalar(self, node: yaml.Node) -> object:
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            # An unknown tag (`!foo x`) or a malformed typed value: never a valid field,
            # so every check fails and reports it.
            return Unreadable(node.tag, str(node.value))

    def mapping(
        self, node: yaml.Node, path: str | None, allowed: tuple[str, ...] | None, what: str
    ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise self.fail(
                    key_node, path, f"expected text keys, found key {self.found(key_node)}"
                )
            sub = f"{path}.{key}" if path else key
            if allowed is not None and key not in allowed:
                raise self.fail(
                    key_node,
                    sub,
                    f"unknown key {key!r}; allowed keys are {', '.join(allowed)}",
                )
            if key in out:
                raise self.fail(key_node, sub, f"duplicate key {key!r}")
            out[key] = (key_node, value_node)
        return out

    def number(self, node: yaml.Node, path: str, *, minimum_exclusive: float | None) -> float:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or (minimum_exclusive is not None and value <= minimum_exclusive)
            or (minimum_exclusive is None and value < 0)
        ):
            want = "a number > 0" if minimum_exclusive is not None else "a number >= 0"
            said = f"expected {want} (GiB), found {self.found(node)}"
            if isinstance(node, yaml.ScalarNode) and node.style is None and _reads_as_number(value):
                # YAML 1.1 (PyYAML) reads 1e3 as text: its floats need a dot and a signed
                # exponent. Said, since the user wrote what looks like a number.
                said += " (text to YAML: write 1000, or 1.0e+3 with a dot and a signed exponent)"
            raise self.fail(node, path, said)
        return float(value)

    def positive_int(self, node: yaml.Node, path: str) -> int:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(node, path, f"expected a whole number > 0, found {self.found(node)}")
        return value

    def whole_number(self, node: yaml.Node, path: str) -> int:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(node, path, f"expected a whole number >= 0, found {self.found(node)}")
        return value

    def boolean(self, node: yaml.Node, path: str) -> bool:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, bool):
            raise self.fail(node, path, f"expected true or false, found {self.found(node)}")
        return value

    def text(self, node: yaml.Node, path: str, what: str = "text") -> str:
        value = self.scalar(node) if isinstance(node, yaml.ScalarNode) else None
        if not isinstance(value, str) or not value:
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        return value

    def sequence(self, node: yaml.Node, path: str, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, path, f"expected {what}, found {self.found(node)}")
        return list(node.value)

    def path_at(self, node: yaml.Node, path: str, what: str) -> Path:
        """The path text at ``node``, ``~`` expanded and relative to the fleet file's folder.

        Raises:
            FleetError: not a path, or ``~user`` names no user of this machine (found by
                fuzzing: ``Path.expanduser`` raises ``RuntimeError`` for it).
        """
        raw = self.text(node, path, what)
        try:
            candidate = Path(raw).expanduser()
        except RuntimeError:
            raise self.fail(
                node, path, f"expected {what}; {raw.split('/')[0]!r} names no user here"
            ) from None
        return candidate if candidate.is_absolute() else (self.base / candidate)


def _reads_as_number(value: object) -> bool:
    """Whether ``value`` is text that Python reads as a finite number (``'1e3'``)."""
    if not isinstance(value, str):
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False
