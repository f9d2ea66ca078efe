"""The guide's generated reference pages list exactly what the code has.

``scripts/docs_reference.py`` writes the pages at build time; these tests read the
code a second, independent way (Click's command tree, every ``properties`` key in
the JSON Schemas, the OpenAPI document's operations, the ``# TYPE`` lines of a
fresh ``/metrics`` exposition) and compare the sets both ways: nothing missing from
a page, nothing on a page that the code lacks.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from rosterd import cli
from rosterd.metrics import RosterdMetrics
from rosterd.router.openapi import openapi_document
from rosterd.schemas import SCHEMA_NAMES, schema_text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import docs_reference


def _code_spans_in_first_column(page: str) -> list[str]:
    """The code spans of each table row's first cell (the names a reference page lists)."""
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    return [span for row in rows for span in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def _options(command: Any) -> Iterator[str]:
    for param in command.params:
        if param.param_type_name == "option" and not param.hidden:
            yield from param.opts
            yield from param.secondary_opts
    for sub in getattr(command, "commands", {}).values():
        if not sub.hidden:
            yield from _options(sub)


def _command_paths(command: Any, path: str = "rosterd") -> Iterator[str]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _command_paths(sub, f"{path} {name}")


def test_the_commands_page_lists_every_command_and_option() -> None:
    cli._register()
    root = typer.main.get_command(cli.app)
    page = docs_reference.cli_page()
    headings = set(re.findall(r"^## `(.+)`$", page, re.MULTILINE))
    assert headings == set(_command_paths(root))
    listed = {name for name in _code_spans_in_first_column(page) if name.startswith("-")}
    assert listed == set(_options(root))
    assert "`--overlay`" in page
    assert "`--ray-address`" in page


def _property_keys(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                yield from value
            yield from _property_keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _property_keys(item)


def test_the_file_keys_page_lists_every_key_of_every_schema() -> None:
    page = docs_reference.files_page()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", page, re.MULTILINE | re.DOTALL))
    assert set(sections) == set(SCHEMA_NAMES)
    for name in SCHEMA_NAMES:
        paths = _code_spans_in_first_column(sections[name])
        last = {re.split(r"[.\[\]]+", path.rstrip("[]"))[-1] for path in paths}
        assert last == set(_property_keys(json.loads(schema_text(name)))), name
    assert "`nodes[].memory_gb`" in sections["fleet"]
    assert "`models.<name>.ctx_size`" in sections["fleet"]


def test_the_http_page_lists_every_route_of_openapi_json() -> None:
    page = docs_reference.http_page()
    listed = set(re.findall(r"^\| ([A-Z]+) \| `([^`]+)` \|", page, re.MULTILINE))
    document = openapi_document()
    operations = {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete", "options", "head")
    }
    assert listed == operations
    assert ("POST", "/v1/chat/completions") in listed


def test_the_metrics_page_lists_every_metric_exposed() -> None:
    page = docs_reference.metrics_page()
    listed = {name for name in _code_spans_in_first_column(page) if name.startswith("rosterd_")}
    exposition = RosterdMetrics().render().decode()
    exposed = set(re.findall(r"^# TYPE (\S+) ", exposition, re.MULTILINE))
    assert listed == exposed
    assert "rosterd_requests_total" in listed
