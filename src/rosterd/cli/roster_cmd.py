"""``rosterd roster import``: the roster import as a command."""

from __future__ import annotations

import typer

from rosterd.cli import app

roster_app = typer.Typer(help="Read the lab's roster.", no_args_is_help=True)
app.add_typer(roster_app, name="roster")


@roster_app.command("import")
def import_cmd() -> None:
    """Import the roster (not built yet)."""
    raise typer.Exit(2)
