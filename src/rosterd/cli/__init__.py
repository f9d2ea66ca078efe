"""The ``rosterd`` command (layer 8): the only place that prints or exits.

Typer + Rich: Typer gives typed options and ``--help`` from signatures, Rich
gives tables that stay readable in a terminal. Each command group lives in its
own module and registers itself on :data:`app`; errors become a message and an
exit status in one place, :mod:`rosterd.cli.edge`.

A command starts at once: the command modules import at their top only Typer
and the standard library, and everything a command uses (the roster import, the
solver, the HTTP server, Rich tables) inside the command's body. ``rosterd
--help``, ``--version``, ``ps``, ``load``, ``unload``, ``reload``, ``logs``, ``schema``
and ``roster import`` so never load OR-Tools, numpy or uvicorn
(``tests/cli/test_cli_startup.py`` checks it).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer
from typer.core import TyperGroup

from rosterd.cli.edge import EXIT_INTERNAL, EXIT_OK, run_in_edge, show_tracebacks

if TYPE_CHECKING:
    from rich.console import Console

#: Where ``rosterd up`` listens unless told otherwise, and where ``ps``/``load``/``unload`` ask.
from rosterd.up.defaults import DEFAULT_HOST, DEFAULT_PORT

DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


class _RosterdGroup(TyperGroup):
    """The root ``rosterd`` group: every command runs inside the error edge."""

    def invoke(self, ctx: Any) -> Any:
        return run_in_edge(lambda: super(_RosterdGroup, self).invoke(ctx), ctx.meta)


def _text_and_flags_as_given(command: Any) -> None:
    """Give each plain ``str`` or ``bool`` parameter of ``command`` and its subcommands
    Typer's pass-through coercion (the value as Click parsed it).

    Typer 0.2x checks every parameter value with a pydantic ``TypeAdapter``
    built when the command runs; importing pydantic for that costs about 0.3 s,
    more than ``ps``, ``load`` and ``unload`` may take in all. Click already
    gives such a parameter a ``str`` or a ``bool``, so there is nothing to
    check (``--help``, made on first use, is made here to be one of them).
    Other parameters (numbers with bounds, paths) keep Typer's own coercion; a
    Typer without this hook keeps its own for all (only slower).
    """
    try:
        from typer._coercion import PassThroughRuntimeParam
    except ImportError:
        return
    params = list(getattr(command, "params", ()))
    with contextlib.suppress(Exception):  # a Typer that makes --help another way
        params.append(command.get_help_option(typer.Context(command)))
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if (
            descriptor is not None
            and descriptor.annotation in (str, bool)
            and descriptor.parameter_info.parser is None
            and getattr(param, "_runtime_param", False) is None
        ):
            param._runtime_param = PassThroughRuntimeParam(
                annotation=descriptor.annotation, parameter_info=descriptor.parameter_info
            )
    for sub in getattr(command, "commands", {}).values():
        _text_and_flags_as_given(sub)


#: Width, in columns, of ``--help`` when stdout is not a terminal: Click's plain help text,
#: which wraps descriptions and puts a long option name on its own line, never cutting it.
PIPE_HELP_WIDTH = 120

app = typer.Typer(
    name="rosterd",
    help="Serve a model lab's roster of local LLMs: import, plan, launch, route.",
    cls=_RosterdGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Used only by Click's plain help (see _plain_help_when_piped); Rich help ignores them.
    context_settings={"max_content_width": PIPE_HELP_WIDTH, "terminal_width": PIPE_HELP_WIDTH},
)


def _print_version(given: bool) -> None:
    """``--version``: ``rosterd <version>`` on stdout, then exit 0 (before any command)."""
    if given:
        from rosterd import __version__

        sys.stdout.write(f"rosterd {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="On an internal error, show its traceback.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    # Options before the command name, for every command.
    if verbose:
        show_tracebacks(ctx)


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
    from rich.console import Console  # imported by the commands that print tables only

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, highlight=False)
    return Console(
        file=_TrimmedLines(stderr),  # type: ignore[arg-type]
        width=PIPE_WIDTH,
        soft_wrap=True,
        highlight=False,
    )


#: The command modules, in the order ``--help`` lists their commands.
_COMMAND_MODULES = (
    "plan_cmd",
    "roster_cmd",
    "serve_cmd",
    "client_cmd",
    "logs_cmd",
    "schema_cmd",
    "models_cmd",
    "keys_cmd",
    "usage_cmd",
)


def _register() -> None:
    # Imported for their side effect of adding commands to ``app``.
    for name in _COMMAND_MODULES:
        importlib.import_module(f"rosterd.cli.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rosterd`` command line ``argv`` (default: ``sys.argv[1:]``); its exit status.

    The console script exits with what this returns. The statuses (one per kind
    of failure, decided in :mod:`rosterd.cli.edge`): 0 ok, 1 internal error (a
    rosterd bug: one line, the traceback with ``-v``), 2 bad input or a refused
    request, 3 no running ``rosterd up`` answers, 130 interrupted (Ctrl-C).
    """
    _register()
    _plain_help_when_piped()
    command = typer.main.get_command(app)
    _text_and_flags_as_given(command)
    try:
        # Standalone mode: Click prints usage errors and --help itself and ends in
        # SystemExit; rosterd's own errors have become an exit status in the edge.
        command.main(
            args=list(argv) if argv is not None else None, prog_name="rosterd", standalone_mode=True
        )
    except SystemExit as exc:
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_INTERNAL
    return EXIT_OK
