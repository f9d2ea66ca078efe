"""Inference specs: one role's validated serving facts (layer 1, no I/O).

Frozen dataclasses rather than pydantic models: the values are built by our own
importer (which already reports field paths and lines), so a second validation
layer would only add a second way to fail. Closed sets are enums.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from rosterd.errors import SpecError
from rosterd.flavors import InferFlavor
from rosterd.tokens import valid_token

#: ``InferFlavor`` is re-exported: a spec's flavor (defined with its facts in ``rosterd.flavors``).
__all__ = ["InferFlavor", "InferenceSpec", "LatencyClass", "MemorySpec", "ServeSpec"]


class LatencyClass(enum.Enum):
    """``interactive`` roles stay resident; ``batch`` roles may wait for a load."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class ServeSpec:
    """Where the role's server listens: ``port`` 1..65535, or ``None`` to let rosterd choose."""

    port: int | None = None


@dataclass(frozen=True, slots=True)
class MemorySpec:
    """Memory a role needs when resident, in bytes.

    ``weights_bytes`` comes from the roster's ``ram_gb``; ``kv_bytes`` and
    ``overhead_bytes`` are 0 until an estimator fills them (the seam for it).
    """

    weights_bytes: int = 0
    kv_bytes: int = 0
    overhead_bytes: int = 0

    @property
    def resident_bytes(self) -> int:
        """``weights_bytes + kv_bytes + overhead_bytes``: what residency counts against capacity."""
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes


@dataclass(frozen=True, slots=True)
class InferenceSpec:
    """One role's validated serving facts.

    Defaults are the seed's ``InferenceSpec::new(role, flavor)``: no model, no
    port, 0 weight bytes, sticky, ``batch``, no excludes.
    """

    role: str
    flavor: InferFlavor
    model: str | None = None
    serve: ServeSpec = field(default_factory=ServeSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    sticky: bool = True
    latency_class: LatencyClass = LatencyClass.BATCH
    excludes: tuple[str, ...] = ()

    @property
    def interactive(self) -> bool:
        """Whether the role is ``interactive`` (kept resident)."""
        return self.latency_class is LatencyClass.INTERACTIVE

    def excluded_roles(self) -> frozenset[str]:
        """The roles named in ``excludes``, each with one leading ``role:`` stripped."""
        return frozenset(e.removeprefix("role:") for e in self.excludes)

    def validate(self) -> None:
        """Check the spec as the seed's ``InferenceSpec::validate()``: first failure wins.

        Raises:
            SpecError: with the seed's exact text, one of ``role is not a plain
                token``, ``port 0 is not a usable port``, ``memory.weights_bytes
                is zero``, ``excludes entry "<e>" is not a role`` (``e`` quoted as
                Rust's ``{:?}``), ``a role cannot exclude itself``.
        """
        from rosterd.rust_debug import rust_debug_str

        if not valid_token(self.role, 64):
            raise SpecError("role is not a plain token")
        if self.serve.port == 0:
            raise SpecError("port 0 is not a usable port")
        if self.memory.weights_bytes == 0:
            raise SpecError("memory.weights_bytes is zero")
        for entry in self.excludes:
            rest = entry.removeprefix("role:")
            if not valid_token(rest, 64):
                raise SpecError(f"excludes entry {rust_debug_str(entry)} is not a role")
            if rest == self.role:
                raise SpecError("a role cannot exclude itself")
