"""JSON Schemas of the files rosterd reads (DESIGN.md layer 2): the roster, the overlay,
the fleet and the keys file, shipped as package data so editors can validate the files
(``rosterd schema roster|overlay|fleet|keys`` prints one).

They describe what the readers accept (:mod:`rosterd.roster`,
:mod:`rosterd.fleet`, :mod:`rosterd.keys`), not more: every roster the import accepts
is valid against ``roster``. What JSON Schema cannot say (a key given twice, a file over
1 MiB, whole-number floats as ports, a reserve larger than the memory) the
readers still refuse, naming the file, field, line and column. The roster and
overlay are read as YAML 1.2 (``yes`` is text), the fleet and keys files as YAML 1.1, as
their readers do.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

#: The schemas shipped, by the name ``rosterd schema NAME`` takes.
SCHEMA_NAMES: Final[tuple[str, ...]] = ("roster", "overlay", "fleet", "keys")


def schema_text(name: str) -> str:
    """The JSON text of the schema ``name`` (one of :data:`SCHEMA_NAMES`).

    Raises:
        KeyError: ``name`` is not one of them.
    """
    if name not in SCHEMA_NAMES:
        raise KeyError(name)
    return resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
