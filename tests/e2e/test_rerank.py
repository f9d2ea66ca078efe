"""Rerank as a user serves it: a reranker GGUF (pooling type rank) in the fleet's ``models:``
is started with ``--reranking`` and answers ``/v1/rerank`` and ``/rerank`` through rosterd,
one result per document; a chat role gets rosterd's 400 naming it and ``reranking: true``
before any load. The real test runs ``rosterd up`` in this event loop on real llama-servers
over the tiny GGUFs of ``scripts/make_tiny_gguf.py`` (its ``rerank`` one: qwen3 with a
classifier head), written into the test's folder; the others check the rule and the
command line on the same files.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, cast

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from rosterd.adapters.llamacpp import LlamaCppAdapter
from rosterd.cli import _register, app
from rosterd.errors import FleetError
from rosterd.fleet import ModelSource
from rosterd.fleet.reader import parse_fleet
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.up.runtime import UpOptions
from rosterd.weights import ResolvedWeights, resolve_weights
from support.backends import pick_free_port
from support.up import serving

_register()
ROLES = ("rerank", "chat")
NODE = {"name": "box", "memory_gb": 4, "reserved_gb": 1, "platform": "linux-x86_64"}
DOCUMENTS = ["the cat sat", "a dog ran", "rain fell", "bread rose"]


def tiny_gguf(path: Path, *, rerank: bool) -> Path:
    """``scripts/make_tiny_gguf.write_tiny_gguf``: the tiny reranker or the tiny chat model."""
    pytest.importorskip("gguf", reason="the gguf package (dev extra) writes the tiny model")
    script = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_gguf.py"
    spec = importlib.util.spec_from_file_location("make_tiny_gguf", script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.parent.mkdir(parents=True, exist_ok=True)
    return cast(Path, module.write_tiny_gguf(path, 0, rerank=rerank))


def write_lab(tmp: Path, models: Path) -> tuple[Path, Path]:
    """Roster and fleet of two llama.cpp roles on one node: ``rerank`` on ``models``'
    ``rerank.gguf`` and ``chat`` on its ``chat.gguf``, neither with a ``reranking:`` key
    (the GGUF's pooling type says which is a reranker)."""
    roster = tmp / "roster.yaml"
    entries = [
        {"id": role, "role": "test", "name": role, "repo": f"local/{role}", "ram_gb": 0.2}
        | {"backend": "llama.cpp", "status": "live"}
        for role in ROLES
    ]
    roster.write_text(json.dumps({"roster": entries}))
    fleet = tmp / "fleet.yaml"
    sources = {role: {"path": str(models / f"{role}.gguf"), "ctx_size": 512} for role in ROLES}
    lab = {"nodes": [NODE], "models": sources, "model_roots": [str(models)]}
    fleet.write_text(json.dumps(lab))
    return roster, fleet


def _spec(role: str) -> InferenceSpec:
    return InferenceSpec(role=role, flavor=InferFlavor.LLAMACPP, model=role, memory=MemorySpec(1))


def _resolved(models: Path, fleet_models: dict[str, Any], role: str) -> ResolvedWeights:
    text = json.dumps({"nodes": [NODE], "models": fleet_models, "model_roots": [str(models)]})
    fleet = parse_fleet(text, base_dir=models)
    found = resolve_weights(_spec(role), models=fleet.models, model_roots=fleet.model_roots)
    assert found is not None
    return found


def _argv(source: ResolvedWeights) -> tuple[str, ...]:
    adapter = LlamaCppAdapter(server_binary=Path("/bin/true"))
    return adapter.launch(_spec("r"), source, host="127.0.0.1", port=1).argv


def test_the_gguf_or_the_fleet_entry_makes_a_reranker_launched_with_reranking_once(
    tmp_path: Path,
) -> None:
    rerank = tiny_gguf(tmp_path / "rerank.gguf", rerank=True)
    chat = tiny_gguf(tmp_path / "chat.gguf", rerank=False)
    cases = {
        "by-gguf": ({"path": str(rerank)}, True),
        "turned-off": ({"path": str(rerank), "reranking": False}, False),
        "by-entry": ({"path": str(chat), "reranking": True}, True),
        "chat": ({"path": str(chat)}, False),
        "by-flag": ({"path": str(chat), "extra_args": ["--reranking"]}, True),
        "both": ({"path": str(rerank), "reranking": True, "extra_args": ["--rerank"]}, True),
    }
    adapter = LlamaCppAdapter()
    for role, (entry, reranks) in cases.items():
        source = _resolved(tmp_path, {role: entry}, role)
        assert source.reranking is reranks, role
        argv = _argv(source)
        assert argv.count("--reranking") + argv.count("--rerank") == int(reranks), (role, argv)
        assert ("rerank" in adapter.dialects_for(source)) is reranks, role
        assert {"messages", "responses"} <= adapter.dialects_for(source)
    assert "rerank" not in adapter.dialects_for(None)
    # weights not on this machine (a node agent's): the fleet entry alone says
    remote = Path("/elsewhere/r.gguf")
    assert "rerank" in adapter.dialects_for(ModelSource(remote, reranking=True))
    assert "rerank" in adapter.dialects_for(ModelSource(remote, extra_args=("--rerank",)))
    assert "rerank" not in adapter.dialects_for(ModelSource(remote))


def test_rosterd_models_says_which_role_is_a_reranker(tmp_path: Path) -> None:
    tiny_gguf(tmp_path / "rerank.gguf", rerank=True)
    tiny_gguf(tmp_path / "chat.gguf", rerank=False)
    roster, fleet = write_lab(tmp_path, tmp_path)
    shown = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet), "--json"])
    assert shown.exit_code == 0, shown.output
    models = json.loads(shown.stdout)["models"]
    assert {role: m["reranker"] for role, m in models.items()} == {"rerank": True, "chat": False}


