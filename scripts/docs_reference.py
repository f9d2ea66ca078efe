"""The user guide's reference pages, generated from the code at build time.

Tooling, outside rosterd's layers: ``mkdocs.yml`` names this file as a MkDocs hook,
and ``on_files`` adds four pages that exist only in the build, never in ``docs/``:

- ``reference/cli.md``: every command and option, from the Typer app (``rosterd.cli``);
- ``reference/files.md``: every key of the roster, overlay and fleet files, from the
  JSON Schemas ``rosterd schema`` prints (``rosterd.schemas``);
- ``reference/http.md``: every HTTP route, from the router's ``/openapi.json``
  (``rosterd.router.openapi``);
- ``reference/metrics.md``: every Prometheus metric, from the registry of
  ``rosterd.metrics.RosterdMetrics``.

A hook rather than the ``mkdocs-gen-files`` plugin: MkDocs runs hooks itself (no
plugin to install or pin), and the four page builders are plain functions from the
code to Markdown text that ``tests/test_docs_reference.py`` calls without MkDocs.
Nothing here reads the network or writes a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import typer

#: Each generated page, by its path in the guide.
PAGES = ("reference/cli.md", "reference/files.md", "reference/http.md", "reference/metrics.md")

_GENERATED_NOTE = (
    "<!-- Generated from the code by scripts/docs_reference.py at build time; do not edit. -->\n\n"
)


def _cell(text: object) -> str:
    """``text`` as one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# --- commands -----------------------------------------------------------------------


# Typer builds its commands on the Click it vendors (``typer._click``), so the
# commands and parameters are read by their Click attributes (``commands``, ``opts``,
# ``param_type_name``), not by an ``isinstance`` against a Click of our own.


def root_command() -> Any:
    """The Click group behind ``rosterd``, with every command registered."""
    from rosterd import cli

    cli._register()  # the commands register themselves on import
    return typer.main.get_command(cli.app)


def walk_commands(
    group: Any, path: tuple[str, ...] = ("rosterd",)
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under ``group`` (itself first), as (words typed, command)."""
    yield path, group
    commands: Mapping[str, Any] = getattr(group, "commands", {})
    for name in sorted(commands):
        if not commands[name].hidden:
            yield from walk_commands(commands[name], (*path, name))


def _type_name(param: Any) -> str:
    """What a parameter takes, from the annotation Typer read (``int``, ``Path``, ...)."""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    name = getattr(annotation, "__name__", None) or str(annotation or "text")
    return f"{name}, repeatable" if param.multiple else name


def _usage(path: tuple[str, ...], command: Any) -> str:
    """The command line a command takes, as ``rosterd up [OPTIONS] ROSTER``."""
    words = [*path]
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    if any(p.param_type_name == "option" for p in params):
        words.append("[OPTIONS]")
    for param in params:
        if param.param_type_name == "argument":
            name = param.metavar or str(param.name).upper()
            name += "..." if param.nargs == -1 else ""
            words.append(name if param.required else f"[{name}]")
    if getattr(command, "commands", None):
        words.append("COMMAND [ARGS]...")
    return " ".join(words)


def _param_row(param: Any) -> str:
    if param.param_type_name == "option":
        names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
        kind = "flag" if param.is_flag else _type_name(param)
        if param.is_flag or param.default is None or param.default == ():
            default = ""
        else:
            default = f"`{_cell(param.default)}`"
        envvar = param.envvar if isinstance(param.envvar, str) else None
        help_text = _cell(param.help or "")
        if envvar:
            help_text += f" (env `{envvar}`)"
        return f"| {names} | {kind} | {default} | {help_text} |"
    required = "required" if param.required else "optional"
    help_text = _cell(getattr(param, "help", None) or "")
    name = param.metavar or str(param.name).upper()
    return f"| `{name}` | argument, {required} | | {help_text} |"


def cli_page() -> str:
    """Markdown for ``reference/cli.md``: per command its usage, help and parameters."""
    out = [
        "# Commands\n\n",
        _GENERATED_NOTE,
        "Every `rosterd` command and option, as `rosterd COMMAND --help` gives them. "
        "Exit statuses: [Getting started](../getting-started.md#exit-statuses).\n\n",
    ]
    root = root_command()
    for path, command in walk_commands(root):
        out.append(f"## `{' '.join(path)}`\n\n")
        out.append(f"```text\n{_usage(path, command)}\n```\n\n")
        if command.help:
            out.append(command.help.strip() + "\n\n")
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if params:
            out.append("| parameter | type | default | what it does |\n| --- | --- | --- | --- |\n")
            out.extend(_param_row(p) + "\n" for p in params)
            out.append("\n")
    return "".join(out)


# --- file keys ------------------------------------------------------------------------


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, root)
    return schema


def _kind(schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    schema = _resolve(schema, root)
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(_kind(s, root) for s in schema[key])
    kind = schema.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def schema_keys(
    schema: Mapping[str, Any], root: Mapping[str, Any], prefix: str = ""
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every key a file may hold, as (path such as ``nodes[].memory_gb``, its schema)."""
    schema = _resolve(schema, root)
    for alternative in [*schema.get("oneOf", []), *schema.get("anyOf", [])]:
        yield from schema_keys(alternative, root, prefix)
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, sub
        yield from schema_keys(sub, root, path)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        path = f"{prefix}.<name>" if prefix else "<name>"
        yield from schema_keys(extra, root, path)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from schema_keys(items, root, prefix + "[]")


def load_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schemas ``rosterd schema NAME`` prints, by NAME."""
    from rosterd.schemas import SCHEMA_NAMES, schema_text

    return {name: json.loads(schema_text(name)) for name in SCHEMA_NAMES}


def files_page() -> str:
    """Markdown for ``reference/files.md``: every key of every file, with its schema's text."""
    out = [
        "# File keys\n\n",
        _GENERATED_NOTE,
        "Every key of the files rosterd reads, from the JSON Schemas that "
        "`rosterd schema roster|overlay|fleet` prints (for editors: "
        "[File schemas](../roster.md#file-schemas)). `[]` is an item of a list; "
        "`<name>` a key of your choosing.\n\n",
    ]
    for name, schema in load_schemas().items():
        out.append(f"## {name}\n\n{_cell(schema.get('description', ''))}\n\n")
        out.append("| key | type | what it is |\n| --- | --- | --- |\n")
        for path, sub in schema_keys(schema, schema):
            resolved = _resolve(sub, schema)
            text = _cell(resolved.get("description", ""))
            out.append(f"| `{path}` | {_kind(sub, schema)} | {text} |\n")
        out.append("\n")
    return "".join(out)


# --- routes ---------------------------------------------------------------------------

_METHODS = ("get", "post", "put", "patch", "delete", "options", "head")


def routes() -> list[tuple[str, str, Mapping[str, Any]]]:
    """Every (METHOD, path, operation) of the router's OpenAPI document, in its order."""
    from rosterd.router.openapi import openapi_document

    document = openapi_document()
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in _METHODS
    ]


