"""rosterd's OpenAPI 3.1 document (DESIGN.md layer 7): its own endpoints as it serves them,
at ``GET /openapi.json``.

The document is built from the router's own tables, so it cannot drift from
them: the proxied paths from ``PROXIED_PATHS``, the page's from ``ui``, and every
error code from ``ERROR_KINDS`` (an error answer is always the OpenAI envelope of
:func:`~rosterd.error_table.error_body`). It describes what rosterd
checks itself (a JSON object with a ``model`` string); the rest of an OpenAI
request is the backend's to judge. A plain dict, not a framework's generator:
Starlette has none worth the dependency for a dozen routes.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rosterd.error_table import ERROR_KINDS
from rosterd.router.dialects.envelope import ANTHROPIC_PATHS
from rosterd.router.logs import DEFAULT_LINES, MAX_LINES
from rosterd.router.ollama.catalog import BLOBS_PATH, STORE_PATHS
from rosterd.router.ollama.generation import OLLAMA_PATHS
from rosterd.router.routing import DIALECT_PATHS, PROXIED_PATHS
from rosterd.router.ui import PAGE_PATHS, STATIC_PREFIX

_JSON = "application/json"
_ERROR_REF: dict[str, Any] = {"$ref": "#/components/schemas/Error"}


def _statuses(codes: set[str]) -> list[int]:
    return sorted({ERROR_KINDS[c].status for c in codes})


def _errors(*codes: str, anthropic: bool = False) -> dict[str, Any]:
    """The error responses of an operation: one per status of ``codes`` (plus 401, which
    every path but ``/health`` may answer when API keys are set); ``anthropic``: in
    Anthropic's envelope (``/v1/messages``), else OpenAI's."""
    statuses = _statuses({*codes, "invalid_api_key", "permission_denied", "method_not_allowed"})
    shape = "an Anthropic-shaped" if anthropic else "an OpenAI-shaped"
    ref = {"$ref": "#/components/schemas/AnthropicError"} if anthropic else _ERROR_REF
    return {
        str(status): {"description": f"{shape} error", "content": {_JSON: {"schema": ref}}}
        for status in statuses
    }


def _ok(schema: dict[str, Any], media: str = _JSON) -> dict[str, Any]:
    return {"200": {"description": "OK", "content": {media: {"schema": schema}}}}


def _get(
    summary: str, schema: dict[str, Any], *codes: str, media: str = _JSON, **extra: Any
) -> dict[str, Any]:
    responses = {**_ok(schema, media), **_errors(*codes)}
    return {"get": {"summary": summary, "responses": responses, **extra}}


_ROLE_PARAM: dict[str, Any] = {
    "name": "role",
    "in": "path",
    "required": True,
    "description": "a role id, alias id or model name (a plain token of at most 64 bytes)",
    "schema": {"type": "string"},
}
_OBJECT: dict[str, Any] = {"type": "object"}
#: ``POST /rosterd/load/{role}``'s answer; ``evicted``: the roles the node stopped to serve
#: it, and ``evictions`` the same with why (``make_room`` or ``exclusion``).
_LOAD: dict[str, Any] = {
    "type": "object",
    "required": ["role", "node", "base_url", "ready", "evicted"],
    "properties": {
        "role": {"type": "string"},
        "node": {"type": "string"},
        "base_url": {"type": "string"},
        "ready": {"type": "boolean"},
        "evicted": {"type": "array", "items": {"type": "string"}},
        "evictions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "cause"],
                "properties": {
                    "role": {"type": "string"},
                    "cause": {"type": "string", "enum": ["make_room", "exclusion"]},
                },
            },
        },
    },
}
_LOG_PARAMS: list[dict[str, Any]] = [
    {
        "name": "lines",
        "in": "query",
        "description": f"lines of the end to send (default {DEFAULT_LINES})",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_LINES},
    },
    {
        "name": "follow",
        "in": "query",
        "description": "1: keep sending what the backend writes next (never ends)",
        "schema": {"enum": [0, 1]},
    },
    {
        "name": "node",
        "in": "query",
        "description": "the log of the role's copy on this node (a role with copies on "
        "several nodes of this machine; without it, a tail shows each copy's)",
        "schema": {"type": "string"},
    },
]
_STATIC_PARAM: dict[str, Any] = {
    "name": "path",
    "in": "path",
    "required": True,
    "description": "a file of the page",
    "schema": {"type": "string"},
}
_ADMIN_CODES = (
    "invalid_role",
    "model_not_found",
    "model_unplaced",
    "backend_load_failed",
    "queue_full",
    "queue_timeout",
    "shutting_down",
    "role_refused",
    "model_unavailable",
)
_PROXY_CODES = (
    "bad_request",
    "invalid_json",
    "model_missing",
    "model_not_found",
    "body_too_large",
    "not_supported",
    "backend_error",
    *_ADMIN_CODES[2:],
    "evicted",
    "node_lost",
    "unavailable",
)


_OLLAMA_ERROR_REF: dict[str, Any] = {"$ref": "#/components/schemas/OllamaError"}


def _ollama_errors(*codes: str) -> dict[str, Any]:
    """The error responses of an Ollama path: Ollama's envelope, ``{"error": "..."}``."""
    statuses = _statuses({*codes, "invalid_api_key", "permission_denied", "method_not_allowed"})
    return {
        str(status): {
            "description": "an Ollama-shaped error",
            "content": {_JSON: {"schema": _OLLAMA_ERROR_REF}},
        }
        for status in statuses
    }


