"""``rosterd models ROSTER [--overlay F] [--fleet F] [--json]``: every role's resolved weights
and the memory estimate made from them (layer 8).

Per role: where its weights are (path), their format, architecture, parameter
count, quantization and trained context, the serving context and slots, and the
estimate in its parts (weights, KV cache, overhead, each with where it came from),
beside the roster's ``ram_gb``; a role without readable weights says why. The
figures come from ``rosterd.memory.gathering`` (no state folder: measured peaks are
``plan``'s and ``ps``'s). ``--json`` prints ``{"models": {role: {...}}}``.

On a fleet that declares devices, a llama.cpp role with readable weights also shows its
estimate by pool with every layer offloaded (``split_llamacpp``): on the device (model,
KV cache, compute, the GPU runtime) and in host RAM; ``--json`` adds it as ``by_pool``.

The readers (``gguf``'s tables, ``huggingface_hub``) are imported when the command
runs, not when ``rosterd`` starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rosterd.cli import app, make_console
from rosterd.cli.edge import errors_as_json

if TYPE_CHECKING:
    from rosterd.memory.gathering import RoleMemory
    from rosterd.memory.split import PoolEstimate


def by_pool(memory: RoleMemory) -> PoolEstimate | None:
    """``memory``'s estimate split by pool with every layer on a device
    (``rosterd.memory.by_pool.gguf_split``), or ``None`` (a flavor that splits no GGUF, or
    no readable weights)."""
    from rosterd.memory.by_pool import gguf_split

    return gguf_split(memory)


def pool_to_json(split: PoolEstimate) -> dict[str, object]:
    """``by_pool`` of ``--json``: device and host bytes, and their parts."""
    return {
        "device_bytes": split.device_bytes,
        "host_bytes": split.host_bytes,
        "device": {
            "model": split.device_model_bytes,
            "context": split.device_context_bytes,
            "compute": split.device_compute_bytes,
            "runtime": split.device_runtime_bytes,
        },
        "host": {
            "model": split.host_model_bytes,
            "context": split.host_context_bytes,
            "compute": split.host_compute_bytes,
            "mapped": split.host_mapped_bytes,
            "other": split.host_other_bytes,
        },
    }


def kv_keeping(memory: RoleMemory) -> dict[str, object] | None:
    """Whether ``rosterd up`` keeps the role's KV cache across swaps: ``{"kept": bool,
    "why": str}`` (``why`` empty when kept), for a role whose backend can save its slots and
    whose weights were read; ``None`` otherwise. Not kept: the fleet entry's ``keep_kv:
    false``, or an architecture that cannot reuse a restored slot
    (``rosterd.model_facts.slot_reuse``; with the KV kept the backend is launched with
    ``--swa-full``, so a sliding-window model's is kept)."""
    from rosterd.adapters import adapter_for
    from rosterd.model_facts.slot_reuse import SWA_FULL_FLAG, slot_reuse

    facts, weights = memory.facts, memory.weights
    if facts is None or weights is None or adapter_for(memory.flavor).slot_keeping is None:
        return None
    if not weights.keep_kv:
        return {"kept": False, "why": "the fleet's models entry says keep_kv: false"}
    reuse = slot_reuse(
        facts.architecture,
        sliding_window=facts.sliding_window,
        swa_full=weights.keep_kv or SWA_FULL_FLAG in weights.extra_args,
    )
    return {"kept": reuse.reusable, "why": reuse.why}


def model_to_json(memory: RoleMemory) -> dict[str, object]:
    """One role's entry of ``--json``: ``flavor``, ``weights`` (``path``, ``format``,
    ``architecture``, ``parameter_count``, ``quantization``, ``context_length``, or
    ``None``), ``ctx_size``, ``parallel``, ``reranker`` (its backend serves ``/v1/rerank``,
    ``rosterd.weights.serves_rerank``; ``None`` without weights), ``declared_bytes``,
    ``declared_unmeasured``, ``estimate`` (parts, notes, or ``None``), ``estimate_note``
    and ``kv_kept`` (:func:`kv_keeping`)."""
    from rosterd.memory.gathering import serving_settings

    facts = memory.facts
    estimate = memory.estimate
    ctx, parallel, extra = serving_settings(memory.weights)
    return {
        "flavor": memory.flavor.id,
        "weights": None
        if facts is None
        else {
            "path": str(facts.path),
            "format": facts.format,
            "architecture": facts.architecture,
            "parameter_count": facts.parameter_count,
            "quantization": facts.file_type,
            "context_length": facts.context_length,
        },
        "ctx_size": ctx if memory.weights is not None else None,
        "parallel": parallel if memory.weights is not None else None,
        "extra_args": list(extra),
        "reranker": memory.weights.reranking if memory.weights is not None else None,
        "declared_bytes": memory.declared_bytes,
        "declared_unmeasured": memory.declared_unmeasured,
        "estimate": None
        if estimate is None
        else {
            "total_bytes": estimate.total_bytes,
            "weights_bytes": estimate.weights_bytes,
            "kv_bytes": estimate.kv_bytes,
            "overhead_bytes": estimate.overhead_bytes,
            "weights_note": estimate.weights_note,
            "kv_note": estimate.kv_note,
            "overhead_note": estimate.overhead_note,
            "notes": list(estimate.notes),
        },
        "estimate_note": memory.estimate_note,
        "kv_kept": kv_keeping(memory),
    }


@app.command("models")
def models_cmd(
    ctx: typer.Context,
    roster: Annotated[Path, typer.Argument(help="The roster YAML file (read only).")],
    overlay: Annotated[
        Path | None,
        typer.Option("--overlay", help="Overlay YAML: excludes, latency_class, sticky."),
    ] = None,
    fleet: Annotated[
        Path | None,
        typer.Option("--fleet", help="Fleet YAML (nodes, models); default: this machine alone."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the models as JSON.")] = False,
) -> None:
    """List every role's weights and the memory estimate made from them, in its parts.

    Per role: path, format, architecture, parameter count, quantization, context."""
    if as_json:
        errors_as_json(ctx)
    from rich.table import Table
    from rich.text import Text

    from rosterd.fleet.local import local_fleet
    from rosterd.fleet.reader import load_fleet
    from rosterd.memory.count import show_declared, show_gb
    from rosterd.memory.gathering import gather_memory, serving_settings
    from rosterd.roster.importer import load_roster
    from rosterd.weights import separate_aliases

    nodes = load_fleet(fleet) if fleet is not None else local_fleet()
    imported = separate_aliases(load_roster(roster, overlay), nodes)
    memory = gather_memory(imported, nodes, None)
    for warning in imported.warnings:
        typer.echo(f"warning: {warning}", err=True)
    devices = any(n.devices for n in nodes.nodes)
    if as_json:
        models: dict[str, dict[str, object]] = {}
        for role, m in memory.roles.items():
            models[role] = model_to_json(m)
            split = by_pool(m) if devices else None
            if split is not None:
                models[role]["by_pool"] = pool_to_json(split)
        typer.echo(json.dumps({"models": models}, indent=2))
        return
    out = make_console()
    table = Table(title="models", title_justify="left")
    for column in ("role", "flavor", "weights", "ram_gb", "estimate", "of which"):
        table.add_column(column, overflow="fold")
    for role, m in memory.roles.items():
        facts, estimate = m.facts, m.estimate
        if facts is None:
            weights = Text(m.estimate_note or "-")
        else:
            ctx_size, parallel, _ = serving_settings(m.weights)
            weights = Text(
                f"{facts.path}\n{facts.format}, {facts.architecture}, "
                f"{facts.parameter_count / 1e6:.1f} M parameters, {facts.file_type}, "
                f"trained context {facts.context_length}; served at ctx {ctx_size} "
                f"x {parallel} slot(s)"
                + ("; a reranker (/v1/rerank)" if m.weights and m.weights.reranking else "")
            )
            keeping = kv_keeping(m)
            if keeping is not None and not keeping["kept"]:
                weights.append(f"\nKV cache not kept across swaps: {keeping['why']}")
        parts = (
            Text(
                f"weights {show_gb(estimate.weights_bytes)}: {estimate.weights_note}\n"
                f"KV cache {show_gb(estimate.kv_bytes)}: {estimate.kv_note}\n"
                f"overhead {show_gb(estimate.overhead_bytes)}: {estimate.overhead_note}"
            )
            if estimate is not None
            else Text("-")
        )
        split = by_pool(m) if devices else None
        if split is not None:
            parts.append(
                f"\nby pool, every layer on a device: device {show_gb(split.device_bytes)} "
                f"(model {show_gb(split.device_model_bytes)}, KV cache "
                f"{show_gb(split.device_context_bytes)}, compute "
                f"{show_gb(split.device_compute_bytes)}, GPU runtime "
                f"{show_gb(split.device_runtime_bytes)}); host {show_gb(split.host_bytes)} "
                f"(token embeddings {show_gb(split.host_model_bytes)}, the rest of the "
                f"mapped file, buffers and llama-server)"
            )
        table.add_row(
            Text(role),
            m.flavor.id,
            weights,
            show_declared(m.declared_bytes, m.declared_unmeasured),
            show_gb(estimate.total_bytes) if estimate is not None else "-",
            parts,
        )
    out.print(table)
