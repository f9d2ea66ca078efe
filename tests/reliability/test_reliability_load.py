"""Load: 1,000 concurrent streams through one role are all held to their end.

``rosterd up`` runs as users run it (a subprocess) with ``--max-concurrency 1000
--max-queue 1000`` in front of a fast stand-in for llama-server
(tests/support/fake_llama_server.py: a real llama-server on two cores cannot hold 1,000
streams). 1,000 clients open a streamed chat completion at once; every one must
get 200, its first byte and ``data: [DONE]``. rosterd's RSS at 1,000 streams
open is printed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import resource
import time
from pathlib import Path

import httpx
import pytest

from rosterd.errors import RouterError, UpstreamConnectError
from rosterd.router.openai_errors import upstream_errors
from rosterd.scheduler.values import SchedulerLimits
from rosterd.up.runtime import open_files_wanted, raise_open_files_limit
from support.reliability import print_figures, raise_nofile, rss_and_fds, start_fake_up
from support.up import all_gone

STREAMS = 1000


async def _streams(url: str, count: int, up_pid: int) -> tuple[list[str], int]:
    """``count`` streamed chat completions at once; each one's outcome (``ok`` or what cut
    it) and rosterd's RSS (bytes) while they were all open."""
    outcomes: list[str] = []
    first_bytes = asyncio.Event()
    started = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=count)
    timeout = httpx.Timeout(60.0, pool=None)

    async def one(client: httpx.AsyncClient) -> None:
        nonlocal started
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        try:
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
                seen = b""
                async for chunk in reply.aiter_raw():
                    if not seen:
                        started += 1
                        if started == count:
                            first_bytes.set()
                    seen = (seen + chunk)[-64:]
                if reply.status_code != 200:
                    outcomes.append(f"status {reply.status_code}")
                elif b"data: [DONE]" not in seen:
                    outcomes.append("no [DONE]")
                else:
                    outcomes.append("ok")
        except httpx.HTTPError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        tasks = [asyncio.ensure_future(one(client)) for _ in range(count)]
        rss = 0
        try:
            await asyncio.wait_for(first_bytes.wait(), timeout=60)
            rss = rss_and_fds(up_pid)[0]
        except TimeoutError:
            pass
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    return outcomes, rss


@pytest.mark.slow
@pytest.mark.reliability
def test_one_thousand_streams_are_all_held(tmp_path: Path, tiny_gguf: Path) -> None:
    """Started with the usual soft limit of 1,024 open files, rosterd raises it: before,
    984 of 1,000 streams got 502 (the connect to the backend failed with EMFILE) and
    nothing was logged."""
    raise_nofile(8 * STREAMS)  # the child's hard limit: rosterd raises its soft one to it
    up = start_fake_up(
        tmp_path,
        tiny_gguf,
        extra=["--max-concurrency", str(STREAMS), "--max-queue", str(STREAMS)],
        nofile_soft=1024,
    )
    try:
        pids = up.backend_pids()
        rss_idle, fds_idle = rss_and_fds(up.proc.pid)
        started = time.monotonic()
        outcomes, rss_busy = asyncio.run(_streams(up.url, STREAMS, up.proc.pid))
        took_s = time.monotonic() - started
        held = outcomes.count("ok")
        print_figures(
            "load",
            {
                "streams_held": f"{held}/{STREAMS}",
                "rss_idle_MiB": round(rss_idle / 2**20, 1),
                "rss_at_1000_streams_MiB": round(rss_busy / 2**20, 1),
                "fds_idle": fds_idle,
                "took_s": round(took_s, 1),
            },
        )
        lost = sorted({o for o in outcomes if o != "ok"})
        assert held == STREAMS, f"{STREAMS - held} cut: {lost[:5]}\n{up.output()[-3000:]}"
        # Raised to the hard limit (said so), or a warning naming a hard limit that is lower
        # than the limits admit (importing mlx in the test process lowers it to 4,096).
        assert re.search(
            r"raised the open-files limit from 1024|open-files limit is \d+", up.output()
        )
    finally:
        assert up.stop() == 0
    assert not all_gone(pids)


def test_a_request_the_backend_fails_is_logged_with_its_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client sees 502; the operator's log says which role and why (here EMFILE)."""
    # As the upstream client raises it when connect() fails with EMFILE.
    cause = OSError(24, "Too many open files")
    failed = UpstreamConnectError(f"cannot connect to the backend: {cause}")
    failed.__cause__ = cause
    with (
        caplog.at_level(logging.WARNING, logger="rosterd.router"),
        pytest.raises(RouterError) as raised,
        upstream_errors("chat"),
    ):
        raise failed
    assert raised.value.code == "backend_error"
    assert any(
        "chat" in r.getMessage() and "Too many open files" in r.getMessage() for r in caplog.records
    )


def test_up_raises_a_low_open_files_limit_and_says_so() -> None:
    """``rosterd up`` raises the soft limit to what its limits admit (at most the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = open_files_wanted(SchedulerLimits(max_concurrency=1000, max_queue=1000), 1)
    assert wanted == 256 + 4000
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        said = raise_open_files_limit(wanted)
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert said is not None
        if hard == resource.RLIM_INFINITY or hard >= wanted:
            assert now == (max(wanted, 2**20) if hard == resource.RLIM_INFINITY else hard)
            assert "raised the open-files limit from 256" in said
        else:
            assert now == hard
            assert "warning" in said
        assert raise_open_files_limit(now) is None
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
