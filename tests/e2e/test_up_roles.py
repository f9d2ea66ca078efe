"""Which roster entry a role is, and why a known role is not served: ``rosterd plan --json``
and a real ``rosterd up`` (without warm-up, so no backend starts) over HTTP.

A roster gives ``scratch-a`` twice (tiny-a, 0.1 GiB, then tiny-b, 5 GiB, which
would not even fit the 3 GiB node): the first entry is planned, listed and
routed to, the second is reported. ``planner`` (mlx_lm) is planned on a remote
Mac and ``ollama-x`` on no node at all; a request for either says so.
Last, the README's embeddings recipe on a real llama-server.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import openai
import psutil

from support.backends import pick_free_port
from support.up import (
    GEMMA,
    MODELS,
    StartUp,
    llama_entry,
    prepare_example_models,
    rosterd_argv,
    start_up,
    write_box_fleet,
    write_roster,
)

GIB = 2**30


def _lab(tmp_path: Path) -> list[str]:
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("scratch-a", "tiny-a", 0.1, 8311),
            llama_entry("scratch-a", "tiny-b", 5.0, 8312),
            {**llama_entry("planner", "Qwen3-30B-A3B", 1.0, 8080), "backend": "mlx_lm"},
            {**llama_entry("ollama-x", "phi4-mini", 1.0, 11434), "backend": "ollama"},
            {**llama_entry("vision", "Qwen2.5-VL-7B", 8.0, 8090), "backend": "mlx-vlm"},
        ],
    )
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {name: here, memory_gb: 4, reserved_gb: 1, platform: linux-x86_64,"
        " flavors: [llamacpp], address: 127.0.0.1}\n"
        "  - {name: studio, memory_gb: 64, reserved_gb: 8, platform: macos-arm64,"
        " flavors: [mlx_lm], address: 192.0.2.1}\n"
    )
    return [str(roster), "--fleet", str(fleet)]


def test_plan_json_plans_the_first_entry_of_a_duplicate_id(tmp_path: Path) -> None:
    out = subprocess.run(
        [*rosterd_argv(), "plan", *_lab(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    result = json.loads(out)
    assert result["placements"] == {"scratch-a": "here", "planner": "studio"}
    assert result["nodes"]["here"]["swappable"] == ["scratch-a"]  # the 0.1 GiB entry fits
    reasons = dict(result["unplaced"][:1])
    assert "first roster entry with this id is the one planned" in reasons["scratch-a"]
    assert [r for r, _ in result["unplaced"]] == ["scratch-a", "ollama-x"]


def test_up_routes_the_first_entry_and_says_why_others_are_not_served(tmp_path: Path) -> None:
    port = pick_free_port()
    up = start_up([*_lab(tmp_path), "--no-warm-up"], tmp_path, port)
    try:
        models = up.get("/v1/models")["data"]
        assert [m["id"] for m in models] == ["scratch-a"]
        (scratch,) = models
        assert scratch["aliases"] == ["tiny-a"]
        assert scratch["resident_bytes"] == int(0.1 * GIB)
        assert up.get("/v1/models/tiny-a")["id"] == "scratch-a"
        r = httpx.get(f"{up.url}/v1/models/tiny-b", trust_env=False, timeout=10)
        assert r.status_code == 404
        # A role of the plan not served here is 503 model_unplaced with the plan's reason
        # and no Retry-After; an entry the import skipped is no role: 404.
        for model, why, status in (
            ("planner", "planned on node studio, which this process does not run", 503),
            ("Qwen3-30B-A3B", "planned on node studio", 503),
            ("ollama-x", "unplaced: ", 503),
            ("vision", 'skipped in the roster: backend "mlx-vlm" has no inference adapter', 404),
        ):
            r = httpx.post(
                f"{up.url}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
                trust_env=False,
                timeout=10,
            )
            assert r.status_code == status, r.text
            error = r.json()["error"]
            assert error["code"] == ("model_unplaced" if status == 503 else "model_not_found")
            assert why in error["message"]
            assert "retry-after" not in r.headers
    finally:
        assert up.stop(signal.SIGINT) == 0
    said = " ".join(up.output().split())
    assert "scratch-a │ llamacpp │ tiny-a" in said
    assert "│ yes │ on demand, evicted last │" in said  # sticky by default
    assert "tiny-b" not in said.split("unplaced roles")[0]  # the plan table shows tiny-a


def test_embeddings_through_the_router_with_extra_args(
    tmp_path: Path, rosterd_up: StartUp, tiny_gguf: Path, llama_server_binary: Path
) -> None:
    """The README's embeddings recipe, on a real llama-server: ``extra_args:
    [--embeddings, --pooling, mean]`` in the fleet's ``models:`` entry."""
    roster = write_roster(tmp_path / "roster.yaml", [llama_entry("embedder", "tiny", 0.1, 8311)])
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "nodes:\n"
        "  - {name: here, memory_gb: 4, reserved_gb: 1, platform: linux-x86_64,"
        " flavors: [llamacpp], address: 127.0.0.1}\n"
        f"models:\n  tiny: {{path: {tiny_gguf}, extra_args: [--embeddings, --pooling, mean]}}\n"
        f"model_roots: [{tiny_gguf.parent}]\n"
    )
    up = rosterd_up([str(roster), "--fleet", str(fleet), "--no-warm-up"])
    try:
        with openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0) as client:
            reply = client.embeddings.create(model="embedder", input=["hello", "world"])
        assert [len(d.embedding) for d in reply.data] == [64, 64]  # the tiny model's n_embd
        assert reply.data[0].embedding != reply.data[1].embedding
    finally:
        assert up.stop(signal.SIGINT) == 0