def test_a_fleet_file_rejects_a_reranking_that_is_not_a_boolean(tmp_path: Path) -> None:
    text = json.dumps({"nodes": [NODE], "models": {"r": {"path": "r.gguf", "reranking": "yes"}}})
    with pytest.raises(FleetError) as refused:
        parse_fleet(text, base_dir=tmp_path)
    assert "models.r.reranking" in str(refused.value)
    assert "expected true or false" in str(refused.value)


@pytest.mark.slow
async def test_a_reranker_role_answers_rerank_and_a_chat_role_is_refused_unloaded(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    models = tmp_path / "models"
    tiny_gguf(models / "rerank.gguf", rerank=True)
    tiny_gguf(models / "chat.gguf", rerank=False)
    roster, fleet = write_lab(tmp_path, models)
    options = UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
        grace_s=5.0,
    )
    async with (
        serving(options, stop_timeout_s=60) as up,
        httpx.AsyncClient(base_url=up.url, trust_env=False, timeout=60) as client,
    ):
        query = {"model": "rerank", "query": "a cat", "documents": DOCUMENTS}
        ranked = await client.post("/v1/rerank", json=query)
        assert ranked.status_code == 200, ranked.text
        results = ranked.json()["results"]
        assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
        assert all(isinstance(r["relevance_score"], float) for r in results)
        jina = await client.post("/rerank", json=query | {"top_n": 2})
        assert jina.status_code == 200, jina.text
        assert len(jina.json()["results"]) == 2

        refused = await client.post("/v1/rerank", json=query | {"model": "chat"})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "not_supported"
        assert "role 'chat'" in error["message"]
        assert "reranking: true" in error["message"]

        roles = (await client.get("/status")).json()["nodes"]["box"]["roles"]
        assert roles["chat"]["pid"] is None, roles["chat"]  # refused before any load
        assert roles["chat"]["phase"] != "ready"
        argv = psutil.Process(roles["rerank"]["pid"]).cmdline()
        assert argv.count("--reranking") == 1, argv
