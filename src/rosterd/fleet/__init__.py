"""The fleet: the node inventory rosterd plans across (layer 2; reading is the only I/O).

One concept a module:

- :mod:`~rosterd.fleet.model`: the value types (``Platform``, ``Node``,
  ``ModelSource``, ``Fleet``, ``default_reserved_bytes``);
- :mod:`~rosterd.fleet.reader`: a fleet file read (``load_fleet``, ``parse_fleet``);
- :mod:`~rosterd.fleet.fields`: typed reads of the file's fields, for the reader;
- :mod:`~rosterd.fleet.device_reader`: a node's ``devices:`` list;
- :mod:`~rosterd.fleet.local`: the fleet of this machine alone when no file is given
  (``local_fleet``, ``detect_platform``);
- :mod:`~rosterd.fleet.addresses`: which machine a node's address names
  (``is_this_machine``).

The value types are re-exported here; import them from ``rosterd.fleet``. The reader
and ``local`` are not: they read files and the machine, and the pure layers that import
the value types must not import those along with them.
"""

from __future__ import annotations

from rosterd.fleet.model import Fleet, ModelSource, Node, Platform, default_reserved_bytes

__all__ = [
    "Fleet",
    "ModelSource",
    "Node",
    "Platform",
    "default_reserved_bytes",
]
