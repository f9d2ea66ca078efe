"""A role's memory estimate by pool (layer 3: pure; model facts in, bytes out).

``split_llamacpp``: a llama.cpp role's estimate splits into what sits on its device
(offloaded layers' weights, their KV cache, the compute buffer, the GPU runtime's context)
and in host RAM (layers not offloaded, the token embeddings, the rest of the mapped file,
the output buffer, vocabulary, checkpoints and prompt cache), in the parts llama-server's
own memory breakdown prints; ``split_mlx``: an mlx_lm role is all in a Mac's GPU share
(and, memory being unified, in its RAM). The whole-role arithmetic it splits is
:mod:`rosterd.memory.estimate`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rosterd.memory.estimate import (
    REPACKED_TENSOR_TYPES,
    LlamaCppSettings,
    MemoryEstimate,
    MiB,
    estimate_llamacpp,
    llamacpp_cache_layout,
    llamacpp_cell_bytes,
)
from rosterd.model_facts import ModelFacts, TensorFacts

#: What a GPU backend holds on its device before any buffer: the CUDA/ROCm context, about
#: 0.5 GiB per process per device (llama.cpp PR #23137: every unpinned llama-server
#: initialises every GPU). Counted in the device's pool; llama-server's breakdown shows it
#: under "unaccounted", not "self".
DEVICE_RUNTIME_BYTES: Final[int] = 512 * MiB

#: ``-ngl`` that offloads every layer and the output layer (llama.cpp's "all").
ALL_LAYERS: Final[int] = 999


@dataclass(frozen=True, slots=True)
class PoolEstimate:
    """A llama.cpp role's estimate split between its device and the host, in bytes.

    The ``model``/``context``/``compute`` parts are what llama-server's own memory
    breakdown prints per device and for the host (``common_memory_breakdown_print``:
    model buffers, KV cache, compute buffers), so the two compare part by part.
    ``host_mapped_bytes``: the rest of the memory-mapped GGUF (tensors loaded onto the
    device and the file's header), whose pages the load touches; ``host_other_bytes``:
    what only the host holds (the output logits, the vocabulary, context checkpoints, the
    prompt cache, llama-server itself); ``device_runtime_bytes``: the GPU runtime's
    context (:data:`DEVICE_RUNTIME_BYTES`; 0 without a device). ``layers_on_device`` of
    ``layers`` repeating layers are offloaded; ``output_on_device`` says whether the
    output layer is too (``-ngl`` above the layer count).
    """

    layers: int
    layers_on_device: int
    output_on_device: bool
    device_model_bytes: int
    device_context_bytes: int
    device_compute_bytes: int
    device_runtime_bytes: int
    host_model_bytes: int
    host_context_bytes: int
    host_compute_bytes: int
    host_mapped_bytes: int
    host_other_bytes: int

    @property
    def device_bytes(self) -> int:
        """Everything on the device: model + context + compute + runtime."""
        return (
            self.device_model_bytes
            + self.device_context_bytes
            + self.device_compute_bytes
            + self.device_runtime_bytes
        )

    @property
    def host_bytes(self) -> int:
        """Everything in host RAM: model + context + compute + mapped rest + other."""
        return (
            self.host_model_bytes
            + self.host_context_bytes
            + self.host_compute_bytes
            + self.host_mapped_bytes
            + self.host_other_bytes
        )


def _layer_of(name: str) -> int | None:
    """The repeating layer a tensor belongs to (``blk.7.attn_q.weight`` -> 7), else ``None``."""
    if not name.startswith("blk."):
        return None
    index = name.split(".", 2)[1]
    return int(index) if index.isdigit() else None


def _repacked(t: TensorFacts) -> bool:
    """Whether the x86-64 CPU backend keeps a repacked copy of ``t`` (see the module doc)."""
    return t.type_name in REPACKED_TENSOR_TYPES and len(t.shape) >= 2 and t.shape[1] % 8 == 0


def split_llamacpp(
    facts: ModelFacts, settings: LlamaCppSettings, gpu_layers: int = 0
) -> PoolEstimate:
    """``estimate_llamacpp`` split by pool for ``-ngl gpu_layers`` on one device.

    llama.cpp's rules (``src/llama-model.cpp``, ``load_tensors``): the layers from
    ``block_count + 1 - gpu_layers`` on go to the device, counting the output layer as
    layer ``block_count`` (so ``-ngl 1`` offloads the output layer alone, ``-ngl N`` it
    and the last ``N - 1`` repeating layers); the token embeddings stay on the host (the
    input layer is never offloaded); a model with tied embeddings (no ``output.weight``)
    gives the output layer a copy of them. A layer's KV cache sits with the layer
    (``--kv-offload``, the default). The compute buffer is on the device once a layer is
    there, the host keeping one for the input (``n_ubatch`` embedding rows); the CPU
    backend's repacked copies are made for host tensors only. ``gpu_layers = 0``: all on
    the host, the same total as :func:`estimate_llamacpp` (the host's model part is the
    tensors it maps, the file's other bytes are ``host_mapped_bytes``).
    """
    n = facts.block_count
    ngl = max(0, min(gpu_layers, n + 1))
    first_on_device = min(n + 1 - ngl, n)
    output_on_device = ngl >= 1
    tied = not any(t.name == "output.weight" for t in facts.tensors)
    device_model = host_model = 0
    mapped_rest = max(facts.file_bytes - sum(t.n_bytes for t in facts.tensors), 0)
    for t in facts.tensors:
        layer = _layer_of(t.name)
        on_device = (layer is not None and layer >= first_on_device) or (
            layer is None and t.name.startswith("output") and output_on_device
        )
        if on_device:
            device_model += t.n_bytes
            mapped_rest += t.n_bytes
        else:
            host_model += t.n_bytes + (t.n_bytes if _repacked(t) else 0)
        if tied and output_on_device and t.name == "token_embd.weight":
            device_model += t.n_bytes
    layout = llamacpp_cache_layout(facts, settings)
    device_kv = host_kv = 0
    for layer in range(n):
        cells = layout.swa_cells if facts.swa_layers[layer] else layout.cells
        size = layout.streams * cells * llamacpp_cell_bytes(facts, settings, layer)
        if layer >= first_on_device:
            device_kv += size
        else:
            host_kv += size
    total = estimate_llamacpp(facts, settings)
    compute = _compute_bytes(facts, settings)
    other = total.overhead_bytes - compute
    if ngl > 0:
        device_compute = compute
        host_compute = layout.ubatch * facts.embedding_length * 4
    else:
        device_compute, host_compute = 0, compute
    return PoolEstimate(
        layers=n,
        layers_on_device=n - first_on_device,
        output_on_device=output_on_device,
        device_model_bytes=device_model,
        device_context_bytes=device_kv,
        device_compute_bytes=device_compute,
        device_runtime_bytes=DEVICE_RUNTIME_BYTES if ngl > 0 else 0,
        host_model_bytes=host_model,
        host_context_bytes=host_kv,
        host_compute_bytes=host_compute,
        host_mapped_bytes=mapped_rest,
        host_other_bytes=other,
    )


def _compute_bytes(facts: ModelFacts, settings: LlamaCppSettings) -> int:
    """The compute buffer of :func:`estimate_llamacpp` (activations, masks, scores, a row of
    logits)."""
    layout = llamacpp_cache_layout(facts, settings)
    ub = layout.ubatch
    q_width = facts.head_count * facts.key_length
    activations = ub * 4 * (3 * facts.feed_forward_length + 2 * facts.embedding_length + q_width)
    masks = layout.cells * ub * 2
    if any(facts.swa_layers):
        masks += layout.swa_cells * ub * 2
    scores = layout.cells * ub * facts.head_count * 4 if settings.flash_attn == "off" else 0
    return activations + masks + scores + facts.vocab_size * 4


def layers_that_fit(facts: ModelFacts, settings: LlamaCppSettings, room_bytes: int) -> int:
    """The most ``-ngl`` whose device part fits ``room_bytes``: 0 when not even the output
    layer does, ``block_count + 1`` when it and every repeating layer do."""
    best = 0
    for ngl in range(1, facts.block_count + 2):
        if split_llamacpp(facts, settings, ngl).device_bytes <= room_bytes:
            best = ngl
        else:
            break
    return best


def split_mlx(estimate: MemoryEstimate) -> PoolEstimate:
    """An mlx_lm role by pool: all of it in the Mac's GPU share (mlx wires its arrays for
    the GPU), and, the memory being unified, in host RAM too."""
    return PoolEstimate(
        layers=0,
        layers_on_device=0,
        output_on_device=True,
        device_model_bytes=estimate.weights_bytes,
        device_context_bytes=estimate.kv_bytes,
        device_compute_bytes=estimate.overhead_bytes,
        device_runtime_bytes=0,
        host_model_bytes=estimate.weights_bytes,
        host_context_bytes=estimate.kv_bytes,
        host_compute_bytes=0,
        host_mapped_bytes=0,
        host_other_bytes=estimate.overhead_bytes,
    )
