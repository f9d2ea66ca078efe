"""What each role needs on a device, from the figures rosterd gathered (layer 5, beside
``rosterd.memory.gathering``: pure arithmetic over what it read, through the adapter).

:func:`device_needs` gives, per role that runs on a device (a ``llamacpp`` or ``mlx_lm``
role), a :class:`rosterd.placement.devices.DeviceNeed`: for llama.cpp with the GGUF's
facts, the device bytes of every ``-ngl`` from the per-pool estimate
(``LlamaCppAdapter.split_memory``), every layer offloaded being the role's full need;
without facts, or for an mlx_lm role (all of it in a Mac's GPU share), its counted
figure whole. The roster's ``ram_gb`` counts on the device too (the largest of declared
and estimated, as everywhere: it is the operator's word on the role's size), and the
fleet entry's ``offload`` says whether a partial offload is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping

from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.flavors import DeviceUse
from rosterd.fleet import Fleet
from rosterd.memory.gathering import RoleMemory, RosterMemory, serving_settings
from rosterd.memory.split import ALL_LAYERS, PoolEstimate
from rosterd.placement.device_need import DeviceNeed


def gguf_split(figures: RoleMemory, gpu_layers: int = ALL_LAYERS) -> PoolEstimate | None:
    """``figures``' estimate by pool for ``-ngl gpu_layers``, for a role whose flavor runs on
    any device and whose weights are a readable GGUF (llama.cpp's layout, which
    ``LlamaCppAdapter.split_memory`` follows); ``None`` otherwise."""
    facts = figures.facts
    if figures.flavor.facts.devices is not DeviceUse.ANY_DEVICE or facts is None:
        return None
    if facts.format != "gguf":
        return None
    ctx, parallel, extra = serving_settings(figures.weights)
    weights = figures.weights
    return LlamaCppAdapter().split_memory(
        facts,
        ctx_size=ctx,
        parallel=parallel,
        extra_args=extra,
        keep_kv=weights.keep_kv if weights is not None else True,
        cache_ram_mb=weights.cache_ram_mb if weights is not None else None,
        gpu_layers=gpu_layers,
    )


def device_needs(
    memory: RosterMemory, fleet: Fleet, models: Mapping[str, str | None] | None = None
) -> dict[str, DeviceNeed]:
    """Role -> what it needs on a device (see the module docstring); roles whose flavor
    uses no device are left out. ``models``: role -> its roster model name, under which
    its fleet ``models:`` entry (and so its ``offload``) is found when the role id is not
    a key there, as the weights are found (``Fleet.entry_of``)."""
    needs: dict[str, DeviceNeed] = {}
    for role, figures in memory.roles.items():
        if figures.flavor.facts.devices is DeviceUse.NONE:
            continue
        entry = fleet.entry_of(role, (models or {}).get(role))
        offload = entry.offload if entry is not None else "full"
        counted = figures.counted().counted_bytes
        if gguf_split(figures, 0) is not None and figures.facts is not None:
            splits = (gguf_split(figures, n) for n in range(figures.facts.block_count + 2))
            by_layers = tuple(s.device_bytes for s in splits if s is not None)
            full = max(by_layers[-1], figures.declared_bytes)
            needs[role] = DeviceNeed(full, by_layers, offload)
        else:
            needs[role] = DeviceNeed(counted, (), offload)
    return needs
