"""The fleet file reader: a fleet YAML file in, a validated Fleet out (layer 2; reading is
the only I/O).

A fleet file is YAML::

    nodes:
      - name: studio
        memory_gb: 192          # total RAM, GiB (2^30 bytes); may be fractional
        reserved_gb: 16         # kept free for the OS; default: see default_reserved_bytes
        platform: macos-arm64   # macos-arm64 | linux-x86_64 | linux-arm64
        flavors: [mlx_lm, llamacpp, ollama]   # default: what the platform runs
        address: 127.0.0.1      # where the node's backends are reached from the router
        max_concurrency: 4      # generations at once across its roles; default: the sum
                                # of its resident roles' slots (models: parallel, default 1)
        labels: {room: lab}
        devices:                # accelerators, each a memory pool of its own (default: none)
          - {id: CUDA0,         # llama.cpp's device name (llama-server --list-devices)
             memory_gb: 24,     # the device's memory, GiB
             reserved_gb: 1}    # kept free on it (default 0)
      - name: mac
        memory_gb: 128
        platform: macos-arm64
        devices:
          - {id: MTL0, gpu_share: 0.75}   # the GPU's share of unified memory (Metal's
                                          # working-set cap): a fraction, or gpu_share_gb
    models:                     # optional: where each model's weights are
      gemma-3-270m: models/gemma.gguf           # key: roster model name or role id
      big-coder: {path: /srv/coder.gguf, ctx_size: 8192, parallel: 2, extra_args: [--mlock],
                  grace_s: 30,  # seconds from SIGTERM to SIGKILL (default: up's --grace)
                  replicas: 2,          # copies on distinct nodes (default 1), balanced
                                        # by cached prefix and load (rosterd.replica_choice)
                  offload: full,        # on a node with devices: all layers on one device
                                        # (default) or `partial` (what fits, rest on the CPU)
                  keep_kv: true,        # save/restore the KV cache across swaps (default)
                  cache_ram_mb: 256,    # the backend's RAM prompt cache, MiB (small default)
                  load_progress: text}  # a stream waiting for its load: ping, text or off
                                        # (default: up's --load-progress)
      bge-reranker: {path: models/reranker.gguf,
                     reranking: true}   # serves /v1/rerank (default: the GGUF's pooling type)
    model_roots: [models]       # optional: folders searched for weights

The fleet's types are in :mod:`rosterd.fleet.model`; without a fleet file the
fleet is this machine alone (:func:`rosterd.fleet.local.local_fleet`).

PyYAML's ``compose`` is used rather than ``safe_load`` because the node tree keeps
line and column marks, so every :class:`FleetError` names the file, the field
path (``nodes[1].memory_gb``), the line and column, the value found and what was
expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import yaml

from rosterd.errors import FleetError
from rosterd.fleet.device_reader import read_devices
from rosterd.fleet.fields import YamlFields
from rosterd.fleet.model import (
    LOAD_PROGRESS_MODES,
    OFFLOADS,
    DeviceSpec,
    Fleet,
    ModelSource,
    Node,
    Platform,
    default_reserved_bytes,
)
from rosterd.spec import InferFlavor
from rosterd.tokens import GB, valid_token

#: Largest fleet file read, in bytes; a fleet is a short hand-written file.
MAX_FLEET_BYTES: Final[int] = 1_048_576
#: At most this many nodes in one fleet.
MAX_NODES: Final[int] = 1024


def load_fleet(path: Path) -> Fleet:
    """Read and validate the fleet file at ``path`` (opened read-only).

    Relative model paths and ``model_roots`` resolve against the file's folder.

    Raises:
        FleetError: the file cannot be read, is not valid YAML, or a field is wrong;
            the error names the file, field path, line and column.
    """
    file = str(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FLEET_BYTES + 1)
    except OSError as err:
        raise FleetError(f"cannot read the fleet file: {err.strerror or err}", file=file) from None
    if len(data) > MAX_FLEET_BYTES:
        raise FleetError(f"the fleet file is larger than {MAX_FLEET_BYTES} bytes", file=file)
    return parse_fleet(data, file=file, base_dir=path.resolve().parent)


def parse_fleet(
    text: str | bytes, *, file: str | None = None, base_dir: Path | None = None
) -> Fleet:
    """Validate fleet YAML given as text; ``base_dir`` (default: the current folder)
    anchors relative paths. See :func:`load_fleet`.

    Raises:
        FleetError: as :func:`load_fleet`.
    """
    base = (base_dir or Path.cwd()).resolve()
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise FleetError(f"the fleet file is not UTF-8 (byte {err.start})", file=file) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        raise FleetError(
            f"not valid YAML: {err.problem or err.context}",
            file=file,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as err:
        raise FleetError(f"not valid YAML: {err}", file=file) from None
    return _FleetReader(file, base).read(root)


_TOP_KEYS: Final = ("nodes", "models", "model_roots")
_NODE_KEYS: Final = (
    "name",
    "memory_gb",
    "reserved_gb",
    "platform",
    "flavors",
    "address",
    "labels",
    "max_concurrency",
    "devices",
)
_MODEL_KEYS: Final = (
    "path",
    "ctx_size",
    "parallel",
    "extra_args",
    "grace_s",
    "keep_kv",
    "cache_ram_mb",
    "reranking",
    "replicas",
    "offload",
    "load_progress",
)


class _FleetReader(YamlFields):
    """Walks the composed YAML tree, raising FleetError at the first wrong field."""

    # -- the file --------------------------------------------------------------

    def read(self, root: yaml.Node | None) -> Fleet:
        if root is None:
            raise self.fail(None, None, "the fleet file is empty; expected a mapping with `nodes:`")
        top = self.mapping(root, None, _TOP_KEYS, "a mapping with `nodes:`")
        if "nodes" not in top:
            raise self.fail(root, "nodes", "missing `nodes:` (a list of at least one node)")
        nodes_node = top["nodes"][1]
        items = self.sequence(nodes_node, "nodes", "a list of nodes")
        if not items:
            raise self.fail(nodes_node, "nodes", "expected at least one node, found an empty list")
        if len(items) > MAX_NODES:
            raise self.fail(nodes_node, "nodes", f"expected at most {MAX_NODES} nodes")
        nodes: list[Node] = []
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            node = self.read_node(item, f"nodes[{index}]")
            if node.name in seen:
                raise self.fail(
                    item,
                    f"nodes[{index}].name",
                    f"duplicate node name {node.name!r} (first at nodes[{seen[node.name]}])",
                )
            seen[node.name] = index
            nodes.append(node)
        models: dict[str, ModelSource] = {}
        if "models" in top:
            models = self.read_models(top["models"][1])
        roots: tuple[Path, ...] = (self.base,)
        if "model_roots" in top:
            roots_node = top["model_roots"][1]
            roots = tuple(
                self.path_at(entry, f"model_roots[{i}]", "a folder path")
                for i, entry in enumerate(
                    self.sequence(roots_node, "model_roots", "a list of paths")
                )
            )
        return Fleet(nodes=tuple(nodes), models=models, model_roots=roots)

    def read_node(self, item: yaml.Node, path: str) -> Node:
        fields = self.mapping(item, path, _NODE_KEYS, "a node mapping")
        for required in ("name", "memory_gb", "platform"):
            if required not in fields:
                raise self.fail(
                    item,
                    f"{path}.{required}",
                    f"missing required key {required!r}; every node needs `name` (a plain "
                    "token), `memory_gb` (total RAM, GiB) and `platform` "
                    f"({', '.join(p.value for p in Platform)}); the other keys have defaults",
                )
        name_node = fields["name"][1]
        name = self.text(name_node, f"{path}.name", "a plain token (letters, digits, . _ -)")
        if not valid_token(name, 64):
            raise self.fail(
                name_node,
                f"{path}.name",
                f"expected a plain token of at most 64 bytes (letters, digits, . _ -; "
                f"starting with a letter or digit), found {name!r}",
            )
        memory_node = fields["memory_gb"][1]
        memory_gb = self.number(memory_node, f"{path}.memory_gb", minimum_exclusive=0.0)
        memory = round(memory_gb * GB)
        if memory <= 0:
            raise self.fail(memory_node, f"{path}.memory_gb", "expected at least one byte")
        if "reserved_gb" in fields:
            reserved_node = fields["reserved_gb"][1]
            reserved_gb = self.number(reserved_node, f"{path}.reserved_gb", minimum_exclusive=None)
            reserved = round(reserved_gb * GB)
            if reserved >= memory:
                raise self.fail(
                    reserved_node,
                    f"{path}.reserved_gb",
                    f"expected less than memory_gb ({memory_gb:g}), found {reserved_gb:g}: "
                    "the node would have no capacity",
                )
        else:
            reserved = default_reserved_bytes(memory)
        platform_node = fields["platform"][1]
        platform_text = self.text(platform_node, f"{path}.platform", "a platform")
        try:
            plat = Platform(platform_text)
        except ValueError:
            raise self.fail(
                platform_node,
                f"{path}.platform",
                f"expected one of {', '.join(p.value for p in Platform)}, found {platform_text!r}",
            ) from None
        flavors = plat.supported_flavors()
        if "flavors" in fields:
            flavors = self.read_flavors(fields["flavors"][1], f"{path}.flavors", plat)
        address = "127.0.0.1"
        if "address" in fields:
            address_node = fields["address"][1]
            address = self.text(address_node, f"{path}.address", "a host name or IP address")
            if len(address) > 253 or any(ch.isspace() or ch in "/?#@" for ch in address):
                raise self.fail(
                    address_node,
                    f"{path}.address",
                    f"expected a host name or IP address, found {address!r}",
                )
        max_concurrency = None
        if "max_concurrency" in fields:
            max_concurrency = self.positive_int(
                fields["max_concurrency"][1], f"{path}.max_concurrency"
            )
        labels: dict[str, str] = {}
        if "labels" in fields:
            labels = self.read_labels(fields["labels"][1], f"{path}.labels")
        devices: tuple[DeviceSpec, ...] = ()
        if "devices" in fields:
            devices = read_devices(self, fields["devices"][1], f"{path}.devices", plat, memory)
        return Node(
            name=name,
            memory_bytes=memory,
            reserved_bytes=reserved,
            platform=plat,
            flavors=flavors,
            address=address,
            max_concurrency=max_concurrency,
            labels=labels,
            devices=devices,
        )

    def read_flavors(self, node: yaml.Node, path: str, plat: Platform) -> frozenset[InferFlavor]:
        allowed = ", ".join(f.value for f in InferFlavor)
        out: set[InferFlavor] = set()
        for i, entry in enumerate(self.sequence(node, path, f"a list of flavors ({allowed})")):
            text = self.text(entry, f"{path}[{i}]", f"one of {allowed}")
            try:
                flavor = InferFlavor(text)
            except ValueError:
                raise self.fail(
                    entry,
                    f"{path}[{i}]",
                    f"expected one of {allowed}, found {text!r}{_meant(text)}",
                ) from None
            if flavor not in plat.supported_flavors():
                runs = ", ".join(sorted(f.value for f in plat.supported_flavors()))
                raise self.fail(
                    entry,
                    f"{path}[{i}]",
                    f"{plat.value} cannot run {text!r}; expected one of {runs}",
                )
            if flavor in out:
                raise self.fail(entry, f"{path}[{i}]", f"duplicate flavor {text!r}")
            out.add(flavor)
        if not out:
            raise self.fail(node, path, "expected at least one flavor, found an empty list")
        return frozenset(out)

    def read_labels(self, node: yaml.Node, path: str) -> dict[str, str]:
        labels: dict[str, str] = {}
        for key, (key_node, value_node) in self.mapping(node, path, None, "a mapping").items():
            if not valid_token(key, 64):
                raise self.fail(
                    key_node, f"{path}.{key}", f"expected a plain token as label key, found {key!r}"
                )
            value = self.scalar(value_node) if isinstance(value_node, yaml.ScalarNode) else None
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise self.fail(
                    value_node,
                    f"{path}.{key}",
                    f"expected text or a number, found {self.found(value_node)}",
                )
            labels[key] = str(value)
        return labels

    def read_models(self, node: yaml.Node) -> dict[str, ModelSource]:
        models: dict[str, ModelSource] = {}
        for key, (_key_node, value_node) in self.mapping(
            node, "models", None, "a mapping of model name -> path"
        ).items():
            path = f"models.{key}"
            if isinstance(value_node, yaml.ScalarNode):
                models[key] = ModelSource(path=self.path_at(value_node, path, "a path"))
                continue
            fields = self.mapping(value_node, path, _MODEL_KEYS, "a path or a mapping with `path:`")
            if "path" not in fields:
                raise self.fail(value_node, f"{path}.path", "missing required key 'path'")
            source_path = self.path_at(fields["path"][1], f"{path}.path", "a path")
            ctx_size = parallel = None
            replicas = 1
            if "replicas" in fields:
                replicas = self.positive_int(fields["replicas"][1], f"{path}.replicas")
            if "ctx_size" in fields:
                ctx_size = self.positive_int(fields["ctx_size"][1], f"{path}.ctx_size")
            if "parallel" in fields:
                parallel = self.positive_int(fields["parallel"][1], f"{path}.parallel")
            extra: tuple[str, ...] = ()
            if "extra_args" in fields:
                args_node = fields["extra_args"][1]
                extra = tuple(
                    self.text(arg, f"{path}.extra_args[{i}]", "text")
                    for i, arg in enumerate(
                        self.sequence(args_node, f"{path}.extra_args", "a list of text")
                    )
                )
            grace_s = None
            if "grace_s" in fields:
                grace_s = self.number(
                    fields["grace_s"][1], f"{path}.grace_s", minimum_exclusive=None
                )
                if grace_s < 0:
                    raise self.fail(
                        fields["grace_s"][1],
                        f"{path}.grace_s",
                        f"expected 0 or more, found {grace_s:g}",
                    )
            keep_kv = True
            if "keep_kv" in fields:
                keep_kv = self.boolean(fields["keep_kv"][1], f"{path}.keep_kv")
            cache_ram_mb = None
            if "cache_ram_mb" in fields:
                cache_ram_mb = self.whole_number(fields["cache_ram_mb"][1], f"{path}.cache_ram_mb")
            reranking = None
            if "reranking" in fields:
                reranking = self.boolean(fields["reranking"][1], f"{path}.reranking")
            offload = "full"
            if "offload" in fields:
                offload_node = fields["offload"][1]
                offload = self.text(offload_node, f"{path}.offload", "full or partial")
                if offload not in OFFLOADS:
                    raise self.fail(
                        offload_node,
                        f"{path}.offload",
                        f"expected one of {', '.join(OFFLOADS)}, found {offload!r}",
                    )
            load_progress = None
            if "load_progress" in fields:
                mode_node = fields["load_progress"][1]
                load_progress = self.text(mode_node, f"{path}.load_progress", "ping, text or off")
                if load_progress not in LOAD_PROGRESS_MODES:
                    raise self.fail(
                        mode_node,
                        f"{path}.load_progress",
                        f"expected one of {', '.join(LOAD_PROGRESS_MODES)}, "
                        f"found {load_progress!r}",
                    )
            models[key] = ModelSource(
                path=source_path,
                ctx_size=ctx_size,
                parallel=parallel,
                extra_args=extra,
                grace_s=grace_s,
                replicas=replicas,
                keep_kv=keep_kv,
                cache_ram_mb=cache_ram_mb,
                reranking=reranking,
                offload=offload,
                load_progress=load_progress,
            )
        return models


def _meant(text: str) -> str:
    """``; did you mean `ID`?`` when ``text`` names a flavor as the roster's ``backend`` does
    (``llama.cpp``, ``mlx-lm``) or nearly does (``lama.cpp``), else empty: the fleet file
    names flavors by their ids, the roster by the backends' own names."""
    # The roster import knows those names (as the reference reads them); asked only on a refusal.
    from rosterd.roster.importer import flavor_near

    flavor = flavor_near(text)
    return f"; did you mean `{flavor.id}`?" if flavor is not None and flavor.id != text else ""
