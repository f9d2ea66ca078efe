"""Model facts: the shapes a memory estimate needs, read from the weights themselves (layer 2).

Files in, frozen facts out; reading is the only I/O. Two kinds of weights:

- a GGUF file (llama.cpp): its header and tensor index, walked with ``struct``
  over a memory map using the ``gguf`` package's (llama.cpp's own) type tables,
  so neither tensor data nor the vocabulary's strings are loaded
  (``read_gguf_header`` says why not ``GGUFReader``, kept for big-endian files);
- an MLX model folder: ``config.json`` (the Hugging Face config mlx_lm reads)
  and the headers of its ``*.safetensors`` files (8-byte length, then JSON;
  read by hand because the header is all we need and mlx is not installed on
  every node).

Which layers use sliding-window attention follows llama.cpp: a GGUF's own
``<arch>.attention.sliding_window_pattern`` wins; otherwise each architecture's
default pattern (``SWA_PATTERNS``, from llama.cpp's ``src/models/*.cpp``
``load_swa_pattern`` calls); an architecture llama.cpp gives no pattern keeps
full attention on every layer (so the estimate errs high, never low).
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from rosterd.errors import ModelFactsError

ModelFormat = Literal["gguf", "mlx"]

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

#: Bytes per element of the dtypes a safetensors header names.
_SAFETENSORS_DTYPE_BYTES: Final[dict[str, int]] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}

#: The largest safetensors header we read (its format caps it at 100 MB).
_MAX_SAFETENSORS_HEADER_BYTES: Final[int] = 100_000_000


@dataclass(frozen=True, slots=True)
class TensorFacts:
    """One tensor of a GGUF: ``name``, ggml ``type_name`` (``Q4_K``, ``F32``, …), ``shape``
    (ggml order, fastest dimension first) and ``n_bytes`` of data in the file."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a model's own files say about its shape.

    ``path`` is the file (GGUF) or folder (MLX) read; ``file_bytes`` its size on
    disk (every file in the folder for MLX); ``tensor_bytes`` the bytes of tensor
    data. ``architecture`` is GGUF's ``general.architecture`` or the config's
    ``model_type``; ``file_type`` the quantization (``Q4_K_M``, ``F32``, or for
    MLX ``4-bit`` / the dtype). ``kv_heads`` and ``swa_layers`` hold one entry
    per layer (``block_count`` of them); ``sliding_window`` is in tokens (0:
    none). ``key_length``/``value_length`` are per head. ``context_length`` is
    the trained context (tokens). ``dtype_bytes`` is the element size mlx_lm
    keeps its KV cache in (0 for GGUF, whose cache type is a serving setting).
    ``tensors`` lists a GGUF's tensors (empty for MLX).
    """

    path: Path
    format: ModelFormat
    architecture: str
    name: str
    parameter_count: int
    file_type: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    kv_heads: tuple[int, ...]
    key_length: int
    value_length: int
    sliding_window: int
    swa_layers: tuple[bool, ...]
    context_length: int
    vocab_size: int
    file_bytes: int
    tensor_bytes: int
    dtype_bytes: int = 0
    tensors: tuple[TensorFacts, ...] = ()

    @property
    def head_count_kv(self) -> int:
        """The largest per-layer KV head count (what a one-number view shows)."""
        return max(self.kv_heads, default=0)


def read_model_facts(path: Path) -> ModelFacts:
    """The facts of the weights at ``path``: a ``.gguf`` file or an MLX model folder.

    Raises:
        ModelFactsError: ``path`` does not exist, is neither a GGUF file nor a
            folder with ``config.json``, or its metadata is unreadable or lacks
            a field the estimate needs (the message names the file and field).
    """
    if path.is_dir():
        return read_mlx_facts(path)
    if path.is_file():
        return read_gguf_facts(path)
    raise ModelFactsError(f"{path}: no such file or folder")


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


def read_mlx_facts(folder: Path) -> ModelFacts:
    """The facts of the MLX model folder ``folder`` (``config.json`` and safetensors headers).

    A config with a ``text_config`` (multimodal models) is read from that part.
    KV heads default to the attention heads, the head size to
    ``hidden_size // num_attention_heads``, as mlx_lm's model classes do.

    Raises:
        ModelFactsError: no readable ``config.json``, a required field
            (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``)
            missing, or a safetensors header that cannot be read.
    """
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFactsError(f"{folder}: not an MLX model folder (no config.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFactsError(f"{config_path}: not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelFactsError(f"{config_path}: expected a JSON object")
    text = config.get("text_config")
    merged: dict[str, object] = {**config, **text} if isinstance(text, dict) else dict(config)

    def count(key: str, default: int | None = None) -> int:
        found = merged.get(key)
        if isinstance(found, int) and not isinstance(found, bool) and found >= 0:
            return found
        if found is None and default is not None:
            return default
        shown = "missing" if found is None else f"not a count ({found!r})"
        raise ModelFactsError(f"{config_path}: {key} is {shown}")

    layers = count("num_hidden_layers")
    hidden = count("hidden_size")
    heads = count("num_attention_heads")
    if heads == 0:
        raise ModelFactsError(f"{config_path}: num_attention_heads is 0")
    kv = count("num_key_value_heads", heads)
    head_dim = count("head_dim", hidden // heads)
    window = count("sliding_window", 0)
    parameters, dtype_bytes = _safetensors_totals(folder)
    quant = merged.get("quantization")
    bits = quant.get("bits") if isinstance(quant, dict) else None
    torch_dtype = merged.get("torch_dtype")
    file_type = (
        f"{bits}-bit"
        if isinstance(bits, int)
        else (torch_dtype if isinstance(torch_dtype, str) else "unknown")
    )
    files = [p for p in folder.rglob("*") if p.is_file()]
    model_type = merged.get("model_type")
    return ModelFacts(
        path=folder,
        format="mlx",
        architecture=model_type if isinstance(model_type, str) else "unknown",
        name=folder.name,
        parameter_count=parameters,
        file_type=file_type,
        block_count=layers,
        embedding_length=hidden,
        feed_forward_length=count("intermediate_size", 0),
        head_count=heads,
        kv_heads=(kv,) * layers,
        key_length=head_dim,
        value_length=head_dim,
        sliding_window=window,
        swa_layers=(False,) * layers,
        context_length=count("max_position_embeddings", 0),
        vocab_size=count("vocab_size", 0),
        file_bytes=sum(p.stat().st_size for p in files),
        tensor_bytes=sum(p.stat().st_size for p in files if p.suffix == ".safetensors"),
        dtype_bytes=dtype_bytes,
    )


def _safetensors_totals(folder: Path) -> tuple[int, int]:
    """Stored elements over every ``*.safetensors`` in ``folder`` and the bytes per element
    of its floating-point tensors (the activation dtype mlx_lm computes and caches in).

    Quantized MLX weights are packed ``U32``; their elements count ``32 / bits``
    times, read from the config by the caller's ``file_type`` only, so the
    parameter count here is of stored elements.
    """
    elements = 0
    float_bytes = 0
    found = False
    for file in sorted(folder.glob("*.safetensors")):
        found = True
        for dtype, shape in _safetensors_header(file):
            n = 1
            for dim in shape:
                n *= dim
            elements += n
            if dtype in ("F32", "F16", "BF16") and float_bytes == 0:
                float_bytes = _SAFETENSORS_DTYPE_BYTES[dtype]
    if not found:
        raise ModelFactsError(f"{folder}: no *.safetensors weights in the MLX model folder")
    return elements, float_bytes or 2


def _safetensors_header(file: Path) -> list[tuple[str, tuple[int, ...]]]:
    """``(dtype, shape)`` of every tensor named in ``file``'s header."""
    try:
        with file.open("rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) != 8:
                raise ModelFactsError(f"{file}: too short for a safetensors file")
            (length,) = struct.unpack("<Q", raw_len)
            if length > _MAX_SAFETENSORS_HEADER_BYTES:
                raise ModelFactsError(f"{file}: safetensors header of {length} bytes is too big")
            header = json.loads(handle.read(length).decode("utf-8"))
    except OSError as exc:
        raise ModelFactsError(f"{file}: cannot read: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFactsError(f"{file}: safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelFactsError(f"{file}: safetensors header is not a JSON object")
    out: list[tuple[str, tuple[int, ...]]] = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ModelFactsError(f"{file}: safetensors entry {key} is not an object")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        if not isinstance(dtype, str) or not isinstance(shape, list):
            raise ModelFactsError(f"{file}: safetensors entry {key} has no dtype or shape")
        out.append((dtype, tuple(int(d) for d in shape)))
    return out


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
