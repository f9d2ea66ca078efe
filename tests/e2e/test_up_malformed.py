"""Malformed requests never reach a backend: the empty-messages body that once left
llama-server processing with no progress (and its role restarted by the wedge check, every
other request on it cut), and a hypothesis-fuzzed set of bodies each dialect's own API
refuses, sent to the example's ``chat-small`` (a real llama-server) while a second request
streams on it. Each gets a 400 in its path's envelope naming the field; the stream
completes; the backend keeps its pid and records no restart.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.up import EXAMPLE_LAB, Up, prepare_example_models, start_up, wait_resident

pytestmark = pytest.mark.slow

USER = {"role": "user", "content": "Count from one to a hundred."}
#: The example's chat-small context (examples/fleet.yaml), tokens.
CTX_SIZE = 4096

_not_a_list = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=8),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
_not_content = st.one_of(
    st.none(),
    st.integers(),
    st.booleans(),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
_bad_role = st.text(max_size=12).filter(
    lambda r: r not in {"system", "developer", "user", "assistant", "tool", "function"}
)
_bad_limit = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=CTX_SIZE + 1),
    st.text(max_size=4),
    st.floats(allow_nan=False, allow_infinity=False),
)

#: Bodies of /v1/chat/completions that OpenAI's API refuses, one bad field each.
MALFORMED_CHAT = st.one_of(
    st.just({"messages": []}),
    st.builds(lambda m: {"messages": m}, _not_a_list),
    st.builds(lambda r: {"messages": [{"role": r, "content": "hi"}]}, _bad_role),
    st.builds(lambda c: {"messages": [USER, {"role": "user", "content": c}]}, _not_content),
    st.builds(lambda n: {"messages": [USER], "max_tokens": n}, _bad_limit),
    st.builds(lambda n: {"messages": [USER], "max_completion_tokens": n}, _bad_limit),
    st.builds(
        lambda item: {"messages": [USER, item]}, st.one_of(st.integers(), st.text(max_size=4))
    ),
)


def _backend_pid(up: Up) -> int:
    pid = up.get("/status")["nodes"]["local"]["roles"]["chat-small"]["pid"]
    assert isinstance(pid, int)
    return pid


def _restarts(up: Up) -> list[dict[str, Any]]:
    events = up.get("/rosterd/events")["events"]
    return [
        e
        for e in events
        if e["role"] == "chat-small" and e["kind"] in {"restarted", "unhealthy", "crashed"}
    ]


def _refused(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    return str(error if isinstance(error, str) else error["message"])


def test_malformed_requests_are_400s_and_leave_a_stream_and_its_backend_alone(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    up = start_up(EXAMPLE_LAB, tmp_path, free_port)
    try:
        wait_resident(up, {"chat-small"}, timeout_s=120)
        pid = _backend_pid(up)
        streamed = {
            "model": "chat-small",
            "messages": [USER],
            "max_tokens": 160,
            "ignore_eos": True,  # llama-server's: the stream runs its whole length
            "stream": True,
        }
        with httpx.Client(base_url=up.url, timeout=120, trust_env=False) as client:
            with client.stream("POST", "/v1/chat/completions", json=streamed) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                first = next(line for line in lines if line)
                assert first.startswith("data: {")

                # The body that once restarted the role, in each dialect.
                empty = {"model": "chat-small", "messages": []}
                said = _refused(client.post("/v1/chat/completions", json=empty))
                assert said.startswith("messages: the list is empty"), said
                said = _refused(client.post("/v1/messages", json={**empty, "max_tokens": 8}))
                assert said.startswith("messages: the list is empty"), said
                bad_ollama = {"model": "chat-small", "messages": [{"role": "user", "content": 3}]}
                assert _refused(client.post("/api/chat", json=bad_ollama)).startswith(
                    "messages[0].content"
                )
                sent = {"bodies": 0}

                @given(body=MALFORMED_CHAT)
                @settings(
                    max_examples=40,
                    deadline=None,
                    suppress_health_check=list(HealthCheck),
                    derandomize=True,
                    database=None,
                )
                def fuzz(body: dict[str, Any]) -> None:
                    answer = client.post(
                        "/v1/chat/completions", json={"model": "chat-small", **body}
                    )
                    sent["bodies"] += 1
                    assert answer.json()["error"]["code"] == "bad_request", answer.text
                    _refused(answer)

                fuzz()
                assert sent["bodies"] >= 20

                rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]", rest[-3:]
            chunks = [json.loads(line.removeprefix("data: ")) for line in rest[:-1]]
            finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
            assert finish[-1] == "length", finish[-3:]
        assert _backend_pid(up) == pid
        assert _restarts(up) == []
        # The access log: each refusal with its role, node and reason; the stream with the
        # tokens llama-server reported in its last chunk.
        logged = (tmp_path / "state" / "logs" / "access.log").read_text().splitlines()
        refused = [line for line in logged if " status=400 " in line]
        assert len(refused) == 3 + sent["bodies"]
        assert all("role=chat-small node=local" in line for line in refused), refused[:3]
        chat = [line for line in refused if "path=/v1/chat/completions" in line]
        assert len(chat) == 1 + sent["bodies"]
        assert all("code=bad_request" in line for line in chat), chat[:3]
        assert all('reason="messages' in line for line in refused if "/v1/chat" not in line)
        [served] = [line for line in logged if " status=200 " in line and "/v1/chat" in line]
        assert "tokens_out=160" in served, served
        assert "tokens_in=-" not in served, served
    finally:
        assert up.stop(signal.SIGINT) == 0, up.output()
