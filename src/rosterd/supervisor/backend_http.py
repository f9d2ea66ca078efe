"""The HTTP client towards backends (DESIGN.md layer 5): every httpx client that talks to a
backend comes from :func:`backend_client`, so the settings that must hold for all of them
are made in one place.

- **No proxy from the environment** (``trust_env=False``): backends listen on the lab's
  nodes (127.0.0.1 for this machine's), and an ``HTTP_PROXY``, ``http_proxy`` or
  ``ALL_PROXY`` meant for the internet must not carry a probe, a model load or a KV slot
  save to a proxy that cannot reach them (the KV keeper's clients once read it and sent
  slot saves to 127.0.0.1 through the proxy).
- **One TLS context for the process**: building httpx's default context took ~85 ms per
  client, paid on every backend start and probe.
- **One default timeout** (``DEFAULT_TIMEOUT_S``, httpx's own default); a call that may
  take longer (a model load, a slot save) passes its own ``timeout`` per request.

The router's request path does not use httpx (``rosterd.router.upstream`` says why); its
client reads no environment either.
"""

from __future__ import annotations

import functools
import ssl
from typing import Final

import httpx

#: Connect, read, write and pool timeout of a backend client unless a call says otherwise
#: (seconds); httpx's default, which every backend client used before this factory.
DEFAULT_TIMEOUT_S: Final[float] = 5.0


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def backend_client(
    *, base_url: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
) -> httpx.AsyncClient:
    """A new httpx client for talking to backends (the caller closes it, ``async with``).

    ``base_url`` (``http://host:port``) prefixes relative request paths; ``timeout_s``
    (seconds) bounds each phase of a request unless the request passes its own. The
    client reads no proxy or certificate settings from the environment and shares the
    process's one TLS context (see the module docstring).
    """
    return httpx.AsyncClient(
        base_url=base_url, verify=_tls_context(), trust_env=False, timeout=timeout_s
    )
