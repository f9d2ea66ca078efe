"""The router's error table and mappings: what each error code answers (status, OpenAI type,
Retry-After), and how scheduler refusals, revocations and upstream client failures map to them.

No fakes: the errors are the scheduler's and the upstream client's own classes, and one
upstream failure is a real connection refused by a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from starlette.types import Message

from rosterd.error_table import retry_after_header
from rosterd.errors import (
    LoadBackoffError,
    LoadFailedError,
    QueueFullError,
    QueueTimeoutError,
    RoleRefusedError,
    RoleUnavailableError,
    SchedulerError,
    ShuttingDownError,
    UnknownRoleError,
    UpstreamClosedError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from rosterd.router import ERROR_KINDS, RouterError, error_body
from rosterd.router.openai_errors import (
    LIMIT_OPTIONS,
    revoked_error,
    scheduler_error,
    scheduler_errors,
    send_error,
    sse_error_event,
    upstream_errors,
    upstream_status_error,
)
from rosterd.router.upstream import Upstream
from rosterd.scheduler.values import Revocation

#: Every error code -> (status, OpenAI type, Retry-After header or None). The README and the
#: end-to-end tests pin these; a new code needs a row here.
TABLE: dict[str, tuple[int, str, str | None]] = {
    "bad_request": (400, "invalid_request_error", None),
    "invalid_json": (400, "invalid_request_error", None),
    "model_missing": (400, "invalid_request_error", None),
    "invalid_role": (400, "invalid_request_error", None),
    "invalid_api_key": (401, "authentication_error", None),
    "permission_denied": (403, "permission_error", None),
    "model_not_found": (404, "invalid_request_error", None),
    "not_found": (404, "invalid_request_error", None),
    "method_not_allowed": (405, "invalid_request_error", None),
    "request_timeout": (408, "invalid_request_error", None),
    "body_too_large": (413, "invalid_request_error", None),
    "not_supported": (400, "invalid_request_error", None),
    "invalid_config": (422, "invalid_request_error", None),
    "not_translatable": (501, "invalid_request_error", None),
    "queue_full": (429, "rate_limit_error", None),
    "key_limit": (429, "rate_limit_error", None),
    "internal_error": (500, "server_error", None),
    "not_implemented": (501, "invalid_request_error", None),
    "backend_error": (502, "upstream_error", None),
    "backend_load_failed": (502, "upstream_error", "5"),
    "backend_timeout": (504, "upstream_error", "5"),
    "backend_unhealthy": (503, "server_error", "5"),
    "load_backoff": (503, "server_error", None),
    "queue_timeout": (503, "server_error", None),
    "shutting_down": (503, "server_error", "5"),
    "evicted": (503, "server_error", "1"),
    "node_lost": (503, "server_error", "1"),
    "role_refused": (503, "server_error", None),
    "model_unplaced": (503, "server_error", None),
    "model_unavailable": (503, "server_error", None),
    "unavailable": (503, "server_error", None),
}


def test_the_table_holds_every_code_and_no_other() -> None:
    assert set(ERROR_KINDS) == set(TABLE)


async def _answer(err: RouterError) -> tuple[int, dict[str, str], bytes]:
    """What a raw ASGI client receives for ``err``: status, headers, body."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    await send_error(scope, receive, send, err)
    start, body = sent
    assert start["type"] == "http.response.start"
    assert body["type"] == "http.response.body"
    assert not body.get("more_body", False)
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return int(start["status"]), headers, bytes(body["body"])


@pytest.mark.parametrize("code", sorted(TABLE))
def test_each_code_answers_its_status_type_and_retry_after(code: str) -> None:
    status, err_type, retry_after = TABLE[code]
    got_status, headers, body = asyncio.run(_answer(RouterError(code, f"why {code}")))
    assert got_status == status
    assert headers["content-type"] == "application/json"
    assert headers.get("retry-after") == retry_after
    assert json.loads(body) == {
        "error": {"message": f"why {code}", "type": err_type, "code": code, "param": None}
    }
    if status == 401:
        assert headers["www-authenticate"] == "Bearer"


def test_a_code_missing_from_the_table_is_a_bug_not_an_answer() -> None:
    with pytest.raises(KeyError):
        RouterError("no_such_code", "x")


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (29.5, "30")]
)
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(seconds: float, header: str) -> None:
    assert retry_after_header(seconds) == header
    assert RouterError("queue_full", "x", retry_after_s=seconds).headers() == {
        "Retry-After": header,
        "X-Rosterd-Error": "queue_full",
    }


def test_a_given_retry_after_overrides_the_tables() -> None:
    assert RouterError("shutting_down", "x", retry_after_s=1.0).headers() == {
        "Retry-After": "1",
        "X-Rosterd-Error": "shutting_down",
    }


def test_the_sse_error_event_is_the_same_envelope_as_the_last_event() -> None:
    event = sse_error_event(RouterError("backend_error", "cut"))
    assert event["type"] == "http.response.body"
    assert event["more_body"] is False
    raw = bytes(event["body"])
    assert raw.startswith(b"data: ")
    assert raw.endswith(b"\n\n")
    assert json.loads(raw[len(b"data: ") :]) == error_body("cut", "upstream_error", "backend_error")


