"""A safetensors file written from tensor shapes (zeros), for the tests of an MLX model folder's
facts and estimate."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "U32": 4}
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * offset)
