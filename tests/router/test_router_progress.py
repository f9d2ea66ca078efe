"""The progress check's verdicts (``rosterd.router.progress.wedged_verdict``) against a real
HTTP server answering ``/slots`` as llama-server shapes it, with short windows.

The server is a stdlib stand-in for llama-server's ``/slots`` alone: the real one cannot be
made to hold its counters still, or to stop answering, on demand. Its slot counters stay,
move on every look, never answer, or answer 501 (``/slots`` turned off).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rosterd.adapters.base import ProgressProbe
from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.router.progress import ProgressCheck, Vouch, wedged_verdict

_PROBE = LlamaCppAdapter().progress_probe
assert _PROBE is not None
PROBE: ProgressProbe = _PROBE
CHECK = ProgressCheck(after_s=0.0, answer_s=0.5, window_s=0.4, every_s=0.1)


def serve_slots(mode: str) -> Iterator[str]:
    """A server whose ``/slots`` is ``mode``: ``still``, ``moving``, ``silent`` or ``off``."""
    looks = itertools.count()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if mode == "silent":
                release.wait(10)
                return
            status = 501 if mode == "off" else 200
            done = next(looks) if mode == "moving" else 0
            slot = {"id": 0, "id_task": 3, "n_prompt_tokens_processed": 2048 * done}
            data = json.dumps([{**slot, "next_token": {"n_decoded": 0}}]).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, on every test.
    serving = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def slots(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from serve_slots(request.param)


def quiet_for_long() -> float:
    return asyncio.get_running_loop().time() - 60.0


@pytest.mark.parametrize("slots", ["still"], indirect=True)
async def test_counters_that_do_not_move_for_the_window_are_a_wedge(slots: str) -> None:
    verdict = await asyncio.wait_for(wedged_verdict(slots, PROBE, quiet_for_long, CHECK), 5)
    assert verdict is not None
    assert "no progress in its slots counters" in verdict


@pytest.mark.parametrize("slots", ["silent"], indirect=True)
async def test_no_answer_within_the_answer_time_is_a_wedge(slots: str) -> None:
    verdict = await asyncio.wait_for(wedged_verdict(slots, PROBE, quiet_for_long, CHECK), 5)
    assert verdict is not None
    assert "slots endpoint gave no answer within 0.5 s" in verdict


@pytest.mark.parametrize("slots", ["moving"], indirect=True)
async def test_counters_that_move_are_left_alone(slots: str) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(wedged_verdict(slots, PROBE, quiet_for_long, CHECK), 1.5)


@pytest.mark.parametrize("slots", ["still"], indirect=True)
async def test_a_request_that_gets_bytes_is_never_looked_at(slots: str) -> None:
    loop = asyncio.get_running_loop()
    check = ProgressCheck(after_s=0.3, answer_s=0.5, window_s=0.4, every_s=0.1)
    with pytest.raises(TimeoutError):  # its last byte is always just now
        await asyncio.wait_for(wedged_verdict(slots, PROBE, loop.time, check), 1.5)


@pytest.mark.parametrize("slots", ["off"], indirect=True)
async def test_a_backend_that_cannot_tell_gets_no_verdict_and_no_longer_vouches(
    slots: str,
) -> None:
    vouch = Vouch()
    assert vouch()  # until a look says otherwise, its request may wait up to the cap
    verdict = await asyncio.wait_for(wedged_verdict(slots, PROBE, quiet_for_long, CHECK, vouch), 5)
    assert verdict is None
    assert not vouch()  # so its request keeps the deadline of its size


@pytest.mark.parametrize("slots", ["moving"], indirect=True)
async def test_a_backend_whose_counters_it_reads_keeps_vouching(slots: str) -> None:
    vouch = Vouch()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(wedged_verdict(slots, PROBE, quiet_for_long, CHECK, vouch), 1.0)
    assert vouch()
