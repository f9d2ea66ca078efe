"""``rosterd up`` checks every local role's weights at start: a role whose weights are
missing is named with the reason, shown as unavailable in ``/status``, and its requests
get a 503 ``model_unavailable`` at once, without a load being tried."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import httpx

from support.polling import eventually_sync
from support.up import (
    MODELS,
    StartUp,
    llama_entry,
    prepare_example_models,
    write_box_fleet,
    write_roster,
)


def test_missing_weights_are_reported_at_start_and_answered_with_503(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("tiny", "tiny-a", 0.1, 18941), llama_entry("broken", "nowhere", 0.1, 18942)],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {
            "tiny-a": {"path": str(MODELS / "tiny-a.gguf")},
            "broken": {"path": str(MODELS / "missing-weights.gguf")},
        },
        address="127.0.0.1",
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet), "--no-warm-up"])
    try:
        output = " ".join(up.output().split())
        assert "role broken is unavailable (requests get 503)" in output
        assert "missing-weights.gguf does not exist" in output
        assert "role tiny is unavailable" not in output
        roles = up.get("/status")["nodes"]["box"]["roles"]
        assert roles["broken"]["phase"] == "unavailable"
        assert "does not exist" in roles["broken"]["unavailable_reason"]
        assert roles["tiny"]["phase"] == "stopped"
        answer = httpx.post(
            up.url + "/v1/chat/completions",
            json={"model": "broken", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
            trust_env=False,
        )
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "model_unavailable"
        assert "role 'broken' is unavailable" in error["message"]
        assert "missing-weights.gguf does not exist" in error["message"]
        assert str(MODELS) not in error["message"]  # no absolute paths for clients
        events = up.get("/rosterd/events")["events"]
        assert not [e for e in events if e["role"] == "broken"]  # no load was tried
    finally:
        assert up.stop(signal.SIGINT) == 0


def test_a_corrupt_gguf_is_reported_with_llama_servers_reason(
    tmp_path: Path, rosterd_up: StartUp, llama_server_binary: Path
) -> None:
    """A file of random bytes named *.gguf: `up` and the answer say what llama-server said.

    The answer's status depends on when the request comes, by design (``error_table``): while
    a load is under way and fails, 502 ``backend_load_failed``; in the backoff after a failed
    load (0.5 s after the first), 503 ``load_backoff``, quoting the last failure. Either way
    the client reads llama-server's reason."""
    corrupt = tmp_path / "models" / "model.gguf"
    corrupt.parent.mkdir()
    corrupt.write_bytes(random.Random(3).randbytes(4096))
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("corrupt", "junk", 0.1, 18943)])
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml", {"junk": {"path": str(corrupt)}}, address="127.0.0.1"
    )
    box = json.loads(fleet.read_text())
    box["model_roots"] = [str(corrupt.parent)]  # the corrupt file is in a root of its own
    fleet.write_text(json.dumps(box))
    env = {"ROSTERD_LLAMA_SERVER": str(llama_server_binary)}
    up = rosterd_up([str(roster), "--fleet", str(fleet)], env=env)
    try:
        answer = httpx.post(
            up.url + "/v1/chat/completions",
            json={"model": "corrupt", "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
            trust_env=False,
        )
        error = answer.json()["error"]
        assert (answer.status_code, error["code"]) in {
            (502, "backend_load_failed"),
            (503, "load_backoff"),
        }, answer.text
        message = error["message"]
        assert "exited with code 1 before it was ready: " in message
        assert "invalid magic characters" in message
        assert "failed to load model" in message
        assert str(tmp_path) not in message  # no absolute paths for clients

        def not_loaded() -> list[str]:
            lines = up.output().splitlines()
            return [line for line in lines if line.startswith("not loaded at start")]

        # The start's load may end after the request's (it is said when it ends).
        said = eventually_sync(
            not_loaded, what="up's line on the load at start", timeout_s=30, context=up.output
        )
        assert "invalid magic characters" in said[0]
    finally:
        assert up.stop(signal.SIGINT) == 0
