"""A role's backend log over HTTP (``GET /rosterd/logs/{role}``) and ``rosterd logs``.

The router is served by uvicorn on 127.0.0.1 with stand-in backends (no model is
needed to read a log); the log files are written here as the supervisor writes them,
rotated files included. ``rosterd logs`` runs as a user runs it: the console script,
in its own process, over real HTTP.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from rosterd.router import RouterConfig
from support.router import serve
from support.up import rosterd_argv


def numbered(first: int, last: int) -> str:
    return "".join(f"line {i}\n" for i in range(first, last + 1))


async def test_tail_reads_across_rotated_files(tmp_path: Path) -> None:
    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url) as client:
        (up.logs / "chat.log.2").write_text(numbered(1, 10))
        (up.logs / "chat.log.1").write_text(numbered(11, 20))
        (up.logs / "chat.log").write_text(numbered(21, 25))

        r = await client.get("/rosterd/logs/chat", params={"lines": 8})
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/plain; charset=utf-8"
        assert r.text == numbered(18, 25)
        everything = await client.get("/rosterd/logs/chat-m", params={"lines": 1000})  # by model
        assert everything.text == numbered(1, 25)
        assert (await client.get("/rosterd/logs/chat")).text == numbered(1, 25)  # default 200
        assert (await client.get("/rosterd/logs/chat", params={"lines": 0})).text == ""
        # A role that never ran has no log yet: an empty tail, not an error.
        assert (await client.get("/rosterd/logs/quiet")).text == ""


async def test_bad_log_requests_are_openai_errors(tmp_path: Path) -> None:
    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url) as client:
        for params in ({"lines": "-1"}, {"lines": "many"}, {"lines": "10001"}, {"follow": "x"}):
            r = await client.get("/rosterd/logs/chat", params=params)
            assert r.status_code == 400, params
            assert r.json()["error"]["code"] == "bad_request"
        r = await client.get("/rosterd/logs/nobody")
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "model_not_found"
        r = await client.get("/rosterd/logs/..%2Fetc")
        assert r.status_code in (400, 404)


async def test_the_log_needs_the_api_key(tmp_path: Path) -> None:
    keyed = RouterConfig(api_keys=("sesame",))
    async with serve(tmp_path, config=keyed) as up, httpx.AsyncClient() as client:
        (up.logs / "chat.log").write_text("secret output\n")
        r = await client.get(f"{up.url}/rosterd/logs/chat")
        assert r.status_code == 401
        r = await client.get(
            f"{up.url}/rosterd/logs/chat", headers={"Authorization": "Bearer sesame"}
        )
        assert r.text == "secret output\n"


async def test_follow_streams_new_lines_and_follows_a_rotation(tmp_path: Path) -> None:
    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=10) as client:
        log = up.logs / "chat.log"
        log.write_text(numbered(1, 3))
        got = b""
        async with client.stream(
            "GET", "/rosterd/logs/chat", params={"lines": 2, "follow": 1}
        ) as stream:
            assert stream.headers["x-accel-buffering"] == "no"
            chunks = stream.aiter_raw()

            async def until(text: str) -> None:
                nonlocal got
                async with asyncio.timeout(10):
                    while text.encode() not in got:
                        got += await anext(chunks)

            await until(numbered(2, 3))
            with log.open("a") as f:
                f.write("line 4\n")
            await until("line 4\n")
            log.rename(up.logs / "chat.log.1")  # rotated, as the supervisor does
            with (up.logs / "chat.log.1").open("a") as f:
                f.write("line 5\n")  # the old file's last bytes still come
            log.write_text("line 6\n")
            await until("line 6\n")
        assert got == numbered(2, 6).encode()


async def test_closing_the_streams_ends_a_follow(tmp_path: Path) -> None:
    async with serve(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=10) as client:
        (up.logs / "chat.log").write_text("one\n")
        async with client.stream("GET", "/rosterd/logs/chat", params={"follow": 1}) as stream:
            began = time.monotonic()
            up.streams.close()  # as `rosterd up` does when it stops serving
            body = b"".join([chunk async for chunk in stream.aiter_raw()])
        assert body == b"one\n"
        assert time.monotonic() - began < 5


async def test_rosterd_logs_prints_the_tail_and_follows(tmp_path: Path) -> None:
    async with serve(tmp_path) as up:
        (up.logs / "chat.log").write_text(numbered(1, 30))
        done = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "logs", "chat", "-n", "5", "--url", up.url],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode() == numbered(26, 30)

        refused = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "logs", "nobody", "--url", up.url],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 2
        assert b"404" in refused.stderr
        assert b"nobody" in refused.stderr

        (up.logs / "chat.log").rename(up.logs / "kept.log")
        empty = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "logs", "chat", "--url", up.url],
            capture_output=True,
            timeout=60,
            check=False,
        )
        (up.logs / "kept.log").rename(up.logs / "chat.log")
        assert empty.returncode == 0
        assert empty.stdout == b""
        assert b"chat has no backend log yet" in empty.stderr

        follower = await asyncio.create_subprocess_exec(
            *rosterd_argv(),
            *["logs", "chat", "-f", "-n", "1", "--url", up.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert follower.stdout is not None
            first = await asyncio.wait_for(follower.stdout.readline(), 30)
            assert first == b"line 30\n"
            with (up.logs / "chat.log").open("a") as f:
                f.write("line 31\n")
            later = await asyncio.wait_for(follower.stdout.readline(), 30)
            assert later == b"line 31\n"
        finally:
            follower.terminate()  # by its own handle
            await follower.wait()


@pytest.mark.parametrize("given", ["-3", "lots", "20000"])
def test_rosterd_logs_refuses_a_bad_line_count(given: str) -> None:
    done = subprocess.run(
        [*rosterd_argv(), "logs", "chat", "-n", given, "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "-n/--lines" in done.stderr


async def test_a_role_with_copies_has_a_log_per_copy(tmp_path: Path) -> None:
    """``chat``'s copies on nodes ``a`` and ``b`` of one ``up`` log to ``chat@a.log`` and
    ``chat@b.log``: ``--node`` picks one, a tail without it shows both under their file
    names, and a follow without it asks for ``--node``."""

    def copies(role: str) -> dict[str, Path]:
        logs = tmp_path / "logs"
        return {n: logs / f"{role}@{n}.log" for n in ("a", "b")} if role == "chat" else {}

    async with (
        serve(tmp_path, copy_logs=copies) as up,
        httpx.AsyncClient(base_url=up.url, timeout=10) as client,
    ):
        (up.logs / "chat@a.log").write_text("from a\n")
        (up.logs / "chat@b.log").write_text(numbered(1, 3))
        (up.logs / "chat.log").write_text("an earlier run's single copy\n")

        r = await client.get("/rosterd/logs/chat", params={"node": "b", "lines": 2})
        assert r.text == numbered(2, 3)
        both = await client.get("/rosterd/logs/chat", params={"lines": 1})
        assert both.text == "==> chat@a.log <==\nfrom a\n\n==> chat@b.log <==\nline 3\n"
        follow = await client.get("/rosterd/logs/chat", params={"follow": 1})
        assert follow.status_code == 400
        assert "--node" in follow.json()["error"]["message"]
        elsewhere = await client.get("/rosterd/logs/chat", params={"node": "c"})
        assert elsewhere.status_code == 404
        assert "its copies: a, b" in elsewhere.json()["error"]["message"]
        # A role with one copy keeps its one log; ``node`` changes nothing there.
        (up.logs / "quiet.log").write_text("one copy\n")
        alone = await client.get("/rosterd/logs/quiet", params={"node": "a"})
        assert alone.text == "one copy\n"

        done = await asyncio.to_thread(
            subprocess.run,
            [*rosterd_argv(), "logs", "chat", "--node", "a", "--url", up.url],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"from a\n"
