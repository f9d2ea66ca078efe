"""The answer's ``model`` is the name the client asked for (DESIGN.md layer 7).

A backend answers with the name it was sent, the role's served name (``gemma-3-270m``
where the client asked for ``chat-small``); OpenAI echoes the name requested, and
llama-swap's ``useModelName`` does the same. :class:`ModelEcho` wraps the ASGI
``send`` of one answer and puts the requested name back in every ``"model"`` field
that holds the served name, in a plain JSON answer, an event stream or NDJSON lines,
native or translated. The served name stays in the ``X-Rosterd-Role`` header.

A plain answer that declares its length is held until its last byte (at most
:data:`HELD_MAX_BYTES`) so that its ``Content-Length`` can be set anew; a stream is
rewritten line by line, a line split across two chunks waiting for its end. The
rewrite matches the field's JSON text, ``"model":"NAME"`` or ``"model": "NAME"``: a
quote inside generated text is escaped in JSON (``\\"model\\"``) and never matches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.types import Message, Send

from rosterd.router.routing import PROXIED_PATHS

#: The largest plain answer held whole to rewrite its ``model``, bytes; a bigger one
#: (a large embeddings answer) goes out as the backend sent it.
HELD_MAX_BYTES = 8 * 2**20


class ModelEcho:
    """``send`` for one answer, with ``"model": served`` written as ``"model": asked``.

    ``asked``: the ``model`` of the client's request; ``served``: the name the backend
    was sent. Messages other than ``http.response.start`` and ``http.response.body``
    pass unchanged.
    """

    def __init__(self, send: Send, asked: str, served: str) -> None:
        self._send = send
        # The name as a backend may write it: with non-ASCII escaped or not.
        served_texts = {json.dumps(served), json.dumps(served, ensure_ascii=False)}
        asked_text = json.dumps(asked, ensure_ascii=False)
        self._pairs = [
            (f'"model"{sep}{text}'.encode(), f'"model"{sep}{asked_text}'.encode())
            for sep in (":", ": ")
            for text in served_texts
        ]
        self._held_start: Message | None = None
        self._held_body = bytearray()
        self._partial = b""

    @staticmethod
    def wrap(send: Send, path: str, payload: Mapping[str, Any], served: str) -> Send:
        """``send`` wrapped for a request on one of ``PROXIED_PATHS`` whose ``payload``
        asked for a ``model`` other than ``served``, else ``send``. Ollama's paths give
        their own answer's ``model`` (``rosterd.router.ollama``) and are left alone."""
        asked = payload.get("model")
        if path not in PROXIED_PATHS or not isinstance(asked, str) or asked in ("", served):
            return send
        return ModelEcho(send, asked, served)

    def _rewrite(self, data: bytes) -> bytes:
        for old, new in self._pairs:
            if old in data:
                data = data.replace(old, new)
        return data

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            length = _content_length(message)
            if length is not None and length <= HELD_MAX_BYTES:
                self._held_start = message
                return
            if length is not None:
                self._pairs = []  # too big to hold: sent as it is
            await self._send(message)
            return
        if kind != "http.response.body":
            await self._send(message)
            return
        body: bytes = message.get("body", b"")
        more = bool(message.get("more_body", False))
        if self._held_start is not None:
            self._held_body += body
            if more:
                return
            whole = self._rewrite(bytes(self._held_body))
            start, self._held_start = self._held_start, None
            headers = [
                (k, str(len(whole)).encode() if k.lower() == b"content-length" else v)
                for k, v in start.get("headers", ())
            ]
            await self._send({**start, "headers": headers})
            await self._send({"type": "http.response.body", "body": whole, "more_body": False})
            return
        data = self._partial + body
        if more:
            cut = data.rfind(b"\n") + 1
            data, self._partial = data[:cut], data[cut:]
            if not data:
                return
        else:
            self._partial = b""
        await self._send({**message, "body": self._rewrite(data)})


def _content_length(start: Message) -> int | None:
    for key, value in start.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
