"""What the page's browser tests share: Chromium's flags and waiting for the page.

Headless, no sandbox (root in a container), nothing fetched from the network, no GPU, a
window the size of an operator's screen.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
    "--lang=en-GB",
]


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Return once ``check()`` gives something true (an exception counts as not yet: the
    page may be between two renders); raises ``AssertionError`` naming ``what`` and the
    last result after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:
            last = err
        if last and not isinstance(last, Exception):
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
