"""The ``rosterd`` command (layer 8): the only place that prints or exits.

Typer + Rich: Typer gives typed options and ``--help`` from signatures, Rich
gives tables that stay readable in a terminal. Each command group lives in its
own module and registers itself on :data:`app`.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

import typer
from rich.console import Console

#: Width, in columns, of ``--help`` when stdout is not a terminal: Click's plain help text,
#: which wraps descriptions and puts a long option name on its own line, never cutting it.
PIPE_HELP_WIDTH = 120

app = typer.Typer(
    name="rosterd",
    help="Serve a model lab's roster of local LLMs: import, plan, launch, route.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Used only by Click's plain help (see _plain_help_when_piped); Rich help ignores them.
    context_settings={"max_content_width": PIPE_HELP_WIDTH, "terminal_width": PIPE_HELP_WIDTH},
)


#: Console width, in columns, when the output is not a terminal (a pipe, a file, nohup):
#: wide enough that tables never shrink or cut a name; lines are only as long as their text.
PIPE_WIDTH = 1000


def _plain_help_when_piped() -> None:
    """When stdout is not a terminal, make ``--help`` and usage errors Click's plain text,
    :data:`PIPE_HELP_WIDTH` columns wide.

    Typer's Rich panels are sized to 80 columns when stdout is a pipe or a file,
    which cuts option names (``--max-concurren…``) and pads lines with spaces. On
    a terminal the Rich help stays. Call before :data:`app` runs.
    """
    if not sys.stdout.isatty():
        app.rich_markup_mode = None


class _TrimmedLines:
    """A text stream that writes to ``sys.stdout``/``sys.stderr`` (looked up at each write,
    so a redirection made later still applies) with trailing spaces removed from each line."""

    def __init__(self, stderr: bool) -> None:
        self.stderr = stderr

    @property
    def stream(self) -> TextIO:
        return sys.stderr if self.stderr else sys.stdout

    def write(self, text: str) -> int:
        self.stream.write("\n".join(line.rstrip(" ") for line in text.split("\n")))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.stream.fileno()


def make_console(stderr: bool = False) -> Console:
    """A Rich console on stdout (or stderr) for what a command prints.

    On a terminal: Rich's usual one, sized to the terminal. Otherwise (a pipe, a
    file, nohup): :data:`PIPE_WIDTH` columns, no soft wrapping of printed text
    (a message stays one line) and no trailing spaces, so logs
    keep whole names and lines. Decided when called, so call it when the
    command runs.
    """
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, highlight=False)
    return Console(
        file=_TrimmedLines(stderr),  # type: ignore[arg-type]
        width=PIPE_WIDTH,
        soft_wrap=True,
        highlight=False,
    )


def _register() -> None:
    # Imported for their side effect of adding commands to ``app``.
    from rosterd.cli import (
        plan_cmd,  # noqa: F401
        roster_cmd,  # noqa: F401
        serve_cmd,  # noqa: F401
    )


def main() -> None:
    """Entry point of the ``rosterd`` console script.

    Commands report every error a user can cause themselves (exit 2). Anything
    else is a rosterd bug: it still ends in one line on stderr and exit 1, not a
    traceback, unless ``ROSTERD_DEBUG=1`` asks for the traceback.
    """
    _register()
    _plain_help_when_piped()
    try:
        app(standalone_mode=True)
    except Exception as exc:
        if os.environ.get("ROSTERD_DEBUG") == "1":
            raise
        typer.echo(
            f"rosterd: internal error ({type(exc).__name__}: {exc}); this is a bug in "
            "rosterd: run again with ROSTERD_DEBUG=1 for the traceback and report it",
            err=True,
        )
        sys.exit(1)