def _alias_lab(tmp_path: Path) -> list[str]:
    """Two llama.cpp entries with no port, repo or name (so the import makes ``chat-big``
    an alias of ``chat-small``, as the reference does) that the fleet maps to two files."""
    prepare_example_models()
    entry = {"role": "chat", "ram_gb": 0.5, "backend": "llama.cpp", "status": "live"}
    roster = write_roster(
        tmp_path / "roster.yaml", [{"id": "chat-small", **entry}, {"id": "chat-big", **entry}]
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"chat-small": {"path": str(MODELS / "tiny-a.gguf")}, "chat-big": {"path": str(GEMMA)}},
    )
    return [str(roster), "--fleet", str(fleet)]


def test_roster_import_keeps_the_references_alias(tmp_path: Path) -> None:
    args = _alias_lab(tmp_path)
    out = subprocess.run(
        [*rosterd_argv(), "roster", "import", args[0], "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    result = json.loads(out)
    assert [s["role"] for s in result["specs"]] == ["chat-small"]
    assert result["skipped"] == [
        ["chat-big", "alias of chat-small (same server, port and weights)"]
    ]


def test_an_alias_the_fleet_gives_other_weights_is_served_on_them(
    tmp_path: Path, rosterd_up: StartUp
) -> None:
    """Issue: ``chat-big`` was answered by ``chat-small``'s tiny model with a 200."""
    args = _alias_lab(tmp_path)
    plan = subprocess.run(
        [*rosterd_argv(), "plan", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(plan.stdout)["placements"] == {"chat-small": "box", "chat-big": "box"}
    said = " ".join(plan.stderr.split())
    assert "'chat-big' (line" in said
    assert "alias of 'chat-small'" in said
    assert f"chat-big: {GEMMA}" in said
    assert f"chat-small: {MODELS / 'tiny-a.gguf'}" in said
    assert "same server, port and weights" not in said

    up = rosterd_up([*args, "--no-warm-up"])
    try:
        assert {m["id"] for m in up.get("/v1/models")["data"]} == {"chat-small", "chat-big"}
        with openai.OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0) as client:
            reply = client.chat.completions.create(
                model="chat-big", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
            )
        assert reply.model == "chat-big"
        roles = up.get("/status")["nodes"]["box"]["roles"]
        argv = psutil.Process(roles["chat-big"]["pid"]).cmdline()
        assert str(GEMMA) in argv
        assert str(MODELS / "tiny-a.gguf") not in argv
    finally:
        assert up.stop(signal.SIGINT) == 0
    assert "as a role of its own" in up.output()
