"""Probes (DESIGN.md layer 5): is a backend ready, does it generate, and how long to wait.

An adapter describes a probe (``HttpProbe``: method, path, body, accepted
statuses); ``run_probe`` sends it and judges the answer, and ``run_generation_probe``
asks a backend that gave a generation probe no answer whether it is busy rather than
wedged (its progress probe, llama-server's ``/slots``). ``wait_ready`` polls
a starting backend's readiness probe until it passes, the process exits, a stop
is asked for, or a deadline that grows with the weights' size
(``ready_timeout_for``) passes. The poll starts 10 ms apart and backs off to
``READY_POLL_S``: a small model is ready within tens of milliseconds, and a
fixed 200 ms poll made every cold swap wait for the next poll.

Library choice: httpx, the project's HTTP client, through
:func:`rosterd.supervisor.backend_http.backend_client` (one TLS context, no proxy
settings from the environment).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import httpx

from rosterd.adapters.base import HttpProbe, Launch, ProgressProbe
from rosterd.backends.values import ProbeResult
from rosterd.errors import BackendNotReadyError, BackendStartError, BackendStoppedError
from rosterd.supervisor.backend_http import backend_client
from rosterd.supervisor.process import describe_exit, failure_reason, output_tail
from rosterd.tokens import GB

log = logging.getLogger("rosterd.supervisor")

#: Readiness deadline for a backend whose weights size is unknown (seconds).
READY_BASE_S: Final[float] = 30.0
#: Extra readiness time per GiB (2^30 bytes) of weights (seconds): loading reads them from disk.
READY_PER_GB_S: Final[float] = 30.0
#: Upper bound of the computed readiness deadline (seconds).
READY_MAX_S: Final[float] = 3600.0
#: How often readiness is polled while a backend loads, at most (seconds).
READY_POLL_S: Final[float] = 0.2
#: The first pause between readiness polls (seconds); it doubles up to ``READY_POLL_S``.
READY_FIRST_POLL_S: Final[float] = 0.01
#: How long one look at a backend's progress may take, seconds (as the request path's check).
PROGRESS_ANSWER_S: Final[float] = 5.0
#: The pause between two looks at a backend's progress, seconds.
PROGRESS_EVERY_S: Final[float] = 2.0


def ready_timeout_for(weights_bytes: int) -> float:
    """The readiness deadline in seconds for weights of ``weights_bytes`` bytes.

    ``READY_BASE_S + READY_PER_GB_S * weights_bytes / GB``, at most ``READY_MAX_S``.
    """
    return min(READY_MAX_S, READY_BASE_S + READY_PER_GB_S * max(weights_bytes, 0) / GB)


async def run_probe(
    base_url: str, probe: HttpProbe, *, timeout_s: float, client: httpx.AsyncClient | None = None
) -> ProbeResult:
    """Send ``probe`` to ``base_url`` and judge the answer; never raises for HTTP trouble.

    Passes when the status is in ``probe.ok_status`` and, if
    ``probe.expect_json_key`` is set, the JSON body is an object with that key.
    A server that does not answer within ``timeout_s`` seconds fails (that is
    how a wedged server shows: HTTP accepted, generation never ends).
    """
    own = client is None
    http = client or backend_client()
    try:
        response = await http.request(
            probe.method,
            base_url + probe.path,
            json=dict(probe.json) if probe.json is not None else None,
            timeout=timeout_s,
        )
    except httpx.TimeoutException:
        return ProbeResult(False, None, f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as err:
        return ProbeResult(False, None, f"{type(err).__name__}: {err}")
    finally:
        if own:
            await http.aclose()
    if response.status_code not in probe.ok_status:
        return ProbeResult(False, response.status_code, response.text[:200])
    if probe.expect_json_key is not None:
        try:
            body = response.json()
        except ValueError:
            return ProbeResult(False, response.status_code, "answer is not JSON")
        if not isinstance(body, dict) or probe.expect_json_key not in body:
            return ProbeResult(
                False, response.status_code, f"answer has no {probe.expect_json_key!r}"
            )
    return ProbeResult(True, response.status_code)


async def run_generation_probe(
    base_url: str,
    probe: HttpProbe,
    *,
    timeout_s: float,
    progress: ProgressProbe | None,
    window_s: float,
) -> ProbeResult:
    """``run_probe`` for a generation probe, which a busy backend cannot answer in time.

    When ``probe`` gets no answer within ``timeout_s`` seconds and the backend has a
    ``progress`` probe, the backend is looked at every :data:`PROGRESS_EVERY_S` for up to
    ``window_s`` seconds (``--progress-window``, wider than one batch of prompt
    processing): an answer that changes (counters moving, a slot that finished) means
    busy, and the probe passes with ``detail`` saying so. A look with no answer within
    :data:`PROGRESS_ANSWER_S`, an answer the probe cannot read, or the same answer for the
    whole window leave the probe failed (wedged). Why: llama-server prefilling a long
    prompt for a client that left does not answer a one-token probe for minutes, and was
    restarted for it (issue 33). Never raises for HTTP trouble.
    """
    result = await run_probe(base_url, probe, timeout_s=timeout_s)
    if result.ok or result.status is not None or progress is None:
        return result
    what = progress.path.strip("/")
    busy, how = await _progress_moves(base_url, progress, window_s)
    if not busy:
        return ProbeResult(False, None, f"{result.detail}, and its {what} answer {how}")
    detail = f"busy: {result.detail}, but its {what} answer {how}"
    log.info("the generation probe of the backend at %s passes: %s", base_url, detail)
    return ProbeResult(True, None, detail)


async def _progress_moves(
    base_url: str, progress: ProgressProbe, window_s: float
) -> tuple[bool, str]:
    """Whether the backend's progress answer changed within ``window_s`` seconds, and how
    (or why not), in words."""
    first: object = None
    began = time.monotonic()
    async with backend_client(timeout_s=PROGRESS_ANSWER_S) as client:
        while True:
            try:
                answer = await client.get(base_url + progress.path)
            except httpx.TimeoutException:
                return False, f"did not come within {PROGRESS_ANSWER_S:g} s"
            except httpx.HTTPError as exc:
                return False, f"did not come ({type(exc).__name__})"
            try:
                if answer.status_code != 200:
                    raise ValueError(f"HTTP {answer.status_code}")
                body: object = answer.json()
                progress.counters(body)  # ValueError: not the backend's progress answer
            except ValueError:
                return False, f"could not be read (HTTP {answer.status_code})"
            if first is None:
                first = body
            elif body != first:
                return True, "changed between two looks"
            if time.monotonic() + PROGRESS_EVERY_S - began > window_s:
                return False, f"did not change for {time.monotonic() - began:.0f} s"
            await asyncio.sleep(PROGRESS_EVERY_S)


async def wait_ready(
    name: str,
    launch: Launch,
    proc: asyncio.subprocess.Process,
    *,
    timeout_s: float,
    log_path: Path,
    log_offset: int,
    stopping: Callable[[], bool],
    stop_requested: asyncio.Event | None = None,
) -> None:
    """Return once backend ``name`` (process ``proc``) passes ``launch.readiness``.

    The probe is polled ``READY_FIRST_POLL_S`` apart, doubling up to every
    ``READY_POLL_S`` seconds, for at most ``timeout_s`` seconds; ``stopping()``
    true means a stop asked for the backend, and ``stop_requested`` (set by the
    stop) ends the wait at once, even inside a probe. The process is left
    running on every outcome: the caller stops it.
    Each error quotes the output written to ``log_path`` after ``log_offset``; the
    first line of a start or readiness failure ends with the lines of it that say
    why (``failure_reason``), so the short form clients get keeps the cause.

    Raises:
        BackendStartError: the process exited before it was ready.
        BackendStoppedError: ``stopping()`` became true before it was ready.
        BackendNotReadyError: not ready within ``timeout_s``.
    """

    def failed(
        message: str, exit_code: int | None, error: type[BackendStartError] = BackendStartError
    ) -> BackendStartError:
        tail = output_tail(log_path, log_offset)
        # The first line is what `rosterd up` and a client see: it says why, not just how.
        reason = failure_reason(tail) if error is not BackendStoppedError else ""
        return error(
            f"{message}: {reason}" if reason else message,
            name=name,
            pid=proc.pid,
            exit_code=exit_code,
            output_tail=tail,
            log_path=log_path,
        )

    stopped = f"backend {name} was stopped before it was ready"
    deadline = time.monotonic() + timeout_s
    exited = asyncio.ensure_future(proc.wait())
    stop = stop_requested or asyncio.Event()
    stop_asked = asyncio.ensure_future(stop.wait())
    pause_s = READY_FIRST_POLL_S
    try:
        async with backend_client() as client:
            while True:
                if stopping():  # the stop came before this process existed for it
                    raise failed(stopped, proc.returncode, BackendStoppedError)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise failed(
                        f"backend {name} was not ready within {timeout_s:g} s "
                        f"({launch.readiness.method} {launch.readiness.path}); killed it",
                        None,
                        BackendNotReadyError,
                    )
                probing = asyncio.ensure_future(
                    run_probe(
                        launch.base_url,
                        launch.readiness,
                        timeout_s=max(0.5, min(remaining, 30.0)),
                        client=client,
                    )
                )
                await asyncio.wait(
                    {probing, exited, stop_asked}, return_when=asyncio.FIRST_COMPLETED
                )
                if stop_asked.done() and not exited.done():
                    probing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probing
                    raise failed(stopped, proc.returncode, BackendStoppedError)
                if exited.done():
                    probing.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probing
                    code = exited.result()
                    if stopping():
                        raise failed(stopped, code, BackendStoppedError)
                    raise failed(f"backend {name} {describe_exit(code)} before it was ready", code)
                if probing.result().ok:
                    return
                await asyncio.wait({exited, stop_asked}, timeout=pause_s)
                pause_s = min(READY_POLL_S, pause_s * 2)
    finally:
        for waiting in (exited, stop_asked):
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
