"""The ``rosterd`` command (layer 8): the only place that prints or exits.

Typer + Rich: Typer gives typed options and ``--help`` from signatures, Rich
gives tables that stay readable in a terminal. Each command group lives in its
own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="rosterd",
    help="Serve a model lab's roster of local LLMs: import, plan, launch, route.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # Imported for their side effect of adding commands to ``app``.
    from rosterd.cli import (
        plan_cmd,  # noqa: F401
        roster_cmd,  # noqa: F401
        serve_cmd,  # noqa: F401
    )


def main() -> None:
    """Entry point of the ``rosterd`` console script."""
    _register()
    app()
