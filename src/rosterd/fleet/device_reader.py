"""The ``devices:`` list of a fleet node (layer 2; no I/O): each accelerator a memory pool
of its own, a GPU with its memory or a Mac's GPU share of unified memory.

Read through :class:`~rosterd.fleet.fields.YamlFields`, so each error names the file,
field path, line and column as the rest of the fleet file's do.
"""

from __future__ import annotations

from typing import Final

import yaml

from rosterd.fleet.fields import YamlFields
from rosterd.fleet.model import DeviceSpec, Platform
from rosterd.tokens import GB, valid_token

_DEVICE_KEYS: Final = ("id", "memory_gb", "reserved_gb", "gpu_share_gb", "gpu_share")
#: The most devices one node may declare.
MAX_DEVICES: Final[int] = 64


def read_devices(
    reader: YamlFields, node: yaml.Node, path: str, plat: Platform, node_memory: int
) -> tuple[DeviceSpec, ...]:
    """A node's ``devices:`` list: each ``id`` a plain token, unique on the node; a GPU's
    ``memory_gb`` or, on ``macos-arm64`` only, the GPU share (``gpu_share_gb`` or
    ``gpu_share``, a fraction of the node's memory, never more than it)."""
    items = reader.sequence(node, path, "a list of devices")
    if len(items) > MAX_DEVICES:
        raise reader.fail(node, path, f"expected at most {MAX_DEVICES} devices")
    mac = plat is Platform.MACOS_ARM64
    out: list[DeviceSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        at = f"{path}[{i}]"
        fields = reader.mapping(item, at, _DEVICE_KEYS, "a device mapping")
        if "id" not in fields:
            raise reader.fail(
                item,
                f"{at}.id",
                "missing required key 'id' (llama.cpp's device name, as "
                "`llama-server --list-devices` prints it: CUDA0, ROCm0, Vulkan0, MTL0)",
            )
        id_node = fields["id"][1]
        ident = reader.text(id_node, f"{at}.id", "a device name such as CUDA0")
        if not valid_token(ident, 64):
            raise reader.fail(
                id_node,
                f"{at}.id",
                f"expected a device name such as CUDA0 (letters, digits, . _ -), found {ident!r}",
            )
        if ident in seen:
            raise reader.fail(
                id_node,
                f"{at}.id",
                f"duplicate device {ident!r} (first at {path}[{seen[ident]}])",
            )
        seen[ident] = i
        share_keys = [k for k in ("gpu_share_gb", "gpu_share") if k in fields]
        if share_keys and not mac:
            key = share_keys[0]
            raise reader.fail(
                fields[key][0],
                f"{at}.{key}",
                f"{key} is the GPU's share of a Mac's unified memory; this node's platform "
                f"is {plat.value}: give the device's own memory as memory_gb",
            )
        if mac and "memory_gb" in fields:
            raise reader.fail(
                fields["memory_gb"][0],
                f"{at}.memory_gb",
                "a Mac's GPU shares the node's memory: give its share as gpu_share_gb "
                "(GiB) or gpu_share (a fraction of the node's memory_gb), not memory_gb",
            )
        if len(share_keys) > 1:
            raise reader.fail(
                fields["gpu_share"][0],
                f"{at}.gpu_share",
                "give gpu_share_gb or gpu_share, not both",
            )
        memory = _device_memory(reader, item, fields, at, mac, node_memory)
        reserved = 0
        if "reserved_gb" in fields:
            reserved_node = fields["reserved_gb"][1]
            reserved_gb = reader.number(reserved_node, f"{at}.reserved_gb", minimum_exclusive=None)
            reserved = round(reserved_gb * GB)
            if reserved >= memory:
                raise reader.fail(
                    reserved_node,
                    f"{at}.reserved_gb",
                    f"expected less than the device's {memory / GB:g} GiB, found "
                    f"{reserved_gb:g}: the device would have no capacity",
                )
        out.append(
            DeviceSpec(id=ident, memory_bytes=memory, reserved_bytes=reserved, gpu_share=mac)
        )
    return tuple(out)


def _device_memory(
    reader: YamlFields,
    item: yaml.Node,
    fields: dict[str, tuple[yaml.Node, yaml.Node]],
    at: str,
    mac: bool,
    node_memory: int,
) -> int:
    """A declared device's memory in bytes (see :func:`read_devices`)."""
    if mac:
        if "gpu_share_gb" in fields:
            value_node = fields["gpu_share_gb"][1]
            gb = reader.number(value_node, f"{at}.gpu_share_gb", minimum_exclusive=0.0)
            share = round(gb * GB)
            key = "gpu_share_gb"
        elif "gpu_share" in fields:
            value_node = fields["gpu_share"][1]
            fraction = reader.number(value_node, f"{at}.gpu_share", minimum_exclusive=0.0)
            if fraction > 1:
                raise reader.fail(
                    value_node,
                    f"{at}.gpu_share",
                    f"expected a fraction of the node's memory, above 0 and at most 1 "
                    f"(Metal's cap is about 0.66-0.84), found {fraction:g}",
                )
            share = round(fraction * node_memory)
            key = "gpu_share"
        else:
            raise reader.fail(
                item,
                f"{at}.gpu_share",
                "missing the GPU's share of the Mac's memory: gpu_share_gb (GiB) or "
                "gpu_share (a fraction of memory_gb; Metal caps it at about 0.66-0.84)",
            )
        if share > node_memory:
            raise reader.fail(
                value_node,
                f"{at}.{key}",
                f"the GPU share ({share / GB:g} GiB) is more than the node's memory "
                f"({node_memory / GB:g} GiB)",
            )
        if share <= 0:
            raise reader.fail(value_node, f"{at}.{key}", "expected at least one byte")
        return share
    if "memory_gb" not in fields:
        raise reader.fail(
            item,
            f"{at}.memory_gb",
            "missing required key 'memory_gb' (the device's memory, GiB)",
        )
    memory_node = fields["memory_gb"][1]
    memory = round(reader.number(memory_node, f"{at}.memory_gb", minimum_exclusive=0.0) * GB)
    if memory <= 0:
        raise reader.fail(memory_node, f"{at}.memory_gb", "expected at least one byte")
    return memory
