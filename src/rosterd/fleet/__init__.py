"""The fleet: the node inventory rosterd plans across (layer 2; reading is the only I/O).

One concept a module: :mod:`~rosterd.fleet.model` holds the value types
(``Platform``, ``Node``, ``ModelSource``, ``Fleet``, ``default_reserved_bytes``);
:mod:`~rosterd.fleet.reader` reads a fleet file (``load_fleet``, ``parse_fleet``);
:mod:`~rosterd.fleet.local` builds the fleet of this machine alone when no file
is given (``local_fleet``, ``detect_platform``).

The value types and the reader are re-exported here; import them from
``rosterd.fleet``. ``rosterd.fleet.local`` is not: it reads the machine (psutil), and
the pure layers that import the value types must not import it along with them.
"""

from __future__ import annotations

from rosterd.fleet.model import Fleet, ModelSource, Node, Platform, default_reserved_bytes
from rosterd.fleet.reader import MAX_FLEET_BYTES, MAX_NODES, load_fleet, parse_fleet

__all__ = [
    "MAX_FLEET_BYTES",
    "MAX_NODES",
    "Fleet",
    "ModelSource",
    "Node",
    "Platform",
    "default_reserved_bytes",
    "load_fleet",
    "parse_fleet",
]
