"""Model facts of a GGUF file (layer 2, llama.cpp's weights): its header and tensor index.

File in, frozen :class:`~rosterd.model_facts.facts.ModelFacts` out; reading is
the only I/O. The header and tensor index are walked with ``struct`` over a
memory map using the ``gguf`` package's (llama.cpp's own) type tables, so
neither tensor data nor the vocabulary's strings are loaded
(:func:`read_gguf_header` says why not ``GGUFReader``, kept for big-endian files).

Which layers use sliding-window attention follows llama.cpp: a GGUF's own
``<arch>.attention.sliding_window_pattern`` wins; otherwise each architecture's
default pattern (``SWA_PATTERNS``, from llama.cpp's ``src/models/*.cpp``
``load_swa_pattern`` calls); an architecture llama.cpp gives no pattern keeps
full attention on every layer (so the estimate errs high, never low).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rosterd.errors import ModelFactsError
from rosterd.model_facts.facts import ModelFacts, TensorFacts

#: llama.cpp's default sliding-window pattern per GGUF architecture: (period, dense_first).
#: With dense_first false, layer ``il`` is sliding iff ``il % period < period - 1``
#: (the last of each period is full); with dense_first true, iff ``il % period != 0``.
SWA_PATTERNS: Final[dict[str, tuple[int, bool]]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "exaone4": (4, False),
    "llama4": (4, False),
    "olmo2": (4, False),
    "gpt-oss": (2, False),
    "smallthinker": (4, True),
    "plamo3": (8, False),
}


def read_gguf_facts(path: Path) -> ModelFacts:
    """The facts of the GGUF file ``path`` (header and tensor index only).

    Raises:
        ModelFactsError: not a GGUF file, or a required key
            (``<arch>.block_count``, ``embedding_length``,
            ``attention.head_count``) is missing or not a number.
    """
    from gguf import LlamaFileType

    values, tensor_index = read_gguf_header(path)

    def value(key: str) -> object:
        return values.get(key)

    def number(key: str, default: int | None = None) -> int:
        found = value(key)
        if isinstance(found, bool | int | float) and found >= 0:
            return int(found)
        if found is None and default is not None:
            return default
        shown = "missing" if found is None else f"not a count ({found!r})"
        raise ModelFactsError(f"{path}: GGUF key {key} is {shown}")

    arch = value("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFactsError(f"{path}: GGUF key general.architecture is missing")
    blocks = number(f"{arch}.block_count")
    embd = number(f"{arch}.embedding_length")
    heads = _first_count(value(f"{arch}.attention.head_count"))
    if heads is None or heads == 0:
        raise ModelFactsError(f"{path}: GGUF key {arch}.attention.head_count is missing")
    kv_heads = _per_layer(value(f"{arch}.attention.head_count_kv"), blocks, heads)
    head_dim = embd // heads
    key_length = number(f"{arch}.attention.key_length", head_dim)
    value_length = number(f"{arch}.attention.value_length", head_dim)
    window = number(f"{arch}.attention.sliding_window", 0)
    pattern = value(f"{arch}.attention.sliding_window_pattern")
    tokens = value("tokenizer.ggml.tokens")
    vocab = number(f"{arch}.vocab_size", len(tokens) if isinstance(tokens, list | _Skipped) else 0)
    raw_file_type = value("general.file_type")
    file_type = "unknown"
    if isinstance(raw_file_type, int):
        try:
            file_type = LlamaFileType(raw_file_type).name.removeprefix("MOSTLY_")
        except ValueError:
            file_type = f"file type {raw_file_type}"
        file_type = file_type.removeprefix("ALL_")
    tensors = tuple(t for t, _ in tensor_index)
    name = value("general.name")
    return ModelFacts(
        path=path,
        format="gguf",
        architecture=arch,
        name=name if isinstance(name, str) else path.stem,
        parameter_count=sum(n for _, n in tensor_index),
        file_type=file_type,
        block_count=blocks,
        embedding_length=embd,
        feed_forward_length=_first_count(value(f"{arch}.feed_forward_length")) or 0,
        head_count=heads,
        kv_heads=kv_heads,
        key_length=key_length,
        value_length=value_length,
        sliding_window=window,
        swa_layers=swa_layers(arch, blocks, window, pattern),
        context_length=number(f"{arch}.context_length", 0),
        vocab_size=vocab,
        file_bytes=path.stat().st_size,
        tensor_bytes=sum(t.n_bytes for t in tensors),
        tensors=tensors,
    )


def read_gguf_pooling_type(path: Path) -> int:
    """The GGUF file ``path``'s ``<arch>.pooling_type`` as llama.cpp numbers it
    (``LLAMA_POOLING_TYPE_*``: 0 none, 1 mean, 2 cls, 3 last, 4 rank, a reranker's,
    :data:`~rosterd.model_facts.facts.POOLING_TYPE_RANK`), or -1 when it sets none. Reads
    the header only, as :func:`read_gguf_facts` does.

    Raises:
        ModelFactsError: not a readable GGUF file.
    """
    values, _ = read_gguf_header(path)
    found = values.get(f"{values.get('general.architecture')}.pooling_type")
    return found if isinstance(found, int) and not isinstance(found, bool) else -1


@dataclass(frozen=True, slots=True)
class _Skipped:
    """A GGUF string array read past without its items (the vocabulary): only its length."""

    length: int

    def __len__(self) -> int:
        return self.length


#: GGUF value types (``gguf.GGUFValueType``) of fixed size: their ``struct`` format.
_GGUF_SCALARS: Final[dict[int, str]] = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_GGUF_STRING: Final[int] = 8
_GGUF_ARRAY: Final[int] = 9
_GGUF_MAGIC: Final[bytes] = b"GGUF"


def read_gguf_header(path: Path) -> tuple[dict[str, object], list[tuple[TensorFacts, int]]]:
    """The metadata (key -> value) and tensor index (facts, element count) of GGUF ``path``.

    Why not ``gguf.GGUFReader`` here: it builds a field object for every item
    of every array, which takes about 10 s for gemma-3's 262144-token
    vocabulary, and the estimate needs none of those strings. This walks the
    header (GGUF v2/v3, little-endian: the layout ``gguf`` itself writes) with
    ``struct``, keeping numeric arrays and reading string arrays past, counted
    (``_Skipped``); the tensor types' sizes come from ``gguf``'s own tables
    (``GGML_QUANT_SIZES``). A big-endian file is read with ``GGUFReader``.

    Raises:
        ModelFactsError: not a GGUF file, or its header is cut short or malformed.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as handle:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise ModelFactsError(f"{path}: not a readable GGUF file: {exc}") from exc
    try:
        if data[:4] != _GGUF_MAGIC:
            raise ModelFactsError(f"{path}: not a readable GGUF file: no GGUF magic")
        (version,) = struct.unpack_from("<I", data, 4)
        if version not in (2, 3):
            if version & 0xFFFF == 0:  # byte-swapped: a big-endian file
                return _read_gguf_header_slowly(path)
            raise ModelFactsError(f"{path}: GGUF version {version} is not supported")
        tensor_count, kv_count = struct.unpack_from("<QQ", data, 8)
        offset = 24
        values: dict[str, object] = {}

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            raw = data[at + 8 : at + 8 + length]
            if len(raw) != length:
                raise struct.error("string runs past the end of the file")
            return raw.decode("utf-8", errors="replace"), at + 8 + length

        def item(kind: int, at: int) -> tuple[object, int]:
            if kind == _GGUF_STRING:
                return string(at)
            if kind == _GGUF_ARRAY:
                inner, length = struct.unpack_from("<IQ", data, at)
                at += 12
                if inner == _GGUF_STRING:
                    for _ in range(length):
                        (size,) = struct.unpack_from("<Q", data, at)
                        at += 8 + size
                    return _Skipped(length), at
                fmt = _GGUF_SCALARS.get(inner)
                if fmt is None:
                    raise struct.error(f"array of value type {inner}")
                size = struct.calcsize(fmt)
                items = list(struct.unpack_from(f"<{length}{fmt}", data, at))
                return items, at + size * length
            fmt = _GGUF_SCALARS.get(kind)
            if fmt is None:
                raise struct.error(f"value type {kind}")
            (found,) = struct.unpack_from(f"<{fmt}", data, at)
            return found, at + struct.calcsize(fmt)

        for _ in range(kv_count):
            key, offset = string(offset)
            (kind,) = struct.unpack_from("<I", data, offset)
            values[key], offset = item(kind, offset + 4)
        tensors: list[tuple[TensorFacts, int]] = []
        for _ in range(tensor_count):
            name, offset = string(offset)
            (n_dims,) = struct.unpack_from("<I", data, offset)
            dims = struct.unpack_from(f"<{n_dims}Q", data, offset + 4)
            offset += 4 + 8 * n_dims
            (type_id,) = struct.unpack_from("<I", data, offset)
            offset += 12  # the type, then the data offset
            ggml_type = GGMLQuantizationType(type_id)
            block, type_bytes = GGML_QUANT_SIZES[ggml_type]
            elements = 1
            for d in dims:
                elements *= int(d)
            facts = TensorFacts(
                name=name,
                type_name=ggml_type.name,
                shape=tuple(int(d) for d in dims),
                n_bytes=elements * type_bytes // block,
            )
            tensors.append((facts, elements))
        return values, tensors
    except (struct.error, ValueError, KeyError, OverflowError, MemoryError) as exc:
        raise ModelFactsError(f"{path}: not a readable GGUF file: {exc}") from exc
    finally:
        data.close()


