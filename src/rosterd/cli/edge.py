"""The ``rosterd`` command's error edge (layer 8): every failure becomes a message and an
exit status here, and nowhere else.

Commands raise; they never print an error or choose an exit status. The root
command group runs every command inside :func:`run_in_edge`, so the same edge
holds for the console script (:func:`rosterd.cli.main`) and for Typer's test
runner. Exit statuses, one per
kind of failure (as pre-commit's ``error_handler`` does it):

==== ==================================================================
0    done
1    internal error: an exception rosterd did not expect, i.e. a bug; one
     line on stderr, its traceback only with ``-v`` (``rosterd -v CMD`` or
     ``rosterd up -v``) or ``ROSTERD_DEBUG=1``
2    bad input, or a request a running ``rosterd up`` refused: any
     :class:`~rosterd.errors.RosterdError` (file, field path, line, column
     when it is a file's fault)
3    no running ``rosterd up`` answers (:class:`NotRunningError`)
130  interrupted (Ctrl-C), as Typer ends a command on ``KeyboardInterrupt``
==== ==================================================================

Usage errors (an unknown option, a missing argument) stay Click's: its message
and exit 2. A command with ``--json`` calls :func:`errors_as_json`
so that its errors are ``{"error": "..."}`` on stdout instead of a line on stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import typer

from rosterd.errors import NotRunningError, RosterdError

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_RUNNING = 3

#: Keys of ``ctx.meta`` (one dict shared by a command's context and its parents').
_JSON_KEY = "rosterd.errors_as_json"
_TRACEBACK_KEY = "rosterd.show_tracebacks"


def exit_status(error: RosterdError) -> int:
    """The exit status of ``error``: 3 for :class:`NotRunningError`, else 2 (bad input)."""
    return EXIT_NOT_RUNNING if isinstance(error, NotRunningError) else EXIT_BAD_INPUT


def _fail(message: str, as_json: bool) -> None:
    """Show one error the way the command's output goes: ``{"error": message}`` on stdout
    for ``--json``, else ``rosterd: message`` as one plain line on stderr (never wrapped
    or styled, whatever the terminal)."""
    if as_json:
        sys.stdout.write(json.dumps({"error": message}) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"rosterd: {message}\n")
        sys.stderr.flush()


def errors_as_json(ctx: typer.Context) -> None:
    """Report the errors of the command running in ``ctx`` as ``{"error": ...}`` on stdout."""
    ctx.meta[_JSON_KEY] = True


def show_tracebacks(ctx: typer.Context) -> None:
    """Print the traceback of an internal error of the command running in ``ctx``."""
    ctx.meta[_TRACEBACK_KEY] = True


def run_in_edge(command: Callable[[], Any], meta: dict[str, Any]) -> Any:
    """``command()``, with every failure turned into its message and exit status.

    ``meta`` says how to show it (``--json``, tracebacks); read after the command
    ran, since the command sets it.

    Raises:
        typer.Exit: with the exit status of the failure (the message is shown).
    """
    try:
        return command()
    except (typer.Exit, typer.Abort, typer.TyperException):
        raise  # Click's own exits, --help and usage errors: Click shows them
    except RosterdError as exc:
        _fail(str(exc), bool(meta.get(_JSON_KEY)))
        raise typer.Exit(exit_status(exc)) from None
    except Exception as exc:
        if meta.get(_TRACEBACK_KEY) or os.environ.get("ROSTERD_DEBUG") == "1":
            traceback.print_exception(exc, file=sys.stderr)
        _fail(
            f"internal error ({type(exc).__name__}: {exc}); this is a bug in rosterd: run "
            "the command again with -v (rosterd -v COMMAND ...) for the traceback and report it",
            bool(meta.get(_JSON_KEY)),
        )
        raise typer.Exit(EXIT_INTERNAL) from None