def _ollama_paths() -> dict[str, Any]:
    """Ollama's API as rosterd serves it (``rosterd.router.ollama``)."""
    model_body = {
        "required": True,
        "content": {
            _JSON: {
                "schema": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {"model": {"type": "string", "minLength": 1}},
                }
            }
        },
    }
    paths: dict[str, Any] = {
        "/api/version": {
            "get": {
                "summary": "the Ollama API version followed",
                "responses": {**_ok(_OBJECT), **_ollama_errors()},
            }
        },
        "/api/tags": {
            "get": {
                "summary": "the roles served, as Ollama's models (ROLE:latest)",
                "responses": {**_ok(_OBJECT), **_ollama_errors()},
            }
        },
        "/api/ps": {
            "get": {
                "summary": "the roles resident now",
                "responses": {**_ok(_OBJECT), **_ollama_errors()},
            }
        },
        "/api/show": {
            "post": {
                "summary": "one role by any of its names, with or without :latest",
                "requestBody": model_body,
                "responses": {
                    **_ok(_OBJECT),
                    **_ollama_errors(
                        "bad_request",
                        "invalid_json",
                        "model_missing",
                        "model_not_found",
                        "model_unplaced",
                        "body_too_large",
                    ),
                },
            }
        },
    }
    for path, kind in OLLAMA_PATHS.items():
        paths[path] = {
            "post": {
                "summary": f"Ollama {kind}, queued and loaded on demand like the OpenAI paths",
                "requestBody": model_body,
                "responses": {
                    "200": {
                        "description": "Ollama's answer (NDJSON lines when streamed)",
                        "content": {_JSON: {"schema": _OBJECT}, "application/x-ndjson": {}},
                    },
                    **_ollama_errors(*_PROXY_CODES, "backend_timeout", "load_backoff"),
                },
            }
        }
    store = {
        "summary": "not done: models come from the roster (501)",
        "responses": _ollama_errors("not_implemented"),
    }
    for path, method in STORE_PATHS.items():
        paths[path] = {method.lower(): store}
    paths[BLOBS_PATH.replace(":path", "")] = {
        "post": {**store, "parameters": [{**_STATIC_PARAM, "name": "digest"}]}
    }
    return paths


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of rosterd's HTTP API (a JSON-ready dict)."""
    error_schema = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code", "param"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "code": {"enum": sorted(ERROR_KINDS)},
                    "param": {"type": "null"},
                },
            }
        },
    }
    request_schema = {
        "type": "object",
        "required": ["model"],
        "properties": {"model": {"type": "string", "minLength": 1}, "stream": {"type": "boolean"}},
    }
    paths: dict[str, Any] = {
        "/health": _get("liveness (never needs an API key)", _OBJECT),
        "/status": _get("scheduler view, plan and uptime", _OBJECT),
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {**_ok({"type": "string"}, "text/plain"), **_errors()},
            }
        },
        "/openapi.json": _get("this document", _OBJECT),
        "/v1/models": _get("the roles served", _OBJECT),
        "/v1/models/{model}": _get(
            "one role by id, model name or alias",
            _OBJECT,
            "model_not_found",
            "model_unplaced",
            parameters=[{**_ROLE_PARAM, "name": "model", "description": "role, name or alias"}],
        ),
        "/rosterd/ps": _get("what is resident, per node", _OBJECT),
        "/rosterd/events": _get("the scheduler's recent events", _OBJECT),
        "/rosterd/history": _get(
            "the page's charts: the last 360 points of memory and traffic per node and role",
            _OBJECT,
        ),
        "/rosterd/usage": _get(
            "usage per key and role (requests, tokens, errors, queue and serve time)",
            _OBJECT,
            "bad_request",
            "not_found",
            parameters=[
                {"name": "since", "in": "query", "schema": {"type": "string", "default": "7d"}},
                {"name": "by", "in": "query", "schema": {"type": "string", "default": "key,role"}},
            ],
        ),
        "/rosterd/events/stream": {
            "get": {
                "summary": "the scheduler's events live, with /status snapshots (never ends)",
                "responses": {**_ok({"type": "string"}, "text/event-stream"), **_errors()},
            }
        },
        "/rosterd/logs/{role}": {
            "get": {
                "summary": "the end of a role's backend log; with follow=1, what it writes next",
                "parameters": [_ROLE_PARAM, *_LOG_PARAMS],
                "responses": {
                    **_ok({"type": "string"}, "text/plain"),
                    **_errors("bad_request", "invalid_role", "model_not_found", "not_found"),
                },
            }
        },
        "/rosterd/reload": {
            "post": {
                "summary": "re-read the roster, overlay and fleet; apply them if valid "
                "(404 when this process cannot reload)",
                "parameters": [
                    {
                        "name": "force",
                        "in": "query",
                        "required": False,
                        "description": "apply a configuration that serves no role too",
                        "schema": {"type": "string", "enum": ["true", "false", "1", "0"]},
                    }
                ],
                "responses": {**_ok(_OBJECT), **_errors("invalid_config", "not_found")},
            }
        },
        # The live page and its files: no API key needed, they hold no data.
        **{
            path: _get("the live page", {"type": "string"}, media="text/html")
            for path in PAGE_PATHS
        },
        STATIC_PREFIX + "{path}": _get(
            "the page's files (CSS, script)",
            {"type": "string"},
            "not_found",
            media="*/*",
            parameters=[_STATIC_PARAM],
        ),
    }
    for action, summary in (("load", "load a role and wait"), ("unload", "unload a role")):
        paths[f"/rosterd/{action}/{{role}}"] = {
            "post": {
                "summary": summary,
                "parameters": [_ROLE_PARAM],
                "responses": {
                    **_ok(_LOAD if action == "load" else _OBJECT),
                    **_errors(*_ADMIN_CODES),
                },
            }
        }
    for path, label in PROXIED_PATHS.items():
        # A dialect path a role's backend may lack: 501 where chat has no equivalent.
        codes = (*_PROXY_CODES, "not_translatable") if path in DIALECT_PATHS else _PROXY_CODES
        paths[path] = {
            "post": {
                "summary": f"{label}, forwarded to the role its model names",
                "requestBody": {"required": True, "content": {_JSON: {"schema": request_schema}}},
                "responses": {
                    "200": {
                        "description": "the backend's answer (an event stream when streamed)",
                        "content": {_JSON: {"schema": _OBJECT}, "text/event-stream": {}},
                    },
                    **_errors(*codes, anthropic=path in ANTHROPIC_PATHS),
                },
            }
        }
    paths.update(_ollama_paths())
    anthropic_error_schema = {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    }
    ollama_error_schema = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "rosterd", "version": "1", "description": "rosterd's HTTP API"},
        "paths": paths,
        "components": {
            "schemas": {
                "Error": error_schema,
                "OllamaError": ollama_error_schema,
                "AnthropicError": anthropic_error_schema,
            },
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_endpoint(_: Request) -> Response:
    """``GET /openapi.json``."""
    return JSONResponse(openapi_document())
