"""API keys as values (DESIGN.md layer 2, no I/O): a key's scopes, models, priority and
limits, the hash it is stored as, and the ring of keys a router accepts.

A key is a random token of 256 bits (:func:`new_token`), shown once and stored only as
``sha256:<hex>`` of its text (:func:`key_digest`). SHA-256, not a password hash (bcrypt,
argon2): those are slow on purpose to resist guessing a low-entropy password, but a
256-bit random token cannot be guessed at any speed, and a slow hash would add
milliseconds to every request where the router's whole overhead is a fraction of one.
A request's token is hashed once and looked up by its digest; the stored digest is then
compared with ``hmac.compare_digest`` (constant time). A dict lookup by digest leaks at
most how a digest's bytes collide in a hash table, which says nothing about a key: only
the token's SHA-256 preimage would, and that is the hard problem.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from rosterd.spec import LatencyClass

#: The prefix of a key made by ``rosterd keys add`` (secret scanners can spot it).
TOKEN_PREFIX: Final[str] = "rk-"  # noqa: S105 (a prefix, not a secret)
#: The prefix of a stored digest: the hash's name, so another may follow one day.
DIGEST_PREFIX: Final[str] = "sha256:"
#: What every ``--api-key`` key is named in logs and metrics (``--api-key#2`` and on for
#: the others); not a plain token, so no key of a keys file can have it.
MASTER_NAME: Final[str] = "--api-key"


class Scope(enum.Enum):
    """What a key may do: ``use`` the inference paths of every dialect, ``watch`` the
    lab (the page's data, ``/status``, history, metrics, logs, events, usage), ``operate``
    it (load, unload, reload)."""

    USE = "use"
    WATCH = "watch"
    OPERATE = "operate"


ALL_SCOPES: Final[frozenset[Scope]] = frozenset(Scope)


def new_token() -> str:
    """A new random key: :data:`TOKEN_PREFIX` and 32 random bytes in URL-safe base64
    (``secrets.token_urlsafe``), 46 characters."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def key_digest(token: str | bytes) -> str:
    """How ``token`` is stored: ``sha256:`` and the 64 hex digits of its SHA-256."""
    raw = token.encode() if isinstance(token, str) else token
    return DIGEST_PREFIX + hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's limits (``None``: none): ``in_flight`` requests at once,
    ``requests_per_minute`` (a sliding minute) and ``tokens_per_day`` (prompt and
    completion tokens as the backends reported them, per UTC day)."""

    in_flight: int | None = None
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None

    def any(self) -> bool:
        """Whether any limit is set."""
        return (
            self.in_flight is not None
            or self.requests_per_minute is not None
            or self.tokens_per_day is not None
        )


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key: its ``name`` (plain token; what logs, metrics and usage show), its
    ``digest`` (:func:`key_digest`), its ``scopes``, the ``models`` a ``use`` key may
    reach (role ids, model names or aliases, or ``fnmatch`` patterns of them; ``("*",)``:
    all), its ``priority`` (the latency class its requests queue in; ``None``: the
    role's own) and its ``limits``."""

    name: str
    digest: str
    scopes: frozenset[Scope] = frozenset({Scope.USE})
    models: tuple[str, ...] = ("*",)
    priority: LatencyClass | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)

    @property
    def all_models(self) -> bool:
        """Whether the key may use every role."""
        return "*" in self.models

    def may_use(self, names: Iterable[str]) -> bool:
        """Whether one of ``names`` (a role's id, model name and aliases) matches one of
        the key's ``models`` (exact, or an ``fnmatch`` pattern, case-sensitive)."""
        if self.all_models:
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in self.models)

    def as_json(self) -> dict[str, object]:
        """The key as ``rosterd keys list`` shows it (never the digest)."""
        return {
            "name": self.name,
            "scopes": sorted(s.value for s in self.scopes),
            "models": list(self.models),
            "priority": self.priority.value if self.priority else None,
            "limits": {
                "in_flight": self.limits.in_flight,
                "requests_per_minute": self.limits.requests_per_minute,
                "tokens_per_day": self.limits.tokens_per_day,
            },
        }


class KeyRing:
    """The keys a router accepts, found by a request's token (:meth:`find`).

    Empty: no key is asked for (the router is open, as without ``--api-key``)."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self.keys: tuple[ApiKey, ...] = tuple(keys)
        self._by_digest: Mapping[bytes, ApiKey] = {key.digest.encode(): key for key in self.keys}

    @classmethod
    def of(cls, file_keys: Iterable[ApiKey], master_tokens: Iterable[str]) -> KeyRing:
        """The keys of a keys file and the ``--api-key`` tokens (each holds every scope and
        model, no limits; named :data:`MASTER_NAME`, then ``--api-key#2``...)."""
        masters = [
            ApiKey(
                MASTER_NAME if i == 1 else f"{MASTER_NAME}#{i}",
                key_digest(token),
                scopes=ALL_SCOPES,
            )
            for i, token in enumerate(dict.fromkeys(master_tokens), 1)
        ]
        return cls([*file_keys, *masters])

    @property
    def required(self) -> bool:
        """Whether requests must carry a key."""
        return bool(self.keys)

    def find(self, token: bytes) -> ApiKey | None:
        """The key whose token is ``token``, else ``None`` (also for ``b""``)."""
        if not token:
            return None
        digest = key_digest(token).encode()
        key = self._by_digest.get(digest)
        if key is None or not hmac.compare_digest(digest, key.digest.encode()):
            return None
        return key

    def names(self) -> list[str]:
        """The keys' names, in order."""
        return [key.name for key in self.keys]