def http_page() -> str:
    """Markdown for ``reference/http.md``: every route, its summary and its statuses."""
    out = [
        "# HTTP routes\n\n",
        _GENERATED_NOTE,
        "Every route a running `rosterd up` serves, from its own `GET /openapi.json`. "
        "Statuses other than 200 are errors in the route's dialect's envelope; 401 is "
        "answered only when API keys are set. What the errors mean: "
        "[Serving](../serving.md#serving-rosterd-up).\n\n",
        "| method | path | what it does | statuses |\n| --- | --- | --- | --- |\n",
    ]
    for method, path, operation in routes():
        summary = _cell(operation.get("summary", ""))
        statuses = ", ".join(sorted(operation.get("responses", {})))
        out.append(f"| {method} | `{path}` | {summary} | {statuses} |\n")
    return "".join(out) + "\n"


# --- metrics --------------------------------------------------------------------------


def metric_families() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Every metric of a ``rosterd up``: (exposed name, type, help, label names)."""
    from prometheus_client.metrics import MetricWrapperBase

    from rosterd.metrics import RosterdMetrics

    metrics = RosterdMetrics()
    found = []
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        (family,) = value.describe()
        name = family.name + "_total" if family.type == "counter" else family.name
        # prometheus_client keeps a wrapper's label names only in this attribute.
        labels = tuple(value._labelnames)
        found.append((name, family.type, family.documentation, labels))
    return sorted(found)


def metrics_page() -> str:
    """Markdown for ``reference/metrics.md``: every metric's name, type, labels and help."""
    out = [
        "# Metrics\n\n",
        _GENERATED_NOTE,
        "Every metric of `GET /metrics` (Prometheus text). A histogram also gives "
        "`_bucket`, `_sum` and `_count` series. The values its labels take: "
        "[Operating](../operating.md#status-events-and-metrics).\n\n",
        "| metric | type | labels | what it counts |\n| --- | --- | --- | --- |\n",
    ]
    for name, kind, help_text, labels in metric_families():
        label_text = ", ".join(f"`{label}`" for label in labels)
        out.append(f"| `{name}` | {kind} | {label_text} | {_cell(help_text)} |\n")
    return "".join(out) + "\n"


BUILDERS = {
    "reference/cli.md": cli_page,
    "reference/files.md": files_page,
    "reference/http.md": http_page,
    "reference/metrics.md": metrics_page,
}


# --- the MkDocs hook ------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' ``on_files`` event: add the generated pages to the build's files."""
    from mkdocs.structure.files import File

    for path, build in BUILDERS.items():
        files.append(File.generated(config, path, content=build()))
    return files
