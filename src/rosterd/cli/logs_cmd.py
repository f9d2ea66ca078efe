"""``rosterd logs ROLE [-f] [-n N]``: a role's backend log, from a running ``rosterd up``
(layer 8).

It asks ``GET /rosterd/logs/{role}`` (``--url``, ``--api-key`` as ``ps``): the
last N lines, across the rotated files, and with ``-f`` everything the backend
writes next, until Ctrl-C. The bytes are written to stdout as the backend
wrote them. A role with copies on several nodes of the ``up`` has a log per copy:
``--node`` picks one; without it the tail shows each copy's under its file name.
Like ``ps``, it talks ``http.client`` and imports nothing heavy.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rosterd.cli import DEFAULT_URL, app
from rosterd.cli.client_cmd import KeyOption, UrlOption, _connection, refusal, role_path
from rosterd.errors import NotRunningError, OptionError
from rosterd.tokens import valid_token

#: Seconds to wait for ``rosterd up`` to connect and answer (a followed log then waits forever).
ANSWER_TIMEOUT_S = 30.0
#: The most lines ``-n`` may ask for (``GET /rosterd/logs``'s limit).
MAX_LINES = 10_000
#: Bytes copied to stdout per read.
COPY_BLOCK_BYTES = 64 * 1024


def _line_count(given: str) -> int:
    """``-n``'s value as a number of lines; raises ``OptionError`` unless 0..10000."""
    try:
        count = int(given)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_LINES:
        raise OptionError(f"-n/--lines {given!r} is not a whole number from 0 to {MAX_LINES}")
    return count


@app.command("logs")
def logs_cmd(
    role: Annotated[str, typer.Argument(help="Role (or model name / alias) whose log to show.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep writing what the backend writes next.")
    ] = False,
    # Text, checked here: a bounded int option would load pydantic (0.3 s) to check it.
    lines: Annotated[
        str,
        typer.Option("--lines", "-n", metavar="N", help="Lines of the end to show (0 to 10000)."),
    ] = "200",
    node: Annotated[
        str | None,
        typer.Option(
            "--node", metavar="NODE", help="The copy on this node, for a role with copies."
        ),
    ] = None,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Show the end of ROLE's backend log (with -f, and what it writes next)."""
    import http.client

    count = _line_count(lines)
    if node is not None and not valid_token(node, 64):
        raise OptionError(f"--node {node!r} is not a node name (a plain token)")
    path = role_path("logs", role) + f"?lines={count}" + ("&follow=1" if follow else "")
    path += f"&node={node}" if node is not None else ""
    connection, prefix = _connection(url, ANSWER_TIMEOUT_S)
    headers = {"Accept": "text/plain"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    out = sys.stdout.buffer
    try:
        try:
            connection.request("GET", prefix + path, headers=headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise NotRunningError(
                f"no rosterd up answers at {url} ({type(exc).__name__}); start one with "
                "`rosterd up ROSTER` or pass --url"
            ) from None
        if response.status >= 400:
            raise refusal(response.status, response.read(), api_key)
        if follow and connection.sock is not None:
            connection.sock.settimeout(None)  # a quiet backend writes nothing for a long time
        wrote = False
        try:
            while chunk := response.read1(COPY_BLOCK_BYTES):
                out.write(chunk)
                out.flush()
                wrote = True
        except (OSError, http.client.HTTPException) as exc:
            raise NotRunningError(f"rosterd up at {url} stopped answering ({exc})") from None
        if not wrote and not follow:  # an empty log says nothing: say why on stderr
            sys.stderr.write(f"rosterd: {role} has no backend log yet (it was not started)\n")
    finally:
        connection.close()
