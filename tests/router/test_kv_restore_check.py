"""A restore that loaded its file but did not serve is told: the first answer after it is
read for llama-server's ``timings`` (issue 20), and ``/status``, ``rosterd ps`` and the
live page show per role what is kept and how the last restore went.

The answers are llama-server's own shapes (a plain chat answer, an event stream's last
chunk), as this build of llama-server ends them, judged alone and through the router
(served by uvicorn, over a stand-in upstream that answers with them); the end-to-end
case, real llama-server behind ``rosterd up``, runs in ``test_kv_keep.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rosterd.backends.values import Endpoint, KeptKv
from rosterd.router.restore_check import RestoreChecks, kv_summary, restore_verdict
from rosterd.scheduler.lease import Lease
from rosterd.scheduler.views import RoleSnapshot
from support.backends import NoLiveness, pick_free_port
from support.router import serve


def plain_answer(*, cache_n: int, prompt_n: int) -> bytes:
    """A non-streamed chat answer of llama-server, as it ends (usage, then timings)."""
    return json.dumps(
        {
            "choices": [{"finish_reason": "length", "index": 0, "message": {"content": "A"}}],
            "object": "chat.completion",
            "usage": {
                "completion_tokens": 4,
                "prompt_tokens": cache_n + prompt_n,
                "total_tokens": cache_n + prompt_n + 4,
            },
            "timings": {
                "cache_n": cache_n,
                "prompt_n": prompt_n,
                "prompt_ms": 193.2,
                "predicted_n": 4,
                "predicted_ms": 134.5,
            },
        },
        separators=(",", ":"),
    ).encode()


def stream_end(*, cache_n: int, prompt_n: int) -> bytes:
    """An event stream's last chunks: the timings ride on the final one, without usage."""
    last = {
        "choices": [{"finish_reason": "length", "index": 0, "delta": {}}],
        "object": "chat.completion.chunk",
        "timings": {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": 4},
    }
    return (
        b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
        + b"data: "
        + json.dumps(last).encode()
        + b"\n\ndata: [DONE]\n\n"
    )


def lease(restored: int, *, generation: int = 1, base_url: str = "http://127.0.0.1:9") -> Lease:
    return Lease("chat", "box", Endpoint(base_url, "m", 1, restored), generation, 0.0)


def test_a_restore_whose_prompt_was_prefilled_whole_is_not_reused() -> None:
    verdict = restore_verdict("chat", 3713, plain_answer(cache_n=1, prompt_n=3716))
    assert verdict is not None
    assert not verdict.effective
    assert (verdict.prompt_tokens, verdict.prefilled, verdict.reused) == (3717, 3716, 1)
    assert verdict.detail.startswith(
        "role chat: the KV restore of 3,713 tokens did not serve: the first request after "
        "it prefilled 3,716 of its 3,717 prompt tokens (reused 1); likely a sliding-window "
        "model launched without --swa-full"
    )
    assert "a changed chat template or system prompt" in verdict.detail


def test_a_restore_the_next_turn_reused_is_effective_also_in_a_stream() -> None:
    verdict = restore_verdict("chat", 3713, stream_end(cache_n=3705, prompt_n=40))
    assert verdict is not None
    assert verdict.effective
    assert verdict.detail == (
        "role chat: the first request after the restore of 3,713 tokens reused 3,705 of "
        "its 3,745 prompt tokens"
    )
    # A shorter prompt that begins with the kept tokens reuses what it shares.
    shorter = restore_verdict("chat", 3713, plain_answer(cache_n=900, prompt_n=3))
    assert shorter is not None
    assert shorter.effective


def test_a_restore_is_not_judged_without_timings_or_on_a_few_tokens() -> None:
    assert restore_verdict("chat", 3713, b'{"usage":{"completion_tokens":3}}') is None
    assert restore_verdict("chat", 40, plain_answer(cache_n=0, prompt_n=40)) is None
    assert restore_verdict("chat", 3713, plain_answer(cache_n=0, prompt_n=20)) is None
    # Without cache_n the prompt's length is usage.prompt_tokens.
    no_cache_n = b'"usage":{"prompt_tokens":500},"timings":{"prompt_n":500,"predicted_n":2}}'
    verdict = restore_verdict("chat", 3713, no_cache_n)
    assert verdict is not None
    assert not verdict.effective


def test_only_the_first_answer_after_a_restore_is_read_and_one_warning_per_role(
    caplog: pytest.LogCaptureFixture,
) -> None:
    checks = RestoreChecks()
    assert not checks.wants(lease(0))  # no restore: no answer is read
    first = lease(3713)
    assert checks.wants(first)
    with caplog.at_level(logging.INFO, logger="rosterd.kv"):
        checks.check(first, plain_answer(cache_n=0, prompt_n=3716))
        assert not checks.wants(first)  # the later answers of that start: not read
        again = lease(3713, generation=2)  # the next restore of the role
        assert checks.wants(again)
        checks.check(again, stream_end(cache_n=0, prompt_n=3716))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "did not serve" in warnings[0].getMessage()
    assert caplog.text.count("did not serve") == 2  # the second one at info level


def _shown(kv: KeptKv | None, base_url: str | None, pid: int | None) -> RoleSnapshot:
    """A role as its node shows it, running the backend at ``base_url`` (``None``:
    stopped) with ``kv`` kept."""
    return RoleSnapshot(
        phase="ready" if base_url is not None else "stopped",
        latency_class="batch",
        sticky=True,
        resident_bytes=0,
        running=0,
        queued=0,
        idle_s=None,
        loaded_for_s=None,
        waiting_reason=None,
        waiting_s=None,
        last_error=None,
        last_error_age_s=None,
        load_backoff_s=None,
        base_url=base_url,
        pid=pid,
        restart_pending=False,
        unavailable_reason=None,
        retiring=False,
        memory=None,
        kv=kv,
    )


def test_status_shows_the_kept_kv_and_the_last_restore_in_one_cell() -> None:
    checks = RestoreChecks()
    served = lease(3713)
    kv = KeptKv(
        tokens=3713,
        file_bytes=18 * 2**20 + 12345,
        last_restore="restored",
        last_restore_detail="role chat: KV of slot 0 restored ...",
    )
    running = _shown(kv, served.endpoint.base_url, 1)
    assert checks.judged("box", "chat", running) is None
    assert kv_summary(kv) == "3,713 tok · 18 MiB · restored"
    checks.check(served, plain_answer(cache_n=2, prompt_n=3716))
    check = checks.judged("box", "chat", running)
    assert check is not None
    assert kv_summary(kv, check) == "3,713 tok · 18 MiB · restored, not reused"
    shown = check.as_json()
    assert shown["last_restore_check"] == "not reused"
    assert shown["last_restore_prefilled"] == 3716
    assert "did not serve" in str(shown["last_restore_check_detail"])
    # A later backend of the role (another process) is not judged by that answer.
    assert checks.judged("box", "chat", _shown(kv, served.endpoint.base_url, 2)) is None
    # Stopped (evicted), the role's last restore is still that one.
    assert checks.judged("box", "chat", _shown(kv, None, None)) is check
    assert checks.judged("box", "voice", _shown(None, None, None)) is None
    assert kv_summary(None) == "—"


def test_the_kv_cell_says_dash_when_nothing_is_kept() -> None:
    assert kv_summary(None) == "—"
    assert kv_summary(KeptKv(tokens=0, file_bytes=0, last_restore="none")) == "—"
    assert kv_summary(KeptKv(tokens=0, file_bytes=0, last_restore="refused")) == "refused"
    assert kv_summary(KeptKv(tokens=52, file_bytes=400_000)) == "52 tok · 0.4 MiB"


async def _chat_twice_then_status(url: str) -> dict[str, Any]:
    """Two chat requests for role ``chat``, then its entry of ``/status``."""
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(2):
            body = {"model": "chat-m", "messages": [{"role": "user", "content": "x"}]}
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
        role: dict[str, Any] = (await client.get("/status")).json()["nodes"]["n1"]["roles"]["chat"]
    return role


class _RestoredBackends(NoLiveness):
    """Every start "restored" 3,713 tokens, into an upstream that answers as llama-server
    does when it prefilled the prompt whole; what is kept, as ``SupervisorBackends`` says."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def start(self, role: str) -> Endpoint:
        return Endpoint(f"http://127.0.0.1:{self.port}", role, None, 3713)

    async def stop(self, role: str) -> None:
        return None

    def kept_kv(self, role: str) -> KeptKv | None:
        return KeptKv(tokens=3713, file_bytes=18 * 2**20, last_restore="restored")


async def test_the_router_reads_the_first_answer_after_a_restore_and_status_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answers = 0

    async def llama_chat(request: Request) -> Response:
        nonlocal answers
        answers += 1
        return Response(plain_answer(cache_n=1, prompt_n=3716), media_type="application/json")

    port = pick_free_port()
    upstream = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/v1/chat/completions", llama_chat, methods=["POST"])]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    task = asyncio.create_task(upstream.serve())
    try:
        with caplog.at_level(logging.INFO, logger="rosterd.kv"):
            async with serve(tmp_path, backends=_RestoredBackends(port)) as up:
                role = await _chat_twice_then_status(up.url)
    finally:
        upstream.should_exit = True
        await task
    assert answers == 2
    assert role["kv_summary"] == "3,713 tok · 18 MiB · restored, not reused"
    assert role["kv"]["last_restore_check"] == "not reused"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [role["kv"]["last_restore_check_detail"]]  # once, for the first answer
