"""llama-server's slot files: save a slot's KV cache to a file and restore it (layer 4).

The capability :class:`rosterd.adapters.base.SlotKeeping` for the ``llamacpp`` flavor,
over llama.cpp's ``tools/server`` slot API: the server started with
``--slot-save-path DIR`` answers ``POST /slots/{id}?action=save`` and
``?action=restore`` with ``{"filename": NAME}`` (a plain name, resolved inside ``DIR``;
the server refuses anything else) and reports ``n_saved``/``n_restored`` tokens,
``n_written``/``n_read`` bytes and ``timings.save_ms``/``restore_ms``. ``GET /props``
gives its ``build_info``, which the file's format follows.

What must match for a restore is read from the launch's own argv
(:func:`rosterd.memory.estimate.parse_llamacpp_settings` reads the flags the same way
for the estimate): the context and slots, the K and V cache types, ``--swa-full``,
flash attention (without it llama.cpp stores V transposed) and ``--kv-unified``.
httpx is the client because the backends boundary already speaks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rosterd.adapters.base import Launch, SlotFile
from rosterd.errors import SlotFileError
from rosterd.memory.estimate import parse_llamacpp_settings

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True, slots=True)
class LlamaServerSlots:
    """:class:`~rosterd.adapters.base.SlotKeeping` for llama-server (see the module)."""

    def launch_args(self, folder: Path) -> tuple[str, ...]:
        """``--slot-save-path FOLDER``: the server saves and restores only there."""
        return ("--slot-save-path", str(folder))

    def identity(self, launch: Launch) -> dict[str, str]:
        """Context, slots, cache types, ``--swa-full``, flash attention and unified KV, as
        ``launch``'s argv sets them (later flags win, as in llama.cpp's parser)."""
        settings = parse_llamacpp_settings(0, 0, launch.argv[1:])
        return {
            "ctx": str(settings.ctx_size),
            "slots": str(settings.parallel),
            "cache_type_k": settings.cache_type_k,
            "cache_type_v": settings.cache_type_v,
            "swa_full": str(settings.swa_full).lower(),
            "flash_attn": settings.flash_attn,
            "kv_unified": str(settings.kv_unified).lower(),
        }

    async def version(self, client: httpx.AsyncClient, *, timeout_s: float) -> str:
        """``GET /props``'s ``build_info`` (``unknown`` when the server gives none).

        Raises:
            SlotFileError: the server did not answer.
        """
        body = await _call(client, "GET", "/props", None, timeout_s, "report its version")
        build = body.get("build_info")
        return build if isinstance(build, str) and build else "unknown"

    async def save(
        self, client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
    ) -> SlotFile:
        """``POST /slots/{slot}?action=save``; the tokens, bytes and time it reports.

        Raises:
            SlotFileError: the server refused (a slot busy, a bad name) or did not answer.
        """
        body = await _call(
            client, "POST", f"/slots/{slot}?action=save", filename, timeout_s, "save"
        )
        return _slot_file(slot, body, "n_saved", "n_written", "save_ms")

    async def restore(
        self, client: httpx.AsyncClient, slot: int, filename: str, *, timeout_s: float
    ) -> SlotFile:
        """``POST /slots/{slot}?action=restore``; the tokens, bytes and time it reports.

        Raises:
            SlotFileError: the server refused (a file of another model or settings, a
                missing file) or did not answer.
        """
        body = await _call(
            client, "POST", f"/slots/{slot}?action=restore", filename, timeout_s, "restore"
        )
        return _slot_file(slot, body, "n_restored", "n_read", "restore_ms")


async def _call(
    client: httpx.AsyncClient,
    method: str,
    path: str,
    filename: str | None,
    timeout_s: float,
    what: str,
) -> dict[str, object]:
    """One request to the server; its JSON object. httpx's errors become ``SlotFileError``."""
    import httpx

    try:
        answer = await client.request(
            method,
            path,
            json=None if filename is None else {"filename": filename},
            timeout=timeout_s,
        )
    except httpx.HTTPError as exc:
        raise SlotFileError(f"llama-server did not answer {method} {path}: {exc!r}") from exc
    try:
        body = answer.json()
    except ValueError:
        body = {}
    if answer.status_code != 200 or not isinstance(body, dict):
        message = body.get("error") if isinstance(body, dict) else None
        if isinstance(message, dict):
            message = message.get("message")
        raise SlotFileError(
            f"llama-server refused to {what} ({method} {path}: HTTP {answer.status_code}"
            + (f": {message}" if message else "")
            + ")"
        )
    return body


def _slot_file(
    slot: int, body: dict[str, object], tokens_key: str, bytes_key: str, ms_key: str
) -> SlotFile:
    timings = body.get("timings")
    ms = timings.get(ms_key) if isinstance(timings, dict) else None
    tokens = body.get(tokens_key)
    size = body.get(bytes_key)
    return SlotFile(
        slot=slot,
        tokens=tokens if isinstance(tokens, int) else 0,
        file_bytes=size if isinstance(size, int) else 0,
        took_s=float(ms) / 1000.0 if isinstance(ms, int | float) else 0.0,
    )
