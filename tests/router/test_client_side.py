"""One request's client side (pure): a client that closes its connection once it has the
stream's final event is not cut as one that left mid-answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from starlette.types import Message

from rosterd.router.client_side import ClientAnswer, RequestCut, pass_body
from rosterd.router.upstream import UpstreamResponse


class Upstream:
    """A backend's streamed body, chunk by chunk (stands in for ``UpstreamResponse``)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


async def test_the_final_event_sent_means_a_disconnect_cuts_nothing() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    answer = ClientAnswer(send)
    request = asyncio.get_running_loop().create_task(asyncio.sleep(10))
    cut = RequestCut(request, answer)
    stream = Upstream([b"data: {}\n\n", b"data: [DONE]", b"\n\n"])
    upstream = cast(UpstreamResponse, stream)
    finished, _, _ = await pass_body(upstream, send, (b"data: [DONE]",), answer.mark_ended)
    assert finished
    assert answer.ended
    left = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await left
    cut.client_left(left)  # the SDK closed its connection after [DONE]
    assert cut.why is None
    assert not request.cancelled()
    request.cancel()


async def test_a_disconnect_before_the_final_event_cuts() -> None:
    async def send(message: Message) -> None:
        return None

    answer = ClientAnswer(send)
    request = asyncio.get_running_loop().create_task(asyncio.sleep(10))
    cut = RequestCut(request, answer)
    left = asyncio.get_running_loop().create_task(asyncio.sleep(0))
    await left
    cut.client_left(left)
    assert cut.why == "client_left"
    await asyncio.sleep(0)
    assert request.cancelled()
