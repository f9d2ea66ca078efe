"""The router (DESIGN.md layer 7): one OpenAI-compatible HTTP endpoint in front of every role.

Starlette for routing the plain endpoints, uvicorn to serve it (``rosterd up``),
and towards the backends a small keep-alive HTTP/1.1 client on httptools
(``upstream`` says why not httpx or aiohttp: measured, they cost the router
most of its time). A ``POST`` to a proxied path goes straight to its proxy,
past Starlette's router. Modules:

- ``app``: :func:`create_app`, the wiring of every route;
- ``endpoints``: the plain endpoints (``/status``, ``/v1/models``, the admin paths)
  and the lifespan;
- ``routing``: :class:`RoleRoute`, :class:`RouterConfig`, the ``model`` names;
- ``proxy``: one request top to bottom: lease, forwarding, the answer by its kind;
- ``client_side``: what is sent to the client, the cut when it leaves or the lease is
  revoked, a body passed through chunk by chunk;
- ``retries``: every retry of a request in one table, in the order they nest;
- ``deadlines``: a request's deadlines (first byte, between chunks);
- ``progress``: a quiet request asks its backend how far it has come;
- ``wait_report``: the ``X-Rosterd-*`` headers of what a request waited for;
- ``restore_check``: the first answer after a KV restore, judged;
- ``upstream``: the client towards backends (pool, timeouts, typed errors);
- ``openai_errors``: the error table, the OpenAI error body, the SSE error
  event, ``Retry-After``, and the mapping of scheduler and upstream errors;
- ``auth``: the API-key gate; ``body``: the request body (size limit, strict JSON);
- ``ollama``: Ollama's API (``/api/*``), a package of its own;
- ``ui``: the live web page and its event stream; ``logs``: a role's backend
  log, tailed or followed; ``streams``: the signal that ends endless responses
  when serving stops.

Endpoints:

- ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``: routed by
  the body's ``model`` (a role id, the roster's model name, or an alias), which
  is rewritten to what the backend answers to; ``"stream": true`` answers are
  passed through chunk by chunk (``X-Accel-Buffering: no``).
- ``/api/*``: Ollama's API (``ollama``: the catalog from the roster, chat, generate
  and embed translated to the OpenAI routes or passed through to an ``ollama`` role's
  server, a 501 for the model store), with errors in Ollama's envelope.
- ``GET /v1/models``: every role served here (``id`` = role, ``aliases`` = other
  names that route to it); ``GET /v1/models/{model}``: one of them, by any
  name (OpenAI's retrieve).
- ``GET /health``, ``GET /status`` (JSON: nodes, resident roles, memory, queue),
  ``GET /metrics`` (Prometheus).
- ``GET /rosterd/ps``, ``GET /rosterd/events``, ``POST /rosterd/load/{role}``,
  ``POST /rosterd/unload/{role}``: what ``rosterd ps/load/unload`` talk to (a load
  answers ``evicted``: the roles stopped to serve it, and ``evictions`` with why);
  ``{role}`` must be a plain token of at most 64 bytes (else 400 ``invalid_role``).
- ``GET /rosterd/logs/{role}`` (``?lines=N``, ``?follow=1``): the role's backend log.
- ``GET /`` and ``/ui`` (the page, its files under ``/ui/static/``; no key needed:
  they hold no data), ``GET /rosterd/events/stream`` (server-sent events:
  scheduler events and ``/status`` snapshots).

Every error is OpenAI-shaped: ``{"error": {"message", "type", "code"}}``, with
400 for a body that is not strict JSON (``NaN`` and ``Infinity`` included),
404 for an unknown model (naming the known ones, and why a known role is not
served here), 413 for a body over the
limit, 401 for a missing or wrong API key, 429 (queue full) and 503 (queue
timeout, shutting down) with ``Retry-After``, 502 when the backend fails, 400
``not_supported`` when it answers 501 (it does not serve the endpoint) or refuses
what its role's configuration rules out (tools without ``--jinja``), naming the fix. A
stream cut after it started (the backend stopped or failed, or the drain time
at shutdown ran out) ends with an SSE error event, ``data: {"error": {...}}``.
"""

from __future__ import annotations

from rosterd.error_table import ERROR_KINDS, ErrorKind, error_body
from rosterd.errors import RouterError
from rosterd.router.app import create_app
from rosterd.router.routing import (
    PROXIED_PATHS,
    RewriteRequest,
    RoleRoute,
    RouterConfig,
    RouteTable,
)

__all__ = [
    "ERROR_KINDS",
    "PROXIED_PATHS",
    "ErrorKind",
    "RewriteRequest",
    "RoleRoute",
    "RouteTable",
    "RouterConfig",
    "RouterError",
    "create_app",
    "error_body",
]
