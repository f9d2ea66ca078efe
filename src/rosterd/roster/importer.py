"""The roster import (layer 2): the lab's roster file in, validated inference specs out.

:func:`import_roster` reads the entries (:mod:`rosterd.roster.entries`) and
turns each into a spec or a skip with the reference's reason, entry by entry
as roster.rs ``import_roster``: a plain-token id, a backend with an adapter
(:func:`flavor_for_backend`), not an alias of an earlier entry, a ``ram_gb``
(:func:`ram_bytes`), then ``InferenceSpec::validate``. :func:`load_roster`
reads the files first. An alias whose ``name`` differs from its target's gets
a warning, and so does an entry skipped for a backend close to a known name
(``lama.cpp``: "did you mean `llama.cpp`?"; difflib, as for the other hints).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from types import MappingProxyType
from typing import Final

from rosterd.errors import SpecError
from rosterd.roster._rust_std import (
    rust_ascii_lowercase,
    rust_parse_f64,
    rust_split_whitespace,
    rust_trim,
)
from rosterd.roster._serde_yaml import DocumentReader, Number, ReadError
from rosterd.roster.document import (
    MAX_OVERLAY_BYTES,
    MAX_ROSTER_BYTES,
    LocatedError,
    as_bytes,
    located,
    parse_document,
    read_file,
)
from rosterd.roster.entries import RawEntry, entry_where, read_roster
from rosterd.roster.overlay import RosterOverlay, overlay_warnings
from rosterd.roster.result import ImportedRoster, ImportedSpec
from rosterd.rust_debug import rust_debug_str
from rosterd.spec import InferenceSpec, InferFlavor, LatencyClass, MemorySpec, ServeSpec
from rosterd.tokens import GB, valid_token

_MAX_RAM_GB: Final = 4096.0
#: The backend names ``flavor_for_backend`` knows (first word, lowercased): each flavor's own.
_BACKEND_NAMES: Final = tuple(name for f in InferFlavor for name in f.facts.roster_backends)
#: Backends a lab lists that have no adapter on purpose: no "did you mean" for them.
_NOT_SERVED: Final = frozenset(
    f"mlx{sep}{kind}" for sep in "-_" for kind in ("vlm", "embeddings", "whisper", "audio")
)
#: How close an unknown backend must be to a known name for a "did you mean" (difflib's ratio).
_BACKEND_CUTOFF: Final = 0.8


def flavor_for_backend(backend: str) -> InferFlavor | None:
    """The adapter flavor the roster's ``backend`` text names (as roster.rs).

    The first whitespace-separated word (Unicode White_Space, as Rust's
    ``split_whitespace``), ASCII-lowercased: ``mlx_lm``/``mlx-lm`` → MLX_LM,
    ``llamacpp``/``llama.cpp``/``llama-server`` → LLAMACPP, ``ollama`` → OLLAMA;
    anything else (``mlx-vlm``, ``mlx-audio``, empty) → ``None``. The words are each
    flavor's ``facts.roster_backends`` (``rosterd.flavors``).
    """
    words = rust_split_whitespace(backend)
    if not words:
        return None
    first = rust_ascii_lowercase(words[0])
    return next((f for f in InferFlavor if first in f.facts.roster_backends), None)


def flavor_near(word: str) -> InferFlavor | None:
    """The flavor ``word`` names as a roster ``backend`` would (:func:`flavor_for_backend`:
    ``llama.cpp``, ``LLAMA-SERVER``), or nearly names (one of those words within difflib's
    ratio ``_BACKEND_CUTOFF``: ``lama.cpp``); ``None`` otherwise, and for the backends
    known to have no adapter (``mlx-vlm`` ...). For "did you mean" hints elsewhere (the
    fleet file names flavors by id).
    """
    exact = flavor_for_backend(word)
    if exact is not None:
        return exact
    words = rust_split_whitespace(word)
    if not words or rust_ascii_lowercase(words[0]) in _NOT_SERVED:
        return None
    first = rust_ascii_lowercase(words[0])
    close = difflib.get_close_matches(first, _BACKEND_NAMES, n=1, cutoff=_BACKEND_CUTOFF)
    return flavor_for_backend(close[0]) if close else None


def ram_bytes(value: object) -> int | None:
    """Weight bytes for a ``ram_gb`` value (as roster.rs ``ram_bytes``), or ``None``.

    A number, or a string trimmed of whitespace and of every leading ``~`` then
    read by Rust's ``f64`` grammar; finite and within 0..=4096 GiB; bytes are
    ``trunc(gb * 2^30)``.
    """
    if isinstance(value, Number):
        gb = value.as_f64()
    elif isinstance(value, str):
        parsed = rust_parse_f64(rust_trim(value).lstrip("~"))
        if parsed is None:
            return None
        gb = parsed
    else:
        return None
    if not (gb == gb and abs(gb) != float("inf") and 0.0 <= gb <= _MAX_RAM_GB):
        return None
    return int(gb * float(GB))


def is_unmeasured_ram_gb(value: object) -> bool:
    """Whether a roster ``ram_gb`` value is a guess: a string whose trimmed text starts with ``~``.

    The import reads ``"~10"`` as 10 GiB (:func:`ram_bytes` strips every leading
    ``~``, as roster.rs does); this keeps the mark it drops, so views can show the
    figure as unmeasured.
    """
    return isinstance(value, str) and rust_trim(value).startswith("~")


def import_roster(
    text: str | bytes, overlay: RosterOverlay | None = None, *, file: str | None = None
) -> ImportedRoster:
    """Import roster YAML (as roster.rs ``import_roster``).

    ``text`` is the file's bytes (or text); ``overlay`` supplies excludes,
    latency classes and stickiness; ``file`` names the file in errors.

    Raises:
        RosterError: the whole file is rejected (over 1 MiB, not UTF-8, not
            one YAML document, a wrong type or a duplicate for a known field,
            a missing ``id``, over 256 entries, ...), naming the file, field
            path, line and column, what was found and what was expected.
    """
    overlay = overlay or RosterOverlay()
    data = as_bytes(text, file=file, what="roster", limit=MAX_ROSTER_BYTES)
    document = parse_document(data, file=file)
    reader = DocumentReader(document)
    try:
        raws, warnings = read_roster(reader, document, file=file)
    except LocatedError as err:
        raise err.to_error(file) from None
    except ReadError as err:
        raise located(err, "roster").to_error(file) from None
    warnings += overlay.warnings
    warnings += overlay_warnings(overlay, [raw.id for raw in raws])
    return _import_entries(raws, overlay, warnings, file)


def load_roster(path: Path, overlay_path: Path | None = None) -> ImportedRoster:
    """Read the roster at ``path`` (opened read-only, never written) and import it.

    Raises:
        RosterError: the roster or overlay cannot be read or is rejected; the
            message names the file.
    """
    overlay = None
    if overlay_path is not None:
        overlay_data = read_file(overlay_path, MAX_OVERLAY_BYTES, "overlay")
        overlay = RosterOverlay.from_yaml(overlay_data, file=str(overlay_path))
    data = read_file(path, MAX_ROSTER_BYTES, "roster")
    return import_roster(data, overlay, file=str(path))


def _alias_name_warning(index: int, alias: RawEntry, target: RawEntry) -> str:
    """The warning for an alias entry whose ``name`` differs from its target's.

    ``index`` is the alias entry's 0-based position in the roster. The entry is
    skipped as an alias (same flavor, port and repo as ``target``), so requests
    for it are served by the target's model although its name says otherwise.
    """
    alias_id, target_id = rust_debug_str(alias.id), rust_debug_str(target.id)
    return (
        f"roster[{index}] (id {alias_id}, line {alias.line}): skipped as an alias of "
        f"{target_id} (line {target.line}), which has the same backend flavor, port and repo, "
        f"but it is named {rust_debug_str(alias.name)} where {target_id} is named "
        f"{rust_debug_str(target.name)}; requests for {alias_id} are served by {target_id}. "
        f"Give {alias_id} its own `port` or `repo` to serve it separately (entries on the "
        "same backend without port and repo are aliases of each other), or the same "
        "`name` if it is meant as an alias"
    )


def _backend_warning(file: str | None, index: int, raw: RawEntry) -> str | None:
    """A "did you mean" for an entry skipped for its ``backend``, when the backend's first
    word is close to a name the import knows (``lama.cpp`` for ``llama.cpp``), else ``None``.
    Backends known to have no adapter (``mlx-vlm`` ...) get none."""
    words = rust_split_whitespace(raw.backend)
    if not words:
        return None
    first = rust_ascii_lowercase(words[0])
    if first in _NOT_SERVED:
        return None
    close = difflib.get_close_matches(first, _BACKEND_NAMES, n=1, cutoff=_BACKEND_CUTOFF)
    if not close:
        return None
    where = entry_where(file, raw.backend_line, f"roster[{index}]", raw)
    return (
        f"{where}: backend {rust_debug_str(raw.backend)} names no inference adapter, so the "
        f"entry is skipped; did you mean `{close[0]}`?"
    )


def _spec_of(raw: RawEntry, flavor: InferFlavor, overlay: RosterOverlay) -> ImportedSpec | str:
    """``raw`` as an imported spec of ``flavor``, or the reference's skip reason
    (``ram_gb`` missing, or not a valid inference spec)."""
    weights = ram_bytes(raw.ram_gb)
    if weights is None:
        return "ram_gb is missing or not a number"
    latency = overlay.latency_class.get(raw.id)
    if latency is None:
        text = rust_ascii_lowercase(f"{raw.id} {raw.role}")
        voice = "voice" in text or "realtime" in text
        latency = LatencyClass.INTERACTIVE if voice else LatencyClass.BATCH
    spec = InferenceSpec(
        role=raw.id,
        flavor=flavor,
        model=raw.name if valid_token(raw.name, 128) else None,
        serve=ServeSpec(port=raw.port),
        memory=MemorySpec(weights_bytes=weights),
        sticky=overlay.sticky.get(raw.id, True),
        latency_class=latency,
        excludes=tuple(overlay.excludes.get(raw.id, ())),
    )
    try:
        spec.validate()
    except SpecError as err:
        return f"not a valid inference spec: {err}"
    return ImportedSpec(
        spec=spec,
        repo=raw.repo,
        status=raw.status,
        name=raw.name,
        line=raw.line,
        ram_gb_unmeasured=is_unmeasured_ram_gb(raw.ram_gb),
    )


def _import_entries(
    raws: list[RawEntry], overlay: RosterOverlay, warnings: list[str], file: str | None
) -> ImportedRoster:
    specs: list[ImportedSpec] = []
    skipped: list[tuple[str, str]] = []
    aliases: dict[str, str] = {}
    alias_specs: dict[str, ImportedSpec] = {}
    # (flavor id, port, repo) -> id of the first imported entry, to spot aliases.
    seen: dict[tuple[str, int | None, str], str] = {}
    # id of each imported entry -> its raw entry, for the alias warning.
    imported_raws: dict[str, RawEntry] = {}
    first_of_id: dict[str, RawEntry] = {}  # id -> its first imported entry
    for index, raw in enumerate(raws):
        if not valid_token(raw.id, 64):
            skipped.append((raw.id, "id is not a plain token"))
            continue
        flavor = flavor_for_backend(raw.backend)
        if flavor is None:
            skipped.append(
                (raw.id, f"backend {rust_debug_str(raw.backend)} has no inference adapter")
            )
            hint = _backend_warning(file, index, raw)
            if hint is not None:
                warnings.append(hint)
            continue
        key = (flavor.id, raw.port, raw.repo)
        first = seen.get(key)
        if first is not None:
            skipped.append((raw.id, f"alias of {first} (same server, port and weights)"))
            aliases[raw.id] = first
            own = _spec_of(raw, flavor, overlay)
            if isinstance(own, ImportedSpec):
                alias_specs.setdefault(raw.id, own)
            target = imported_raws[first]
            if raw.name != target.name:
                warnings.append(_alias_name_warning(index, raw, target))
            continue
        imported = _spec_of(raw, flavor, overlay)
        if isinstance(imported, str):
            skipped.append((raw.id, imported))
            continue
        seen[key] = raw.id
        twice = first_of_id.setdefault(raw.id, raw)
        if twice is not raw:  # rosterd plans and serves the first; the reference keeps both
            where = entry_where(file, raw.line, f"roster[{index}]", raw)
            warnings.append(
                f"{where}: id {rust_debug_str(raw.id)} is imported again (first at line "
                f"{twice.line}); rosterd plans and serves the first entry only"
            )
        imported_raws[raw.id] = raw
        specs.append(imported)
    return ImportedRoster(
        specs=tuple(specs),
        skipped=tuple(skipped),
        warnings=tuple(warnings),
        aliases=MappingProxyType(aliases),
        alias_specs=MappingProxyType(alias_specs),
    )
