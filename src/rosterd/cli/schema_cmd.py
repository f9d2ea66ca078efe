"""``rosterd schema roster|overlay|fleet|keys``: print the JSON Schema of a file rosterd reads
(layer 8), for an editor to validate the file with (:mod:`rosterd.schemas`)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rosterd.cli import app
from rosterd.errors import OptionError
from rosterd.schemas import SCHEMA_NAMES, schema_text


@app.command("schema")
def schema_cmd(
    name: Annotated[
        str, typer.Argument(metavar="roster|overlay|fleet|keys", help="Which file's schema.")
    ],
) -> None:
    """Print the JSON Schema of the roster, overlay, fleet or keys file (for editors)."""
    if name not in SCHEMA_NAMES:
        raise OptionError(f"no schema named {name!r}; expected one of {', '.join(SCHEMA_NAMES)}")
    sys.stdout.write(schema_text(name))
