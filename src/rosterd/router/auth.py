"""The key gate in front of the router (DESIGN.md layer 7): who may call which path.

A plain ASGI middleware. A key is read from ``Authorization: Bearer`` (OpenAI's clients,
Ollama's with a header) or ``x-api-key`` (Anthropic's) and found in the
:class:`~rosterd.keys.KeyRing` in force (:class:`Keys`, which a reload swaps); it is
hashed once and compared in constant time (:mod:`rosterd.keys.values`). Each path needs
one scope (:func:`scope_for`):

- ``use``: the inference paths of every dialect, ``/v1/models`` and Ollama's ``/api/*``;
- ``watch``: ``/status``, ``/metrics`` and every ``/rosterd/*`` path that only reads
  (ps, events and the page's stream, history, logs, usage);
- ``operate``: ``/rosterd/load/*``, ``/rosterd/unload/*``, ``/rosterd/reload``;
- any valid key: the rest (``/openapi.json``, and an unknown path, which is then a 404);
- none: ``/health``, and the page's files, which hold no data (what they show comes from
  the paths above, with the key the page was given).

No key or a wrong one is 401 ``invalid_api_key``, a key without the path's scope 403
``permission_denied``, each in the envelope the path's clients read (OpenAI's, Anthropic's
on ``/v1/messages``, Ollama's under ``/api/``). The key of the request is then set for
its task (:data:`rosterd.router.caller.CALLER`), so that what it resolves and lists is only
what it may use; an operator action (load, unload, reload) is logged with the key's name.
A ``use`` request of a key with limits is counted against them first
(:mod:`rosterd.router.key_limits`; over one: 429 ``key_limit`` in the same envelopes).
A key never reaches a log or a message: only its name does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rosterd.errors import RouterError
from rosterd.keys.values import ApiKey, KeyRing
from rosterd.keys.values import Scope as KeyScope
from rosterd.router.caller import CALLER
from rosterd.router.dialects.envelope import envelope_for
from rosterd.router.key_limits import KeyLimiter
from rosterd.router.routing import PROXIED_PATHS

#: The ASGI scope key under which the gate leaves the name of the request's key, for the
#: access log outside it (:mod:`rosterd.router.access_log`).
KEY_NAME_SCOPE: Final = "rosterd.key_name"

log = logging.getLogger("rosterd.access")

#: The one path open without a key, so a load balancer or ``rosterd up`` can probe liveness.
OPEN_PATH = "/health"
#: The paths of an operator's actions (``operate``), by prefix.
OPERATE_PREFIXES = ("/rosterd/load/", "/rosterd/unload/", "/rosterd/reload")
#: The paths that only read the lab's state (``watch``), exactly or by prefix.
WATCH_PATHS = frozenset({"/status", "/metrics"})
WATCH_PREFIX = "/rosterd/"
#: The paths of the inference dialects besides :data:`PROXIED_PATHS` (``use``).
USE_PREFIXES = ("/v1/models", "/api/")

DialectErrors = Mapping[str, Callable[[Send, RouterError], Awaitable[None]]]


def scope_for(path: str) -> KeyScope | None:
    """The scope ``path`` needs; ``None``: any valid key (see the module docstring)."""
    if path in PROXIED_PATHS or path.startswith(USE_PREFIXES):
        return KeyScope.USE
    if path.startswith(OPERATE_PREFIXES):
        return KeyScope.OPERATE
    if path in WATCH_PATHS or path.startswith(WATCH_PREFIX):
        return KeyScope.WATCH
    return None


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


class Keys:
    """The keys in force: :attr:`ring`, swapped whole by :meth:`replace` (a reload)."""

    def __init__(self, ring: KeyRing | None = None) -> None:
        self.ring = ring or KeyRing()

    def replace(self, ring: KeyRing) -> None:
        """Accept ``ring``'s keys from the next request on (one in flight keeps its key)."""
        self.ring = ring


class KeyGate:
    """ASGI middleware: each path needs a key with its scope (:func:`scope_for`), unless
    the ring in force is empty (no keys at all: the router is open, as before keys).

    ``open_paths`` and ``open_prefixes`` name paths that need no key besides ``/health``
    (the page's files). ``dialect_errors``: path prefix -> how a refusal is sent there
    (Ollama's envelope under ``/api/``); elsewhere :func:`envelope_for` the path.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: Keys,
        *,
        open_paths: Iterable[str] = (),
        open_prefixes: Iterable[str] = (),
        dialect_errors: DialectErrors | None = None,
        limiter: KeyLimiter | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.limiter = limiter or KeyLimiter()
        self.dialect_errors = dict(dialect_errors or {})
        self.open_paths = frozenset((OPEN_PATH, *open_paths))
        self.open_prefixes = tuple(open_prefixes)

    def _open(self, path: str) -> bool:
        return path in self.open_paths or (
            any(path.startswith(prefix) for prefix in self.open_prefixes) and ".." not in path
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ring = self.keys.ring
        path = scope.get("path", "")
        if scope["type"] != "http" or not ring.required or self._open(path):
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        key = ring.find(given)
        if key is None:
            message = (
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                if not given
                else "invalid API key"
            )
            await self.refuse(scope, receive, send, RouterError("invalid_api_key", message))
            return
        scope[KEY_NAME_SCOPE] = key.name  # the access log's ``key`` (never the key itself)
        needed = scope_for(path)
        if needed is not None and needed not in key.scopes:
            held = ", ".join(sorted(s.value for s in key.scopes))
            message = (
                f"key {key.name!r} may not {_DOING[needed]} ({path} needs the "
                f"{needed.value!r} scope; the key holds {held}); ask for a key with it"
            )
            await self.refuse(scope, receive, send, RouterError("permission_denied", message))
            return
        limited = needed is KeyScope.USE and key.limits.any()
        if limited:
            try:
                self.limiter.admit(key)
            except RouterError as err:
                await self.refuse(scope, receive, send, err)
                return
        token = CALLER.set(key)
        try:
            if needed is KeyScope.OPERATE:
                await self.operate(key, scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            CALLER.reset(token)
            if limited:
                self.limiter.release(key)

    async def operate(self, key: ApiKey, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an operator's action, logged with the key's name and the answer's status."""
        status = 0

        async def send_seen(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_seen)
        finally:
            query = scope.get("query_string", b"").decode("latin-1")
            what = scope.get("path", "") + (f"?{query}" if query else "")
            log.info("operator action %s %s by key %r: %s", scope["method"], what, key.name, status)

    async def refuse(self, scope: Scope, receive: Receive, send: Send, err: RouterError) -> None:
        """Answer ``err`` in the envelope of the request's path."""
        path = scope.get("path", "")
        for prefix, send_dialect_error in self.dialect_errors.items():
            if path.startswith(prefix):
                await send_dialect_error(send, err)
                return
        await envelope_for(path).response(err)(scope, receive, send)


_DOING = {
    KeyScope.USE: "use models",
    KeyScope.WATCH: "watch the lab",
    KeyScope.OPERATE: "operate the lab (load, unload, reload)",
}