def _read_gguf_header_slowly(
    path: Path,
) -> tuple[dict[str, object], list[tuple[TensorFacts, int]]]:
    """``read_gguf_header`` through ``gguf.GGUFReader`` (any byte order, every field read)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path), "r")
    except (OSError, ValueError, KeyError, IndexError, struct.error) as exc:
        raise ModelFactsError(f"{path}: not a readable GGUF file: {exc}") from exc
    values: dict[str, object] = {}
    for key, field in reader.fields.items():
        try:
            values[key] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise ModelFactsError(f"{path}: GGUF key {key} is unreadable: {exc}") from exc
    tensors = [
        (
            TensorFacts(
                name=t.name,
                type_name=t.tensor_type.name,
                shape=tuple(int(d) for d in t.shape),
                n_bytes=int(t.n_bytes),
            ),
            int(t.n_elements),
        )
        for t in reader.tensors
    ]
    return values, tensors


def swa_layers(arch: str, blocks: int, window: int, pattern: object = None) -> tuple[bool, ...]:
    """Which of ``blocks`` layers use the sliding window, as llama.cpp decides it.

    ``pattern`` is the GGUF's ``sliding_window_pattern`` value: a list of
    per-layer booleans, a period (``int``), or ``None`` for the architecture's
    default from ``SWA_PATTERNS``. No window (``window == 0``) or an
    architecture without a pattern: no sliding layers.
    """
    if window <= 0:
        return (False,) * blocks
    if isinstance(pattern, list) and len(pattern) >= blocks:
        return tuple(bool(p) for p in pattern[:blocks])
    default = SWA_PATTERNS.get(arch)
    if default is None:
        return (False,) * blocks
    period, dense_first = default
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    if period == 0:
        return (True,) * blocks
    if dense_first:
        return tuple(il % period != 0 for il in range(blocks))
    return tuple(il % period < period - 1 for il in range(blocks))


def _first_count(found: object) -> int | None:
    """A count from a GGUF value that is a number or a per-layer list (its largest entry)."""
    if isinstance(found, bool):
        return None
    if isinstance(found, int | float):
        return int(found)
    if isinstance(found, list) and found and all(isinstance(x, int | float) for x in found):
        return int(max(found))
    return None


def _per_layer(found: object, blocks: int, default: int) -> tuple[int, ...]:
    """One KV head count per layer from a number, a per-layer list, or ``default``."""
    if isinstance(found, list) and len(found) >= blocks:
        return tuple(int(x) for x in found[:blocks])
    if isinstance(found, int | float) and not isinstance(found, bool):
        return (int(found),) * blocks
    return (default,) * blocks
