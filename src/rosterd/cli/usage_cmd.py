"""``rosterd usage [--by key|role] [--since 7d] [--json|--csv]``: what each key used, asked
of a running ``rosterd up`` (layer 8), with ``--url`` and ``--api-key`` as ``rosterd ps``
takes them (the key needs the ``watch`` scope).

A table by key and role (``--by key`` or ``--by role``: summed over the other) of
requests, errors, prompt and completion tokens, and the queue wait and time served in
seconds; ``--json`` prints ``GET /rosterd/usage``'s answer, ``--csv`` the rows as CSV.
"""

from __future__ import annotations

import csv
import json
import sys
import urllib.parse
from typing import Annotated

import typer

from rosterd.cli import DEFAULT_URL, app, make_console
from rosterd.cli.client_cmd import KeyOption, UrlOption, call
from rosterd.cli.edge import errors_as_json
from rosterd.errors import OptionError

#: The counters shown, in order (as ``rosterd.usage.USAGE_FIELDS``, without importing it).
FIELDS = ("requests", "errors", "prompt_tokens", "completion_tokens", "queue_wait_s", "served_s")


@app.command("usage")
def usage_cmd(
    ctx: typer.Context,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
    by: Annotated[
        str | None, typer.Option(help="key or role: one row per key, or per role (default: both).")
    ] = None,
    since: Annotated[
        str, typer.Option(help="How far back: 90m, 12h, 7d, 2w (whole hours are kept).")
    ] = "7d",
    as_json: Annotated[bool, typer.Option("--json", help="Print GET /rosterd/usage.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV.")] = False,
) -> None:
    """What each key used, per role: requests, errors, tokens, queue wait and time served."""
    if as_json:
        errors_as_json(ctx)
    if by not in (None, "key", "role"):
        raise OptionError(f"--by {by!r} is not key or role")
    groups = [by] if by else ["key", "role"]
    query = urllib.parse.urlencode({"since": since, "by": ",".join(groups)})
    data = call("GET", url, f"/rosterd/usage?{query}", api_key, 30.0)
    rows = data.get("rows", [])
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    if as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow([*groups, *FIELDS])
        for row in rows:
            writer.writerow([row.get(name, "") for name in (*groups, *FIELDS)])
        return
    from rich.table import Table

    table = Table(*groups, *(f.replace("_", " ") for f in FIELDS), title=f"usage, last {since}")
    for row in rows:
        table.add_row(*(_cell(row.get(name)) for name in (*groups, *FIELDS)))
    make_console().print(table)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)
