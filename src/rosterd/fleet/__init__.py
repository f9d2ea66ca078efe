"""The fleet: the node inventory rosterd plans across (layer 2; reading is the only I/O).

One concept a module: :mod:`~rosterd.fleet.model` holds the value types
(``Platform``, ``Node``, ``ModelSource``, ``Fleet``, ``default_reserved_bytes``);
:mod:`~rosterd.fleet.reader` reads a fleet file (``load_fleet``, ``parse_fleet``);
:mod:`~rosterd.fleet.local` builds the fleet of this machine alone when no file
is given (``local_fleet``, ``detect_platform``).

Everything other modules use is re-exported here; import it from ``rosterd.fleet``.
"""

from __future__ import annotations

from rosterd.fleet.local import detect_platform, local_fleet
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
    "detect_platform",
    "load_fleet",
    "local_fleet",
    "parse_fleet",
]
