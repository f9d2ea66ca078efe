"""Which dialect paths a role's backend serves, and the translated forward for the others
(DESIGN.md layer 7).

:func:`check_dialect` runs before the request takes a lease (so a request no backend of
the role can take never loads it); :func:`forward_in_dialect` is the proxy's forward for a
role whose backend lacks the path's dialect (``RoleRoute.native``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from starlette.types import Send

from rosterd.errors import RouterError
from rosterd.router.dialects.anthropic import MessagesTranslation
from rosterd.router.dialects.envelope import envelope_for
from rosterd.router.dialects.responses import ResponsesTranslation
from rosterd.router.dialects.translated import PostUpstream, Translation, forward_translated
from rosterd.router.routing import DIALECT_PATHS, RoleRoute

#: The dialect paths rosterd can serve through a backend's chat completions.
TRANSLATIONS: Mapping[str, Translation] = MappingProxyType(
    {"/v1/messages": MessagesTranslation(), "/v1/responses": ResponsesTranslation()}
)


def _who(route: RoleRoute) -> str:
    return f"role {route.role!r} (flavor {route.flavor or 'unknown'})"


def cannot_rerank(route: RoleRoute) -> str:
    """Why ``route``'s role cannot answer ``/v1/rerank``, and what to set: a role whose
    flavor can rerank (llama.cpp) is not served as a reranker (its fleet ``models:`` entry
    does not say ``reranking: true`` and its GGUF's pooling type is not rank); another
    flavor's backend has no rerank at all."""
    if "rerank" in route.flavor_dialects:  # llama-server, started with --reranking
        return (
            f"{_who(route)} cannot rerank: it is not served as a reranker; set reranking: "
            "true on its entry of the fleet file's models: section (its GGUF must be a "
            "reranker, such as bge-reranker or Qwen3-Reranker), then run rosterd reload"
        )
    return (
        f"{_who(route)} cannot rerank: its backend has no rerank endpoint; serve a reranker "
        "GGUF as a llama.cpp role, with reranking: true on its entry of the fleet file's "
        "models: section"
    )


def check_dialect(path: str, route: RoleRoute, payload: Mapping[str, Any]) -> None:
    """Raise the answer to a request on dialect ``path`` that ``route``'s backend cannot
    take: 400 ``not_supported`` for rerank on a backend without it (naming the role and
    what to set), 501 ``not_translatable`` for a path or field with no chat equivalent
    (naming the role and its flavor), 400 for a request the translation cannot read.
    Returns when the backend serves the dialect itself or the translation carries it."""
    dialect = DIALECT_PATHS[path]
    if dialect in route.native:
        return
    if dialect == "rerank":
        raise RouterError("not_supported", cannot_rerank(route))
    translation = TRANSLATIONS.get(path)
    if translation is None:
        raise RouterError(
            "not_translatable",
            f"{_who(route)} does not serve {path} and it has no chat completions equivalent "
            "rosterd could translate it to; send it to a llama.cpp role",
        )
    translation.chat_request(payload, _who(route))


async def forward_in_dialect(
    path: str,
    route: RoleRoute,
    payload: Mapping[str, Any],
    served_model: str,
    post: PostUpstream,
    send: Send,
    label: str,
) -> bytes:
    """Serve ``payload`` (on dialect ``path``) through the backend's chat completions:
    translated, rewritten to ``served_model``, posted with ``post``, answered on ``send``
    in the dialect (``forward_translated``); returns the chat answer's last bytes (its
    usage, as the backend reported it; empty when it answered none)."""
    translation = TRANSLATIONS[path]
    chat = route.rewrite(translation.chat_request(payload, _who(route)), served_model)
    return await forward_translated(
        translation,
        chat,
        role=route.role,
        label=label,
        post=post,
        send=send,
        envelope=envelope_for(path),
        ctx_size=route.ctx_size,
    )
