"""A backend's refusal caused by its role's configuration (DESIGN.md layer 7): the fix to name.

llama-server answers some requests its launch flags rule out with a 5xx, although
nothing will change on its own: a request with ``tools`` to a server started without
Jinja templates answers 500 "tools param requires --jinja flag" (llama.cpp's
``oaicompat_chat_params_parse``). Relayed as a 502, every client retries it (Claude
Code 11 times over 175 s). :func:`config_fault` recognises these answers by the
backend's own words and says what the operator changes; the caller answers 400
``not_supported`` naming the role and that fix. The 501s for an endpoint the backend
does not serve (embeddings, reranking) are ``openai_errors``' own table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: Where a llama.cpp role's launch flags are set, said in every fix.
_EXTRA_ARGS = "extra_args of the role's model in the fleet file's models: section"


@dataclass(frozen=True)
class ConfigFault:
    """One kind of refusal: ``pattern`` (a regex searched in the backend's message) and
    ``fix(role, match)``, the sentence that tells the operator what to change."""

    pattern: re.Pattern[str]
    fix: Callable[[str, re.Match[str]], str]


def _missing_flag(role: str, match: re.Match[str]) -> str:
    flag = match.group("flag")
    negated = "--no-" + flag.removeprefix("--")
    return (
        f"role {role!r} was started without {flag}; add {flag} to {_EXTRA_ARGS} "
        f"(and remove {negated} if it is there), then run rosterd reload"
    )


#: The refusals known, first match wins. llama.cpp's wording: "tools param requires
#: --jinja flag", "tool_choice param requires --jinja flag" (tools/server/utils.hpp).
CONFIG_FAULTS: tuple[ConfigFault, ...] = (
    ConfigFault(re.compile(r"\brequires (?P<flag>--[a-z][a-z0-9-]*) flag\b"), _missing_flag),
)


def config_fault(role: str, backend_message: str) -> str | None:
    """The fix for ``role``'s configuration when ``backend_message`` (the backend's own
    ``error.message``) is a refusal of :data:`CONFIG_FAULTS`, else ``None``."""
    for fault in CONFIG_FAULTS:
        match = fault.pattern.search(backend_message)
        if match is not None:
            return fault.fix(role, match)
    return None
