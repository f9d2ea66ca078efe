"""The keys of one ``rosterd up`` (layer 8): ``--keys FILE`` and ``--api-key`` as one
:class:`~rosterd.keys.KeyRing`, read at the start and again on every reload; and the
usage database each key's use is kept in (:mod:`rosterd.usage`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rosterd.errors import StateDirError
from rosterd.keys import KeyRing, load_keys
from rosterd.up.options import UpOptions
from rosterd.usage import UsageStore


def read_key_ring(options: UpOptions) -> KeyRing:
    """The keys of ``options``: the keys file's (if given) and the ``--api-key`` keys
    (every scope and model, no limits).

    Raises:
        InputError: the keys file is rejected (file, field, line and column named).
    """
    file_keys = load_keys(options.keys_path) if options.keys_path is not None else ()
    return KeyRing.of(file_keys, options.api_keys)


def open_usage(state_dir: Path) -> UsageStore:
    """The usage database of the state folder, open (close it when serving ends).

    Raises:
        StateDirError: it cannot be created or opened (the message names it and why).
    """
    store = UsageStore(state_dir)
    try:
        store.open()
    except (OSError, sqlite3.Error) as exc:
        raise StateDirError(f"cannot open the usage database {store.path}: {exc}") from None
    return store
