"""``rosterd ps``, ``rosterd load ROLE``, ``rosterd unload ROLE`` and ``rosterd reload``:
talk to a running ``rosterd up`` over HTTP (layer 8).

``--url`` (default ``http://127.0.0.1:8400``) says where it listens; ``--api-key``
or ``ROSTERD_API_KEY`` when it requires one (a trailing ``/v1``, the OpenAI base
URL, is taken as the same place). Nothing answering is exit 3
(:class:`~rosterd.cli.edge.NotRunningError`); a refusal (unknown role, a missing
or wrong key, a load that failed) is exit 2 with rosterd up's message.

The HTTP client is the standard library's ``http.client``: one request and one
JSON answer need nothing more, and it imports in a few milliseconds where httpx
takes about 70 ms, a third of what these commands may cost in all (they start
in under 0.25 s). It reads no proxy variables, as ``up``'s own client does not
(``trust_env=False``).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rosterd.cli import DEFAULT_URL, app, make_console
from rosterd.cli.edge import errors_as_json
from rosterd.errors import AnswerError, NotRunningError, OptionError, RequestRefusedError
from rosterd.tokens import GB, valid_token

if TYPE_CHECKING:
    import http.client

UrlOption = Annotated[str, typer.Option(help="Where rosterd up listens.")]
KeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="ROSTERD_API_KEY", help="API key, if any.")
]


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """An HTTP connection to ``url``'s host and the path prefix of ``url`` (no slash at end).

    A trailing ``/v1`` (or ``/v1/``) is dropped: it is the OpenAI clients' base URL
    of the same ``rosterd up``, whose own paths (``/rosterd/...``) are beside it.

    Raises:
        OptionError: ``url`` is not ``http://HOST[:PORT][/PREFIX]`` (or https).
    """
    import http.client

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OptionError(
            f"--url {url!r} is not an http:// URL; give where rosterd up listens, such as "
            f"{DEFAULT_URL}"
        )
    try:
        port = parts.port
    except ValueError:
        raise OptionError(f"--url {url!r} has no usable port (1..65535)") from None
    conn_type = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    prefix = parts.path.rstrip("/").removesuffix("/v1")
    return conn_type(parts.hostname, port, timeout=timeout_s), prefix


def refusal(status: int, body: bytes, api_key: str | None) -> RequestRefusedError:
    """The error of rosterd up's 4xx/5xx answer ``body``: its OpenAI message after the
    status. A 401 says how to give the key (``--api-key``, ``ROSTERD_API_KEY``), or that
    the one given (``api_key``) is not accepted."""
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    said = message or text[:300]
    if status == 401:
        if api_key:
            return RequestRefusedError(
                status,
                f"401: rosterd up does not accept the API key given (--api-key or "
                f"ROSTERD_API_KEY); pass one of the keys it was started with ({said})",
            )
        return RequestRefusedError(
            status,
            f"401: rosterd up requires an API key: pass --api-key KEY or set "
            f"ROSTERD_API_KEY ({said})",
        )
    return RequestRefusedError(status, f"{status}: {said}")


def call(method: str, url: str, path: str, api_key: str | None, timeout_s: float) -> Any:
    """``method`` ``path`` on the rosterd up at ``url``; its JSON answer.

    ``timeout_s`` bounds each wait on the connection (connect, every read).

    Raises:
        NotRunningError: nothing answers at ``url`` (refused, timed out, not HTTP).
        OptionError: ``url`` is not usable.
        RequestRefusedError: rosterd up answered 4xx/5xx (its message, after the status).
        AnswerError: rosterd up answered without JSON.
    """
    import http.client

    connection, prefix = _connection(url, timeout_s)
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        connection.request(method, prefix + path, headers=headers)
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise NotRunningError(
            f"no rosterd up answers at {url} ({type(exc).__name__}); start one with "
            "`rosterd up ROSTER` or pass --url"
        ) from None
    finally:
        connection.close()
    if response.status >= 400:
        raise refusal(response.status, body, api_key)
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        raise AnswerError(
            f"rosterd up at {url} answered {path} with no JSON: {text[:300]!r}"
        ) from None


def role_path(action: str, role: str) -> str:
    """``/rosterd/{action}/{role}`` with ``role`` percent-encoded as one path segment.

    Raises:
        OptionError: ``role`` is not a plain token of at most 64 bytes, such as
            ``../load/x`` or ``x?y=1`` (exit 2, before any request).
    """
    if not valid_token(role, 64):
        raise OptionError(
            f"ROLE {role!r} is not a plain token (1 to 64 ASCII letters, digits, '.', '_' "
            "or '-', starting with a letter or digit); give a role id, an alias id or a "
            "model name that is one (`rosterd ps` lists the roles)"
        )
    return f"/rosterd/{action}/{urllib.parse.quote(role, safe='')}"


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GB:.2f}"


def _gib_or_dash(n_bytes: object) -> str:
    return _gib(n_bytes) if isinstance(n_bytes, int) else "-"


def _age(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


@app.command("ps")
def ps_cmd(
    ctx: typer.Context,
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print rosterd up's answer as JSON (GET /rosterd/ps).")
    ] = False,
) -> None:
    """What is resident where: memory, requests, idle time, why requests wait, last errors.

    Memory per role: the roster's ram_gb, the estimate, the peak measured on the last
    run, the figure that counts (the largest) and the RSS now; the KV cache kept across
    swaps and the last restore's result; under each node's table, a note per role on why
    its queued requests wait, its load backoff and its last error."""
    if as_json:
        errors_as_json(ctx)
    data = call("GET", url, "/rosterd/ps", api_key, 10.0)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    from rich.table import Table
    from rich.text import Text

    console = make_console()
    for name, node in data.get("nodes", {}).items():
        # With a Ray fleet each node says whether it runs, and how (or why not).
        connection = node.get("connection")
        how = f" ({node.get('address')}, {connection})" if connection else ""
        table = Table(
            title=f"node {name}{how}: {_gib(node['resident_bytes'])} of "
            f"{_gib(node['capacity_bytes'])} GiB resident",
            title_justify="left",
            caption="GiB: what counts, the largest of ram_gb (~: unmeasured), the estimate "
            "and the peak measured on the last run; RSS: now; idle: since the last request; "
            "KV kept: the tokens and bytes of its KV cache kept on disk across swaps, and "
            "the last restore's result",
            caption_justify="left",
        )
        table.add_column("role", no_wrap=True)
        table.add_column("state", no_wrap=True)
        columns = ("class", "ram_gb", "estimate", "measured", "GiB", "RSS GiB", "running", "queue")
        for column in (*columns, "idle"):
            table.add_column(column, justify="right", no_wrap=True)
        table.add_column("KV kept", no_wrap=True)
        for role, info in node.get("roles", {}).items():
            rss = info.get("measured_rss_bytes")
            moved_to = info.get("moved_to")
            memory = info.get("memory") or {}
            declared = memory.get("declared_bytes")
            table.add_row(
                Text(role),
                f"moved to {moved_to}" if moved_to else info["phase"],
                info["latency_class"],
                ("~" if memory.get("declared_unmeasured") else "") + _gib(declared)
                if isinstance(declared, int)
                else "-",
                _gib_or_dash(memory.get("estimated_bytes")),
                _gib_or_dash(memory.get("measured_bytes")),
                # "~": what counts is the roster's guess (unmeasured, as ram_gb's column)
                ("~" if _guessed(memory) else "") + _gib(info["resident_bytes"]),
                _gib(rss) if isinstance(rss, int) else "-",
                str(info["running"]),
                str(info["queued"]),
                _age(info.get("idle_s")),
                Text(str(info.get("kv_summary") or "—")),
            )
        console.print(table)
        for line in _pool_lines(node):
            console.print(Text(line), soft_wrap=True)
        for role, info in node.get("roles", {}).items():
            for line in _role_notes(role, info):
                console.print(Text(line), soft_wrap=True)


def _pool_lines(node: dict[str, Any]) -> list[str]:
    """One line per device pool of a node (``pools`` beside host RAM): what counts
    resident there against its capacity, where the figure comes from (declared, probed,
    or a Mac's default GPU share) and each role's bytes there."""
    lines: list[str] = []
    for device, pool in (node.get("pools") or {}).items():
        if device == "host" or not isinstance(pool, dict):
            continue
        declared, probed = pool.get("declared_bytes"), pool.get("probed_total_bytes")
        origin = [f"declared {_gib(declared)} GiB"] if isinstance(declared, int) else []
        origin.append(
            f"probed {_gib(probed)} GiB"
            if isinstance(probed, int)
            else "Metal's default share"
            if pool.get("source") == "default"
            else "no probe sees it"
        )
        roles = ", ".join(f"{r} {_gib(b)}" for r, b in (pool.get("roles") or {}).items())
        lines.append(
            f"{device}: {_gib_or_dash(pool.get('resident_bytes'))} of "
            f"{_gib_or_dash(pool.get('capacity_bytes'))}"
            f" GiB resident ({'; '.join(origin)}); placed there: {roles or 'none'}"
        )
    return lines


def _guessed(memory: dict[str, Any]) -> bool:
    """Whether the figure that counts is the roster's unmeasured ``"~N"`` guess."""
    return bool(memory.get("declared_unmeasured")) and memory.get("counted_from") == "roster"


def _role_notes(role: str, info: dict[str, Any]) -> list[str]:
    """Lines under the table: why a role's queued requests wait (and for how long), its
    load backoff and its last error (load failure, crash, failed probe)."""
    notes: list[str] = []
    if info.get("unavailable_reason"):
        notes.append(f"{role}: unavailable: {info['unavailable_reason']}")
    copies = info.get("copies")
    if isinstance(copies, list) and len(copies) > 1:
        notes.append(f"{role}: one of {len(copies)} copies, on {', '.join(copies)}")
    if info.get("retiring"):
        notes.append(f"{role}: retiring: a reload removed it here; it stops once idle")
    if info.get("restart_pending"):
        notes.append(
            f"{role}: restarts once idle (or after --drain): a reload changed what it launches"
        )
    if info.get("queued") and info.get("waiting_reason"):
        waited = _age(info.get("waiting_s"))
        notes.append(f"{role}: {info['queued']} queued (oldest {waited}): {info['waiting_reason']}")
    backoff = info.get("load_backoff_s")
    if isinstance(backoff, int | float):
        notes.append(f"{role}: no load for {backoff:.0f} s more (backoff after failed loads)")
    kv = info.get("kv")
    if isinstance(kv, dict) and kv.get("not_kept"):
        notes.append(f"{role}: KV cache not kept across swaps: {kv['not_kept']}")
    if isinstance(kv, dict) and kv.get("last_restore_check") == "not reused":
        detail = str(kv.get("last_restore_check_detail") or "").removeprefix(f"role {role}: ")
        notes.append(f"{role}: {detail}")
    if info.get("last_error"):
        notes.append(
            f"{role}: last error ({_age(info.get('last_error_age_s'))} ago): {info['last_error']}"
        )
    return notes


@app.command("load")
def load_cmd(
    role: Annotated[str, typer.Argument(help="Role (or model name / alias) to make resident.")],
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Make ROLE resident now (evicting idle roles if the policy allows)."""
    started = time.monotonic()
    data = call("POST", url, role_path("load", role), api_key, 3600.0)
    _say(
        f"{data['role']} is resident on {data['node']} at {data['base_url']} "
        f"({time.monotonic() - started:.1f} s){_evictions_said(data)}"
    )


def _evictions_said(data: dict[str, Any]) -> str:
    """``; evicted a, b to make room, c (they exclude each other)`` for a load's answer,
    or "" when it stopped nothing. An older rosterd up answers ``evicted`` (names, all
    taken as making room) without ``evictions``, or neither (nothing is said then)."""
    evictions = data.get("evictions")
    if evictions is None:
        evictions = [{"role": name, "cause": "make_room"} for name in data.get("evicted") or []]
    room = [e["role"] for e in evictions if e.get("cause") != "exclusion"]
    excluded = [e["role"] for e in evictions if e.get("cause") == "exclusion"]
    parts = [f"{', '.join(room)} to make room"] if room else []
    if excluded:
        parts.append(f"{', '.join(excluded)} (they exclude each other)")
    return f"; evicted {', '.join(parts)}" if parts else ""


@app.command("unload")
def unload_cmd(
    role: Annotated[str, typer.Argument(help="Role (or model name / alias) to stop.")],
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Stop ROLE (every copy) once its requests finished; its memory is free when this returns."""
    data = call("POST", url, role_path("unload", role), api_key, 3600.0)
    _say(f"{data['role']} is no longer resident")


def _say(line: str) -> None:
    """One line on stdout, as plain text (role names are never Rich markup)."""
    from rich.text import Text

    make_console().print(Text(line))


@app.command("reload")
def reload_cmd(
    url: UrlOption = DEFAULT_URL,
    api_key: KeyOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Apply the files even if they serve no role (a reload that would "
            "stop every role is refused without it).",
        ),
    ] = False,
) -> None:
    """Re-read the roster, overlay, fleet and keys file of rosterd up; apply them if valid."""
    path = "/rosterd/reload?force=true" if force else "/rosterd/reload"
    data = call("POST", url, path, api_key, 120.0)
    for warning in data.get("warnings") or ():  # the import's notes, as `roster import` says
        typer.echo(f"warning: {warning}", err=True)
    lines: list[str] = []
    for name, node in data.get("nodes", {}).items():
        for key in ("added", "retired", "restarted", "updated"):
            if node.get(key):
                lines.append(f"node {name}: {key} {', '.join(node[key])}")
        capacity = node.get("capacity_bytes")
        if capacity:
            lines.append(f"node {name}: capacity {_gib(capacity[0])} -> {_gib(capacity[1])} GiB")
        for device, (before, after) in (node.get("device_capacity_bytes") or {}).items():
            lines.append(
                f"node {name}: device {device} capacity {_gib(before)} -> {_gib(after)} GiB"
            )
    for key, what in (("added_nodes", "nodes added"), ("drained_nodes", "nodes drained")):
        if data.get(key):
            lines.append(f"{what}: {', '.join(data[key])}")
    for role, reason in (data.get("why") or {}).items():
        lines.append(f"role {role} is no longer served: {reason}")
    if not lines:
        lines.append("reloaded: nothing changed")
    for line in lines:
        _say(line)
