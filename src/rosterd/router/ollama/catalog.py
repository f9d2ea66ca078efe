"""Ollama's model catalog, from the roster (DESIGN.md layer 7): ``/api/version``,
``/api/tags``, ``/api/ps``, ``/api/show``, and a 501 for what rosterd does not do.

Ollama's model store is replaced by the roster: every role served here is a
model, named ``ROLE:latest`` (Ollama's tag convention; ``ROLE``, the roster's model
name and an alias name it too). ``/api/ps`` lists the roles resident now (the
scheduler's snapshot, for display). ``/api/pull``, ``/api/create``, ``/api/delete``,
``/api/copy``, ``/api/push`` and ``/api/blobs/*`` answer 501 ``not_implemented``:
the roster says which models there are. Errors come in Ollama's envelope,
``{"error": "..."}``. Starlette endpoints; the shapes follow Ollama's
``docs/api.md``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from rosterd.errors import ClientGoneError, RouterError
from rosterd.router.body import parse_json_object, read_body, requested_model
from rosterd.router.ollama.answers import error_line
from rosterd.router.ollama.requests import LATEST_TAG, resolve_ollama_name
from rosterd.router.routing import ModelNames, RoleRoute
from rosterd.scheduler.directory import NodeDirectory

#: The Ollama API version ``/api/version`` reports: the one whose reference this follows
#: (clients such as Open WebUI read it to pick the calls they make).
OLLAMA_API_VERSION: Final[str] = "0.12.0"

#: Ollama's model-store paths, which the roster replaces (path -> its HTTP method).
STORE_PATHS: Mapping[str, str] = {
    "/api/pull": "POST",
    "/api/push": "POST",
    "/api/create": "POST",
    "/api/copy": "POST",
    "/api/delete": "DELETE",
}
#: Ollama's blob uploads (``HEAD``/``POST /api/blobs/sha256:...``), part of ``create``.
BLOBS_PATH: Final[str] = "/api/blobs/{digest:path}"


def ollama_error(err: RouterError) -> Response:
    """``err`` in Ollama's envelope, ``{"error": message}``, with its status and headers."""
    return Response(
        error_line(err.message),
        status_code=err.status,
        headers=err.headers(),
        media_type="application/json",
    )


def not_in_roster(request: Request) -> RouterError:
    """501 ``not_implemented`` for a model-store call: models come from the roster."""
    return RouterError(
        "not_implemented",
        f"rosterd does not do {request.method} {request.url.path}: its models come from the "
        "roster (edit the roster and the fleet file, then run `rosterd reload`); "
        "GET /api/tags lists them",
    )


def ollama_name(role: str) -> str:
    """The name ``/api/tags`` gives ``role``: ``ROLE:latest``."""
    return role + LATEST_TAG


def _digest(role: str, route: RoleRoute) -> str:
    """A stable hex digest standing in for Ollama's manifest digest (clients key caches on
    it): sha256 of the role and the names that reach it."""
    return hashlib.sha256(json.dumps([role, sorted(route.names)]).encode()).hexdigest()


def _details(route: RoleRoute) -> dict[str, Any]:
    """Ollama's ``details``: what rosterd knows of the weights is not Ollama's model card,
    so the fields are empty rather than guessed."""
    return {
        "parent_model": "",
        "format": "",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _size(route: RoleRoute) -> int:
    size = route.info.get("resident_bytes")
    return size if isinstance(size, int) else 0


def catalog_routes(
    scheduler: NodeDirectory,
    routes: Mapping[str, RoleRoute],
    names: ModelNames,
    started_at_s: float,
) -> list[BaseRoute]:
    """The Starlette routes of the catalog: ``routes`` and ``names`` are the router's (a
    reload swaps them), ``started_at_s`` (Unix seconds) is every model's ``modified_at``."""
    modified_at = dt.datetime.fromtimestamp(started_at_s, tz=dt.UTC).isoformat()

    def model_entry(role: str) -> dict[str, Any]:
        route = routes[role] if role in routes else RoleRoute(role)
        name = ollama_name(role)
        return {
            "name": name,
            "model": name,
            "modified_at": modified_at,
            "size": _size(route),
            "digest": _digest(role, route),
            "details": _details(route),
        }

    async def version(_: Request) -> Response:
        return JSONResponse({"version": OLLAMA_API_VERSION})

    async def tags(_: Request) -> Response:
        listed = [model_entry(role) for role in scheduler.roles if names.visible(role)]
        return JSONResponse({"models": listed})

    async def ps(_: Request) -> Response:
        nodes = scheduler.snapshot().values()
        resident = sorted({role for entry in nodes for role in entry.node.resident})
        models = [
            # expires_at null: rosterd unloads by its residency policy, not by a timer.
            model_entry(role) | {"expires_at": None, "size_vram": 0}
            for role in resident
            if role in routes and names.visible(role)
        ]
        for entry in models:
            del entry["modified_at"]
        return JSONResponse({"models": models})

    async def show(request: Request) -> Response:
        try:
            body = await read_body(request.scope, request.receive, 1 << 20)
            payload = parse_json_object(body)
            if "model" not in payload and isinstance(payload.get("name"), str):
                payload["model"] = payload["name"]  # the older clients' field
            role = resolve_ollama_name(names, requested_model(payload))
        except ClientGoneError:
            return Response(status_code=499)
        except RouterError as err:
            return ollama_error(err)
        entry = model_entry(role)
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": entry["details"],
                "model_info": {},
                "capabilities": ["completion"],
                "modified_at": modified_at,
            }
        )

    async def store(request: Request) -> Response:
        return ollama_error(not_in_roster(request))

    out: list[BaseRoute] = [
        Route("/api/version", version, methods=["GET"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route(BLOBS_PATH, store, methods=["HEAD", "POST"]),
    ]
    out += [Route(path, store, methods=[method]) for path, method in STORE_PATHS.items()]
    return out
