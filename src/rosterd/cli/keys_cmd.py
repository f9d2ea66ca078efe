"""``rosterd keys add|list|remove``: edit the keys file (layer 8).

``rosterd keys add NAME --keys FILE [--scope S]... [--models PATTERN]...`` makes a
random key (:func:`rosterd.keys.new_token`, 256 bits), writes only its hash to the
file and prints the key once, as the last word of its output: it cannot be shown
again. ``list`` shows what each key may do (never a hash), ``remove`` takes a key
out. A running ``rosterd up --keys FILE`` applies the change on its next reload
(``rosterd reload``, SIGHUP, or at once with ``--watch``).

The file is rewritten whole, through a temporary file renamed over it (a reader never
sees half of it), in the layout :func:`rosterd.keys.render_keys` writes: comments
a person added are not kept.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from rosterd.cli import app, make_console
from rosterd.cli.edge import errors_as_json
from rosterd.errors import OptionError

if TYPE_CHECKING:
    from rosterd.keys import ApiKey

E = TypeVar("E", bound=Enum)

keys_app = typer.Typer(
    name="keys",
    help="Add, list and remove API keys in a keys file (rosterd up --keys FILE).",
    no_args_is_help=True,
)
app.add_typer(keys_app)

KeysFileOption = Annotated[
    Path, typer.Option("--keys", metavar="FILE", help="The keys file (made if missing).")
]


def _read(path: Path) -> tuple[ApiKey, ...]:
    """The keys of ``path``; none when it does not exist.

    Raises:
        InputError: it exists and is rejected.
    """
    from rosterd.keys import load_keys

    if not path.exists():
        return ()
    return load_keys(path)


def _write(path: Path, keys: tuple[ApiKey, ...]) -> None:
    """Write ``keys`` to ``path`` through a temporary file renamed over it (its mode kept;
    0600 for a new file).

    Raises:
        OptionError: the file or its folder cannot be written.
    """
    from rosterd.keys import render_keys

    text = render_keys(keys, str(path))
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = 0o600
    folder = path.resolve().parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise OptionError(f"cannot write the keys file {path}: {exc.strerror or exc}") from None


@keys_app.command("add")
def add_cmd(
    name: Annotated[str, typer.Argument(help="The key's name (a plain token; unique).")],
    keys_file: KeysFileOption,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope", metavar="S", help="use, watch or operate (repeatable; default: use)."
        ),
    ] = None,
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--models",
            metavar="PATTERN",
            help="A role id, model name, alias or pattern (qwen-*) the key may use "
            "(repeatable; default: every model).",
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(help="interactive or batch: the queue its requests wait in."),
    ] = None,
    in_flight: Annotated[int | None, typer.Option(min=1, help="Limit: requests at once.")] = None,
    requests_per_minute: Annotated[
        int | None, typer.Option(min=1, help="Limit: requests per minute.")
    ] = None,
    tokens_per_day: Annotated[
        int | None, typer.Option(min=1, help="Limit: prompt + completion tokens per UTC day.")
    ] = None,
) -> None:
    """Make a new key, write its hash to the keys file, print the key once (last word)."""
    from rosterd.keys import ApiKey, KeyLimits, Scope, key_digest, new_token
    from rosterd.keys.reader import check_name, check_pattern
    from rosterd.spec import LatencyClass

    keys = _read(keys_file)
    problem = check_name(name)
    if problem is not None:
        raise OptionError(f"NAME {problem}")
    if any(key.name == name for key in keys):
        raise OptionError(
            f"the keys file {keys_file} has a key named {name!r} already; choose another "
            f"name, or `rosterd keys remove {shlex.quote(name)} --keys "
            f"{shlex.quote(str(keys_file))}` first"
        )
    scopes = {_choice(Scope, s, "--scope") for s in scope or ["use"]}
    for pattern in models or ():
        problem = check_pattern(pattern)
        if problem is not None:
            raise OptionError(f"--models {problem}")
    token = new_token()
    key = ApiKey(
        name,
        key_digest(token),
        frozenset(scopes),
        tuple(dict.fromkeys(models or ("*",))),
        _choice(LatencyClass, priority, "--priority") if priority is not None else None,
        KeyLimits(in_flight, requests_per_minute, tokens_per_day),
    )
    _write(keys_file, (*keys, key))
    held = ", ".join(s.value for s in Scope if s in key.scopes)
    make_console().print(
        f"added key {name!r} to {keys_file} (scopes: {held}; models: {', '.join(key.models)}); "
        "only its hash is kept, so copy the key now, it is not shown again:",
        markup=False,
    )
    sys.stdout.write(token + "\n")


def _choice(kind: type[E], value: str, option: str) -> E:
    """The member of the enum ``kind`` whose value is ``value``.

    Raises:
        OptionError: none is (the message names ``option`` and the choices).
    """
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise OptionError(f"{option} {value!r} is not one of {choices}") from None


@keys_app.command("list")
def list_cmd(
    ctx: typer.Context,
    keys_file: KeysFileOption,
    as_json: Annotated[bool, typer.Option("--json", help="Print the keys as JSON.")] = False,
) -> None:
    """List the keys of the keys file: name, scopes, models, priority, limits (no hashes)."""
    if as_json:
        errors_as_json(ctx)
    keys = _read(keys_file)
    if as_json:
        sys.stdout.write(json.dumps({"keys": [k.as_json() for k in keys]}, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table("name", "scopes", "models", "priority", "in flight", "req/min", "tokens/day")
    for key in keys:
        limits = key.limits
        table.add_row(
            key.name,
            ", ".join(sorted(s.value for s in key.scopes)),
            ", ".join(key.models),
            key.priority.value if key.priority else "-",
            *(
                str(v) if v is not None else "-"
                for v in (limits.in_flight, limits.requests_per_minute, limits.tokens_per_day)
            ),
        )
    make_console().print(table)


@keys_app.command("remove")
def remove_cmd(
    name: Annotated[str, typer.Argument(help="The key's name.")],
    keys_file: KeysFileOption,
) -> None:
    """Take the key NAME out of the keys file (a running up drops it on its next reload)."""
    keys = _read(keys_file)
    kept = tuple(key for key in keys if key.name != name)
    if len(kept) == len(keys):
        known = ", ".join(k.name for k in keys) or "none"
        raise OptionError(
            f"the keys file {keys_file} has no key named {name!r} (keys: {known}; "
            f"`rosterd keys list --keys {shlex.quote(str(keys_file))}` shows them)"
        )
    _write(keys_file, kept)
    make_console().print(
        f"removed key {name!r} from {keys_file}; a running `rosterd up --keys "
        f"{shlex.quote(str(keys_file))}` drops it on its next reload (`rosterd reload`)",
        markup=False,
    )
