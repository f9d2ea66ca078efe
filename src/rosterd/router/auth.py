"""The API-key gate in front of the router (DESIGN.md layer 7).

A plain ASGI middleware: keys come from ``--api-key`` and are compared with the
standard library's ``hmac.compare_digest`` (constant time, the DESIGN.md rule). A key is
read from ``Authorization: Bearer`` (OpenAI's clients) or ``x-api-key`` (Anthropic's), and
a refusal comes in the error shape of the path's clients.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from rosterd.errors import RouterError
from rosterd.router.dialects.envelope import envelope_for

#: The one path open without a key, so a load balancer or ``rosterd up`` can probe liveness.
OPEN_PATH = "/health"


def bearer_token(scope: Scope) -> bytes:
    """The token of the request's ``Authorization: Bearer <token>`` header, else of its
    ``x-api-key`` header (Anthropic's SDKs and Claude Code send that); ``b""`` if none."""
    given = b""
    api_key = b""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                given = token.strip()
        elif name == b"x-api-key":
            api_key = value.strip()
    return given or api_key


def key_matches(given: bytes, keys: Sequence[bytes]) -> bool:
    """Whether ``given`` is one of ``keys``, compared against every key with no early exit so
    the timing reveals neither a key nor which one matched."""
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key)
    return ok


class ApiKeyGate:
    """ASGI middleware: every path but ``/health`` needs ``Authorization: Bearer <key>``
    (or ``x-api-key: <key>``).

    ``keys`` empty: no gate. A request without a valid key gets 401
    ``invalid_api_key`` with ``WWW-Authenticate: Bearer``. ``open_paths`` and
    ``open_prefixes`` name more paths that need no key: files that hold no data
    (the web page's HTML, CSS and script, which then ask for the key).
    ``dialect_errors``: path prefix -> how a 401 is sent there (another API's envelope,
    such as Ollama's under ``/api/``); elsewhere it is OpenAI's.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Sequence[str],
        *,
        open_paths: Iterable[str] = (),
        open_prefixes: Iterable[str] = (),
        dialect_errors: Mapping[str, Callable[[Send, RouterError], Awaitable[None]]] | None = None,
    ) -> None:
        self.app = app
        self.dialect_errors = dict(dialect_errors or {})
        self.keys = [k.encode() for k in keys]
        self.open_paths = frozenset((OPEN_PATH, *open_paths))
        self.open_prefixes = tuple(open_prefixes)

    def _open(self, path: str) -> bool:
        return path in self.open_paths or (
            any(path.startswith(prefix) for prefix in self.open_prefixes) and ".." not in path
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or self._open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        if not key_matches(given, self.keys):
            message = (
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                if not given
                else "invalid API key"
            )
            err = RouterError("invalid_api_key", message)
            path = scope.get("path", "")
            for prefix, send_dialect_error in self.dialect_errors.items():
                if path.startswith(prefix):
                    await send_dialect_error(send, err)
                    return
            await envelope_for(path).response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)
