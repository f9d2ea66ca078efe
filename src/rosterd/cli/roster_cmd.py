"""``rosterd roster import``: the roster import as a command (layer 8).

Default output is for people: a Rich table of the imported specs, a table of
the skipped entries with their reasons, then warnings. ``--json`` is for
programs: one JSON object on stdout, ``{"specs": [...], "skipped": [[id,
reason], ...], "warnings": [...]}`` with each spec in the reference's case-file
shape. Exit 0 when the file was read (skips are not failures), 2 when it is
rejected as a whole (``{"error": "..."}`` with ``--json``, else a message on
stderr), as :mod:`rosterd.cli.edge` decides. Text from the roster is shown as
plain text (never as Rich markup) and escaped when it holds control characters.
The import and Rich are loaded when the command runs, not when ``rosterd`` starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rosterd.cli import app, make_console
from rosterd.cli.edge import errors_as_json
from rosterd.tokens import GB

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from rosterd.roster import ImportedRoster

roster_app = typer.Typer(help="Read the lab's roster.", no_args_is_help=True)
app.add_typer(roster_app, name="roster")


def _plain(text: str) -> Text:
    """Roster text as a table cell: never markup, escaped if not printable."""
    from rich.text import Text

    from rosterd.rust_debug import rust_debug_str

    shown = text if text.isprintable() else rust_debug_str(text)
    return Text(shown)


def _gib(weights_bytes: int, unmeasured: bool = False) -> str:
    """The ``GiB`` cell: ``0.50``, or ``~0.50 (unmeasured)`` for a ``"~N"`` ``ram_gb``."""
    shown = f"{weights_bytes / GB:.2f}"
    return f"~{shown} (unmeasured)" if unmeasured else shown


def render_tables(result: ImportedRoster, console: Console) -> None:
    """Print ``result`` as tables: imported specs, skipped entries, then warnings."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    specs = Table(
        title=f"Imported specs ({len(result.specs)})", title_justify="left", box=box.SIMPLE_HEAD
    )
    for column in ("role", "flavor", "model", "port", "GiB", "latency", "sticky"):
        specs.add_column(
            column,
            justify="right" if column in ("port", "GiB") else "left",
            no_wrap=column != "model",
            min_width=12 if column == "model" else None,
            overflow="fold",
        )
    specs.add_column("excludes", overflow="fold")
    specs.add_column("status", overflow="fold")
    for imported in result.specs:
        spec = imported.spec
        specs.add_row(
            _plain(spec.role),
            Text(spec.flavor.id),
            _plain(spec.model) if spec.model is not None else Text("-", style="dim"),
            Text(str(spec.serve.port) if spec.serve.port is not None else "-"),
            Text(_gib(spec.memory.weights_bytes, imported.ram_gb_unmeasured)),
            Text(spec.latency_class.value),
            Text("yes" if spec.sticky else "no"),
            _plain(", ".join(spec.excludes)) if spec.excludes else Text("-", style="dim"),
            _plain(imported.status) if imported.status else Text("-", style="dim"),
        )
    console.print(specs)
    if result.skipped:
        skipped = Table(
            title=f"Skipped entries ({len(result.skipped)})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        skipped.add_column("id", overflow="fold")
        skipped.add_column("reason", overflow="fold")
        for role, reason in result.skipped:
            skipped.add_row(_plain(role), _plain(reason))
        console.print(skipped)
        if result.aliases:
            # The import cannot see the fleet; `plan` and `up` can, and serve such an alias
            # on its own when the fleet gives it other weights (rosterd.weights).
            console.print(
                Text(
                    "An alias is served by the server of the role it aliases; `rosterd plan` "
                    "and `rosterd up` serve it as a role of its own when the fleet file's "
                    "models: gives it other weights than that role."
                )
            )
    for warning in result.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"))


def result_to_json(result: ImportedRoster) -> dict[str, object]:
    """The ``--json`` object: ``specs``, ``skipped`` (``[id, reason]`` pairs), ``warnings``."""
    from rosterd.roster import spec_to_json

    return {
        "specs": [spec_to_json(imported) for imported in result.specs],
        "skipped": [[role, reason] for role, reason in result.skipped],
        "warnings": list(result.warnings),
    }


@roster_app.command("import")
def import_cmd(
    ctx: typer.Context,
    roster: Annotated[Path, typer.Argument(help="The roster YAML file (read, never written).")],
    overlay: Annotated[
        Path | None,
        typer.Option(
            "--overlay", help="Operator overlay YAML: excludes, latency_class, sticky per role."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
) -> None:
    """Import the roster: validated inference specs, and every skipped entry with its reason."""
    if as_json:
        errors_as_json(ctx)
    from rosterd.roster.importer import load_roster

    result = load_roster(roster, overlay)
    if as_json:
        sys.stdout.write(json.dumps(result_to_json(result)) + "\n")
        return
    console = make_console()  # piped output (logs, docs) gets room for full model names
    render_tables(result, console)
