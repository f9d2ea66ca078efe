"""The router (DESIGN.md layer 7): one HTTP port in front of every role, in every dialect.

OpenAI's chat, completions, embeddings and Responses, Anthropic Messages, Ollama's
``/api/*`` and rerank, each routed by the request's ``model`` (a role id, the roster's
model name, or an alias) to the role's backend, loaded on demand; beside them the
operator's endpoints (``/status``, ``/metrics``, ``/rosterd/*``) and the live page.
Every route is listed, from ``GET /openapi.json`` (:mod:`rosterd.router.openapi`), on
the guide's generated HTTP reference page; what each error answer means is
:mod:`rosterd.error_table`'s one table.

Starlette for routing the plain endpoints, uvicorn to serve it (``rosterd up``),
and towards the backends a small keep-alive HTTP/1.1 client on httptools
(``upstream`` says why not httpx or aiohttp: measured, they cost the router
most of its time). A ``POST`` to a proxied path goes straight to its proxy,
past Starlette's router. Modules:

- ``app``: :func:`create_app`, the wiring of every route;
- ``endpoints``: the plain endpoints (``/status``, ``/v1/models``, the admin paths)
  and the lifespan;
- ``openapi``: the OpenAPI document of rosterd's own endpoints;
- ``routing``: :class:`RoleRoute`, :class:`RouterConfig`, the ``model`` names;
- ``body``: the request body (size limit, strict JSON, the ``model`` field);
- ``proxy``: one request top to bottom: lease, forwarding, the answer by its kind;
- ``backend_requests``: what the proxy sends a backend: the request (once more on a fresh
  connection when a pooled one was closed) and a prompt's count;
- ``client_side``: what is sent to the client, the cut when it leaves or the lease is
  revoked, a body passed through chunk by chunk;
- ``model_echo``: the answer's ``model`` is the name the client asked for;
- ``stream_repair``: a backend's Messages or Responses stream given the opening events
  and indexes its SDKs read, where llama-server leaves them out;
- ``request_counts``: a finished request counted once (metrics, history, usage);
- ``retries``: every retry of a request in one table, in the order they nest;
- ``deadlines``: a request's deadlines (first byte, between chunks);
- ``speeds``: each role's measured prefill and generation speed, for the first-byte
  deadline;
- ``progress``: a quiet request asks its backend how far it has come;
- ``load_progress``: what a streamed request hears while its role loads (SSE comments,
  ``ping`` events, reasoning text) and the page's progress bars;
- ``status_view``: the nodes of ``/status`` and ``/rosterd/ps`` as JSON, built in one
  place from the layers' read-only snapshots;
- ``validation``: a request checked before it reaches a backend, as each dialect's own
  API refuses it (400 in the path's envelope);
- ``wait_report``: the ``X-Rosterd-*`` headers of what a request waited for;
- ``restore_check``: the first answer after a KV restore, judged;
- ``upstream``: the client towards backends (pool, timeouts, typed errors);
- ``openai_errors``: the OpenAI error body, the SSE error event, ``Retry-After``, and
  the mapping of scheduler and upstream errors;
- ``config_faults``: a backend's refusal caused by its role's configuration, and the
  fix to name (tools without ``--jinja``);
- ``auth``: the API-key gate;
- ``caller``: who is asking: the request's key and the roles it may see;
- ``key_limits``: each key's limits (in flight, per minute, tokens per day);
- ``key_turns``: whose request of a role goes first, by the key's priority;
- ``usage_hook``: each finished request counted for its key and role;
- ``access_log``: one line per request, who asked what and how it ended;
- ``dialects``: Anthropic Messages and OpenAI Responses, a package of its own;
- ``ollama``: Ollama's API (``/api/*``), a package of its own;
- ``ui``: the live web page and its event stream;
- ``history``: the page's charts' bounded history (``GET /rosterd/history``);
- ``logs``: a role's backend log, tailed or followed;
- ``streams``: the signal that ends endless responses when serving stops.
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
