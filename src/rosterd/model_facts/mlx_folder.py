"""Model facts of an MLX model folder (layer 2): ``config.json`` and safetensors headers.

Files in, frozen :class:`~rosterd.model_facts.facts.ModelFacts` out; reading is
the only I/O. ``config.json`` is the Hugging Face config mlx_lm reads; the
headers of its ``*.safetensors`` files (8-byte length, then JSON) are read by
hand because the header is all we need and mlx is not installed on every node.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Final

from rosterd.errors import ModelFactsError
from rosterd.model_facts.facts import ModelFacts

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
