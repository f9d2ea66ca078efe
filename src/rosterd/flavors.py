"""The flavors and what the layers below the adapters know of each (layer 1, plain values).

A flavor is which adapter runs a role (``rosterd.adapters``, one module per
flavor, registered in ``ADAPTERS``). The roster import, the fleet file and the
weights finder (layer 2) cannot ask an adapter (layer 4), so the facts they need
are kept here, one entry of :data:`FLAVOR_FACTS` per flavor: the roster's
``backend`` words that name it, the platforms it runs on, and the kind of
weights its server loads. Everything else a flavor does (its argv, probes,
memory estimate, a shared server) is its adapter's. Adding a flavor is its
adapter module, its member of :class:`InferFlavor` with its line here, and its
line in ``ADAPTERS``; nothing else asks which flavor it holds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Platform(enum.Enum):
    """A node's operating system and CPU architecture; decides which flavors it can run."""

    MACOS_ARM64 = "macos-arm64"
    LINUX_X86_64 = "linux-x86_64"
    LINUX_ARM64 = "linux-arm64"

    def supported_flavors(self) -> frozenset[InferFlavor]:
        """Flavors this platform can run (each flavor's ``platforms``): ``mlx_lm`` only on
        ``macos-arm64``; llama.cpp and ollama everywhere. Also the default ``flavors`` of
        a node."""
        return frozenset(f for f in InferFlavor if self in f.facts.platforms)


class WeightsKind(enum.Enum):
    """What a flavor's server loads, so what ``rosterd.weights`` looks for on disk."""

    #: One ``.gguf`` file, named directly or found under a folder (llama.cpp).
    GGUF_FILE = "gguf_file"
    #: A model folder with ``config.json`` and its safetensors (mlx_lm).
    MODEL_FOLDER = "model_folder"
    #: Nothing: the flavor's server keeps its own model store (ollama).
    SERVER_STORE = "server_store"


class DeviceUse(enum.Enum):
    """Which of a node's devices a flavor's server runs on (issue 29: each a memory pool)."""

    #: None that rosterd counts: the server sizes its GPU use itself (ollama).
    NONE = "none"
    #: Any declared or probed device: a GPU (``--device``) or a Mac's GPU share (llama.cpp).
    ANY_DEVICE = "any_device"
    #: Only a Mac's GPU share of unified memory (mlx_lm, which wires its arrays for Metal).
    GPU_SHARE = "gpu_share"


@dataclass(frozen=True, slots=True)
class FlavorFacts:
    """What the layers below the adapters know of one flavor.

    ``roster_backends``: the first words of a roster entry's ``backend`` (ASCII
    lowercase) that name the flavor, as the reference's roster import reads them
    (``roster.rs``); ``platforms``: where it runs; ``weights``: what its server loads;
    ``launched_slots``: its server answers at most the slots rosterd launches it with
    (llama-server's ``--parallel``) and queues the rest inside, where rosterd cannot
    count or cut them, so rosterd sends a role no more than its slots. ``devices``: which of
    a node's devices its server runs on (:class:`DeviceUse`).
    """

    roster_backends: tuple[str, ...]
    platforms: frozenset[Platform]
    weights: WeightsKind
    launched_slots: bool = False
    devices: DeviceUse = DeviceUse.NONE


class InferFlavor(enum.Enum):
    """Which adapter runs a role (as roster.rs ``InferFlavor``), with its ``facts``."""

    MLX_LM = "mlx_lm"
    LLAMACPP = "llamacpp"
    OLLAMA = "ollama"

    @property
    def id(self) -> str:
        """The flavor's stable id: ``mlx_lm``, ``llamacpp`` or ``ollama``."""
        return str(self.value)

    @property
    def facts(self) -> FlavorFacts:
        """What the layers below the adapters know of this flavor (:data:`FLAVOR_FACTS`)."""
        return FLAVOR_FACTS[self]


#: Every flavor's facts (a test checks that each member of ``InferFlavor`` has its entry).
FLAVOR_FACTS: Mapping[InferFlavor, FlavorFacts] = MappingProxyType(
    {
        InferFlavor.MLX_LM: FlavorFacts(
            roster_backends=("mlx_lm", "mlx-lm"),
            platforms=frozenset({Platform.MACOS_ARM64}),  # mlx runs on Apple silicon
            weights=WeightsKind.MODEL_FOLDER,
            devices=DeviceUse.GPU_SHARE,
        ),
        InferFlavor.LLAMACPP: FlavorFacts(
            roster_backends=("llamacpp", "llama.cpp", "llama-server"),
            platforms=frozenset(Platform),
            weights=WeightsKind.GGUF_FILE,
            launched_slots=True,
            devices=DeviceUse.ANY_DEVICE,
        ),
        InferFlavor.OLLAMA: FlavorFacts(
            roster_backends=("ollama",),
            platforms=frozenset(Platform),
            weights=WeightsKind.SERVER_STORE,
        ),
    }
)
