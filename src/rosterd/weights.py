"""Weights resolution: where a role's weights are on disk, never downloading.

A role's weights come, in this order, from:

1. the fleet file's ``models:`` map, keyed by role id (most specific) or by the
   roster's model name;
2. the local Hugging Face cache, for the role's repo (the roster's ``repo``,
   else a model name shaped ``org/name``), read with ``huggingface_hub`` in
   ``local_files_only`` mode, so nothing is fetched;
3. otherwise a ``WeightsError`` naming every place looked at.

Every path must stay inside the configured model roots (the fleet's
``model_roots``; for the Hugging Face cache, the cache folder itself) after
symlinks are resolved, so a fleet file cannot point a backend at arbitrary files.
What "weights" are depends on the flavor's weights kind (``InferFlavor.facts.weights``,
:class:`rosterd.flavors.WeightsKind`): a ``.gguf`` file (``llamacpp``), a model folder
with ``config.json`` (``mlx_lm``), or none when its server keeps its own store
(``ollama``). This module asks for the kind, never for the flavor. huggingface_hub is
used because it is the cache's own reader (layout, refs, snapshots).

Whether the weights are a reranker is settled here too, once, for the launch and the
router alike (:func:`serves_rerank`): ``--reranking`` in the entry's ``extra_args``, else
its ``reranking``, else a GGUF whose pooling type is rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from rosterd.errors import ModelFactsError, WeightsError
from rosterd.flavors import WeightsKind
from rosterd.fleet import Fleet, ModelSource
from rosterd.fleet.model import RERANKING_FLAGS
from rosterd.model_facts import POOLING_TYPE_RANK
from rosterd.model_facts.gguf_file import read_gguf_pooling_type
from rosterd.roster import ImportedRoster
from rosterd.spec import InferenceSpec


@runtime_checkable
class WeightsSource(Protocol):
    """Where a role's weights are and how to serve them (``rosterd.fleet.ModelSource`` fits).

    ``path`` is absolute (a GGUF file for llama.cpp, a model folder for mlx_lm);
    ``ctx_size`` (tokens) and ``parallel`` (slots) are ``None`` for the
    adapter's default; ``extra_args`` are appended to the argv as given.
    """

    @property
    def path(self) -> Path: ...
    @property
    def ctx_size(self) -> int | None: ...
    @property
    def parallel(self) -> int | None: ...
    @property
    def extra_args(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class ResolvedWeights:
    """A ``WeightsSource`` built by ``rosterd.weights`` (e.g. from the Hugging Face cache).

    ``size_bytes`` is the weights' size on disk (0 if unknown); ``grace_s``: the
    backend's SIGTERM-to-SIGKILL time from the fleet's ``models:`` entry (``None``:
    the supervisor's); ``keep_kv`` and ``cache_ram_mb`` as the entry's
    (``rosterd.fleet.ModelSource``); ``reranking``: the backend serves ``/v1/rerank``
    (:func:`serves_rerank`).
    """

    path: Path
    ctx_size: int | None = None
    parallel: int | None = None
    extra_args: tuple[str, ...] = ()
    size_bytes: int = 0
    grace_s: float | None = None
    keep_kv: bool = True
    cache_ram_mb: int | None = None
    reranking: bool = False


def serves_rerank(
    reranking: bool | None, extra_args: Sequence[str], path: Path, kind: WeightsKind
) -> bool:
    """Whether a role's backend serves ``/v1/rerank``: yes when ``extra_args`` has
    llama-server's ``--reranking`` (``RERANKING_FLAGS``: it is passed as given), else
    ``reranking`` (the fleet's ``models:`` entry) when it says, else whether ``path`` is a
    GGUF file (``kind``) whose pooling type is rank (llama.cpp's
    ``LLAMA_POOLING_TYPE_RANK``, what reranker GGUFs are written with). A GGUF whose
    header cannot be read is no reranker: its backend fails to load it, and that failure
    says why."""
    if RERANKING_FLAGS & set(extra_args):
        return True
    if reranking is not None:
        return reranking
    if kind is not WeightsKind.GGUF_FILE:
        return False
    try:
        return read_gguf_pooling_type(path) == POOLING_TYPE_RANK
    except ModelFactsError:
        return False


def resolve_weights(
    spec: InferenceSpec,
    *,
    models: Mapping[str, WeightsSource],
    model_roots: Sequence[Path],
    repo: str | None = None,
    hf_cache_dir: Path | None = None,
) -> ResolvedWeights | None:
    """The weights to serve ``spec`` with, or ``None`` when its flavor's server keeps its own
    (``WeightsKind.SERVER_STORE``: ollama needs no path).

    ``models`` is the fleet's ``models:`` map (``rosterd.fleet.ModelSource``
    values fit); ``model_roots`` the folders its paths must stay inside;
    ``repo`` the roster entry's Hugging Face repo; ``hf_cache_dir`` the
    Hugging Face hub cache (``None``: huggingface_hub's default, which honours
    ``HF_HUB_CACHE``/``HF_HOME``). The result's ``size_bytes`` is the weights'
    size on disk.

    Raises:
        WeightsError: the path is outside every model root, does not exist,
            is the wrong kind for the flavor, or nothing was found (the
            message lists the keys, repo and cache looked at).
    """
    kind = spec.flavor.facts.weights
    if kind is WeightsKind.SERVER_STORE:
        return None
    keys = [spec.role] + ([spec.model] if spec.model and spec.model != spec.role else [])
    for key in keys:
        source = models.get(key)
        if source is not None:
            where = f"models: {key}"
            _inside_roots(spec, where, source.path, model_roots)
            path = _weights_of_kind(spec, kind, source.path.absolute(), where)
            _inside_roots(spec, where, path, model_roots)
            extra = tuple(source.extra_args)
            return ResolvedWeights(
                path=path,
                ctx_size=source.ctx_size,
                parallel=source.parallel,
                extra_args=extra,
                size_bytes=_size_on_disk(path),
                grace_s=getattr(source, "grace_s", None),
                keep_kv=bool(getattr(source, "keep_kv", True)),
                cache_ram_mb=getattr(source, "cache_ram_mb", None),
                reranking=serves_rerank(getattr(source, "reranking", None), extra, path, kind),
            )

    repo_id = repo or (spec.model if spec.model and "/" in spec.model else None)
    cache_note = "no Hugging Face repo known for it"
    if repo_id is not None:
        snapshot, cache_root = _hf_snapshot(repo_id, hf_cache_dir)
        if snapshot is not None:
            where = f"Hugging Face cache {repo_id}"
            path = _weights_of_kind(spec, kind, snapshot, where)
            _inside_roots(spec, where, path, [cache_root])
            return ResolvedWeights(
                path=path,
                size_bytes=_size_on_disk(path),
                reranking=serves_rerank(None, (), path, kind),
            )
        cache_note = f"repo {repo_id} is not in the Hugging Face cache at {cache_root}"
    looked = ", ".join(repr(k) for k in keys)
    raise WeightsError(
        f"role {spec.role}: no weights found: the fleet file's models: has no entry "
        f"{looked}, and {cache_note}; add a models: entry with the path "
        "(rosterd never downloads weights while serving)"
    )


def resolve_for_fleet(
    spec: InferenceSpec,
    fleet: Fleet,
    *,
    repo: str | None = None,
    hf_cache_dir: Path | None = None,
) -> ResolvedWeights | None:
    """``resolve_weights`` with the fleet's ``models`` and ``model_roots``.

    Raises:
        WeightsError: as ``resolve_weights``.
    """
    return resolve_weights(
        spec,
        models=fleet.models,
        model_roots=fleet.model_roots,
        repo=repo,
        hf_cache_dir=hf_cache_dir,
    )


def _inside_roots(spec: InferenceSpec, key: str, path: Path, roots: Sequence[Path]) -> Path:
    """``path`` with symlinks resolved, if it exists and lies inside one of ``roots``.

    Callers serve the unresolved path: a Hugging Face snapshot's ``x.gguf`` is a
    symlink to a blob without the suffix the server and adapter look at.
    """
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise WeightsError(f"role {spec.role}: {key}: {path} does not exist") from None
    if not roots:
        raise WeightsError(
            f"role {spec.role}: {key}: {path} cannot be used: no model_roots are configured"
        )
    for root in roots:
        try:
            real_root = root.resolve()
        except (OSError, RuntimeError):
            continue
        if real == real_root or real.is_relative_to(real_root):
            return real
    shown = ", ".join(str(r) for r in roots)
    raise WeightsError(
        f"role {spec.role}: {key}: {path} (really {real}) is outside the model roots ({shown})"
    )


def _weights_of_kind(spec: InferenceSpec, kind: WeightsKind, path: Path, where: str) -> Path:
    """The file or folder of ``kind`` that the flavor's server loads, at or under ``path``."""
    if kind is WeightsKind.GGUF_FILE:
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise WeightsError(f"role {spec.role}: {where}: {path} is not a .gguf file")
            return path
        candidates = sorted(p for p in path.rglob("*.gguf") if p.is_file())
        if spec.model and len(candidates) > 1:
            wanted = spec.model.rsplit("/", 1)[-1].lower()
            named = [p for p in candidates if wanted in p.name.lower()]
            if len(named) == 1:
                return named[0]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            raise WeightsError(f"role {spec.role}: {where}: no .gguf file in {path}")
        names = ", ".join(p.name for p in candidates[:8])
        raise WeightsError(
            f"role {spec.role}: {where}: several .gguf files in {path} ({names}); "
            "name the file in the fleet file's models:"
        )
    # WeightsKind.MODEL_FOLDER
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise WeightsError(
            f"role {spec.role}: {where}: {path} is not an MLX model folder (no config.json)"
        )
    return path


def _hf_snapshot(repo_id: str, cache_dir: Path | None) -> tuple[Path | None, Path]:
    """The cached snapshot folder of ``repo_id`` (or ``None``) and the cache root looked in."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    root = Path(cache_dir) if cache_dir is not None else Path(constants.HF_HUB_CACHE)
    try:
        found = snapshot_download(repo_id, cache_dir=str(root), local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None, root
    return Path(str(found)), root


def _size_on_disk(path: Path) -> int:
    """Bytes of ``path``, or of every file under it for a folder (symlinks followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _source_words(role: str, source: ModelSource | None) -> str:
    return f"{role}: {source.path}" if source is not None else f"{role}: no models: entry"


def separate_aliases(roster: ImportedRoster, fleet: Fleet) -> ImportedRoster:
    """``roster`` with every alias that ``fleet`` gives other weights served on its own.

    The import skips an entry as an alias of an earlier one on the same backend, port and
    repo (as roster.rs, which cannot see the fleet), so a request for it reaches the
    earlier entry's server. When the fleet's ``models:`` gives the alias an entry of its
    own (by role id or model name) that differs from its target's (another file, or the
    same file with other settings), serving it there would answer on weights the fleet
    does not give it: the alias becomes a role of its own (the spec the import would have
    made of it, ``ImportedRoster.alias_specs``), leaves ``skipped`` and ``aliases``, and
    one warning names both files. An alias with no entry of its own, or the same entry as
    its target (or as an alias already separated from that target), stays an alias of
    that one. Specs stay in roster order. ``rosterd roster import`` prints the import
    itself, unchanged; ``plan`` and ``up`` plan and serve this.
    """
    specs = list(roster.specs)
    ids = {s.spec.role for s in specs}
    aliases = dict(roster.aliases)
    separated: dict[str, list[tuple[str, ModelSource]]] = {}  # target -> split-off aliases
    warnings: list[str] = []
    for alias, target in roster.aliases.items():
        own = roster.alias_specs.get(alias)
        first = roster.get(target)
        if own is None or first is None or alias in ids:
            continue
        source = fleet.entry_of(alias, own.spec.model)
        target_source = fleet.entry_of(target, first.spec.model)
        if source is None or source == target_source:
            continue
        same = next((r for r, s in separated.get(target, ()) if s == source), None)
        if same is not None:
            aliases[alias] = same
            continue
        separated.setdefault(target, []).append((alias, source))
        del aliases[alias]
        ids.add(alias)
        specs.append(own)
        other = (
            "the same file with other settings"
            if target_source is not None and target_source.path == source.path
            else "other weights"
        )
        warnings.append(
            f"roster entry {alias!r} (line {own.line}): the roster import makes it an alias "
            f"of {target!r} (same backend, port and repo), but the fleet's models: gives it "
            f"{other} ({_source_words(alias, source)}; {_source_words(target, target_source)}"
            f"); rosterd plans and serves {alias!r} as a role of its own on {source.path}"
        )
    if not warnings:
        return roster
    split = {alias for group in separated.values() for alias, _ in group}
    return replace(
        roster,
        specs=tuple(sorted(specs, key=lambda s: s.line)),
        skipped=tuple((i, why) for i, why in roster.skipped if i not in split),
        warnings=(*roster.warnings, *warnings),
        aliases=MappingProxyType(aliases),
        alias_specs=MappingProxyType(
            {a: s for a, s in roster.alias_specs.items() if a not in split}
        ),
        served_apart=(*roster.served_apart, *sorted(split)),
    )


def import_summary(imported: ImportedRoster, served: ImportedRoster) -> str:
    """What ``plan`` says of the roster: ``imported`` as the import made it (``rosterd
    roster import``'s counts) and ``served`` as :func:`separate_aliases` made it for the
    fleet, so both commands count the same entries, and an alias served as a role of its
    own is named as such (the import calls it an alias; ``plan`` and ``up`` serve it)."""
    apart = sorted(set(imported.aliases) - set(served.aliases))
    entries = "entry" if len(imported.skipped) == 1 else "entries"
    said = (
        f"{len(imported.specs)} roles imported, {len(imported.skipped)} roster {entries} "
        "skipped (see `rosterd roster import`)"
    )
    if apart:
        names = ", ".join(apart)
        said += (
            f"; of those skipped as aliases, {len(apart)} ({names}) planned as roles of their "
            "own: the fleet's models: gives them other weights than the role they alias"
        )
    return said
