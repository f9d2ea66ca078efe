"""Where ``rosterd up`` listens unless told (layer 8): constants only, so that the command's
``--help`` reads them without importing the runtime."""

from __future__ import annotations

#: The router's address: this machine only, unless ``--host`` says otherwise.
DEFAULT_HOST = "127.0.0.1"
#: The router's port.
DEFAULT_PORT = 8400
