"""Where ``rosterd up``'s access log goes (DESIGN.md layer 8): up's output and a file.

The router logs one record per request on the ``rosterd.access`` logger
(:mod:`rosterd.router.access_log`); here, at the CLI edge, that logger gets its two
handlers: up's standard error, beside rosterd's other log lines, and
``<state-dir>/logs/access.log``, rotated by the standard library's
``RotatingFileHandler`` at :data:`ROTATE_BYTES` with :data:`KEPT_FILES` old files.
Its records do not also reach rosterd's general log format (``propagate`` off).
"""

from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TextIO

from rosterd.router.access_log import AccessFormatter

#: The size at which access.log is rotated (access.log -> access.log.1 -> ...), bytes.
ROTATE_BYTES = 64 * 2**20
#: How many rotated files are kept.
KEPT_FILES = 5
#: The forms of ``--access-log-format``.
ACCESS_LOG_FORMATS = ("plain", "json")


def install_access_log(form: str, path: Path, stream: TextIO) -> None:
    """Log every request in ``form`` (``plain`` or ``json``) on ``stream`` and in ``path``
    (its folder made if needed). Raises ``ValueError`` for another form, ``OSError`` when
    the file cannot be opened."""
    formatter = AccessFormatter(form)
    path.parent.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [
        logging.StreamHandler(stream),
        RotatingFileHandler(path, maxBytes=ROTATE_BYTES, backupCount=KEPT_FILES, encoding="utf-8"),
    ]
    logger = logging.getLogger("rosterd.access")
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