@pytest.mark.parametrize(
    ("exc", "code", "status", "retry_after"),
    [
        (QueueFullError("queue full", retry_after_s=2.5), "queue_full", 429, "3"),
        (QueueTimeoutError("waited 30 s", retry_after_s=12.0), "queue_timeout", 503, "12"),
        (ShuttingDownError("stopping"), "shutting_down", 503, "5"),
        (RoleRefusedError("too big"), "role_refused", 503, None),
        (RoleUnavailableError("weights missing"), "model_unavailable", 503, None),
        (LoadFailedError("exited 1"), "backend_load_failed", 502, "5"),
        (LoadBackoffError("failed twice", retry_after_s=1.5), "load_backoff", 503, "2"),
        (UnknownRoleError("no role x"), "model_not_found", 404, None),
        (SchedulerError("something else"), "unavailable", 503, None),
    ],
)
def test_scheduler_refusals_map_to_their_code(
    exc: SchedulerError, code: str, status: int, retry_after: str | None
) -> None:
    with pytest.raises(RouterError) as caught, scheduler_errors():
        raise exc
    err = caught.value
    option = LIMIT_OPTIONS.get(code)
    said = f"{exc}; rosterd up's {option} sets the limit" if option else str(exc)
    assert (err.code, err.status, err.message) == (code, status, said)
    assert err.headers().get("Retry-After") == retry_after
    assert err.__cause__ is exc


def test_the_most_specific_scheduler_error_class_wins() -> None:
    class NarrowQueueFullError(QueueFullError):
        pass

    assert scheduler_error(NarrowQueueFullError("full", retry_after_s=1.0)).code == "queue_full"


def test_scheduler_errors_lets_other_errors_through() -> None:
    with pytest.raises(ValueError, match="scheduler"), scheduler_errors():
        raise ValueError("not the scheduler's")


@pytest.mark.parametrize("code", ["evicted", "shutting_down"])
def test_a_revoked_request_gets_503_with_the_revocations_code(code: str) -> None:
    err = revoked_error(Revocation(code, f"role a {code}"))
    assert (err.status, err.err_type, err.code, err.message) == (
        503,
        "server_error",
        code,
        f"role a {code}",
    )
    assert err.headers() == {"Retry-After": "1", "X-Rosterd-Error": code}


@pytest.mark.parametrize(
    "exc",
    [
        UpstreamConnectError("cannot connect to 127.0.0.1:9: [Errno 111] Connection refused"),
        UpstreamTimeoutError("the backend sent nothing for 600 s"),
        UpstreamClosedError("the backend closed the connection unanswered"),
        UpstreamProtocolError("the backend closed the connection mid-answer"),
    ],
)
def test_upstream_client_errors_map_to_502_backend_error(exc: UpstreamError) -> None:
    with pytest.raises(RouterError) as caught, upstream_errors("chat"):
        raise exc
    err = caught.value
    assert (err.status, err.err_type, err.code) == (502, "upstream_error", "backend_error")
    assert err.message == f"backend of role 'chat' failed: {type(exc).__name__}: {exc}"
    assert err.__cause__ is exc
    assert err.headers() == {"X-Rosterd-Error": "backend_error"}


def test_an_upstream_failure_mid_stream_says_so() -> None:
    exc = UpstreamProtocolError("reset")
    with pytest.raises(RouterError) as caught, upstream_errors("chat", mid_stream=True):
        raise exc
    assert caught.value.code == "backend_error"
    assert caught.value.message == "backend of role 'chat' failed mid-stream: reset"


def test_upstream_errors_lets_other_errors_through() -> None:
    with pytest.raises(ValueError, match="upstream"), upstream_errors("chat"):
        raise ValueError("not the upstream client's")


def test_a_real_refused_connection_maps_to_backend_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the request: nobody listens

    async def call() -> None:
        upstream = Upstream(connect_s=5.0, read_s=5.0, keepalive_s=2.0)
        try:
            with upstream_errors("chat"):
                await upstream.post(f"http://127.0.0.1:{port}", "/v1/completions", b"{}", "*/*")
        finally:
            await upstream.close()

    with pytest.raises(RouterError) as caught:
        asyncio.run(call())
    assert caught.value.status == 502
    assert caught.value.message.startswith(
        "backend of role 'chat' failed: UpstreamConnectError: cannot connect to 127.0.0.1:"
    )
    assert isinstance(caught.value.__cause__, UpstreamConnectError)


def test_a_backend_5xx_answer_maps_to_502_quoting_its_body() -> None:
    err = upstream_status_error("chat", 500, "x" * 2000)
    assert (err.status, err.err_type, err.code) == (502, "upstream_error", "backend_error")
    assert err.message == f"backend of role 'chat' answered 500: {'x' * 500}"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_genuine_backend_failure_stays_502(status: int) -> None:
    err = upstream_status_error("chat", status, '{"error": {"message": "boom"}}', endpoint="chat")
    assert (err.status, err.code) == (502, "backend_error")


def test_a_backend_501_is_400_not_supported_saying_how_to_enable_embeddings() -> None:
    body = (
        '{"error": {"code": 501, "message": "no embeddings here", "type": "not_supported_error"}}'
    )
    err = upstream_status_error("emb", 501, body, endpoint="embeddings")
    assert (err.status, err.err_type, err.code) == (400, "invalid_request_error", "not_supported")
    assert err.message.startswith(
        "the backend of role 'emb' does not serve embeddings (it answered 501: no embeddings "
        "here); to enable them, add --embeddings to extra_args"
    )
    other = upstream_status_error("chat", 501, "not here", endpoint="completions")
    assert other.code == "not_supported"
    assert "does not serve completions (it answered 501: not here)" in other.message
