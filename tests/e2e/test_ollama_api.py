"""Ollama's API through rosterd, used with the official ``ollama`` client on real llama-server
roles: the example's SmolLM2-135M-Instruct (chat) and a tiny random GGUF started with
``--embeddings`` (embed).

One ``rosterd up`` in this event loop (with an API key, as a lab exposing it would
run it) serves the whole sequence a client goes through: list, ps, chat plain and
streamed, generate, embed, load and unload by naming only the model, ``keep_alive: 0``
then ps, the 501 of ``pull``, errors in Ollama's envelope, and the metrics labels.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import pytest

from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.up import (
    MODELS,
    SMOLLM2,
    example_extra_args,
    llama_entry,
    prepare_example_models,
    serving,
    write_box_fleet,
    write_roster,
)

pytestmark = pytest.mark.slow

KEY = "ollama-test-key"
FEW_TOKENS = {"num_predict": 12, "temperature": 0.0}


def lab(tmp_path: Path) -> UpOptions:
    """A roster of ``chat`` (SmolLM2-135M-Instruct) and ``embedder`` (tiny-a with embeddings),
    no warm-up."""
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [
            llama_entry("chat", "SmolLM2-135M-Instruct", 0.5, 18431),
            llama_entry("embedder", "tiny-a", 0.1, 18432),
        ],
    )
    models: dict[str, dict[str, object]] = {
        "SmolLM2-135M-Instruct": {
            "path": str(SMOLLM2),
            "ctx_size": 1024,
            "extra_args": example_extra_args("SmolLM2-135M-Instruct"),
        },
        "tiny-a": {
            "path": str(MODELS / "tiny-a.gguf"),
            "extra_args": ["--embeddings", "--pooling", "mean"],
        },
    }
    fleet = write_box_fleet(tmp_path / "fleet.yaml", models)
    return UpOptions(
        roster_path=roster,
        fleet_path=fleet,
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
        api_keys=(KEY,),
    )


async def resident(client: ollama.AsyncClient) -> set[str]:
    return {m.model or "" for m in (await client.ps()).models}


async def test_the_ollama_client_lists_chats_generates_embeds_and_unloads(
    tmp_path: Path, llama_server_binary: Path
) -> None:
    async with serving(lab(tmp_path)) as up:
        client = ollama.AsyncClient(
            host=up.url, headers={"Authorization": f"Bearer {KEY}"}, trust_env=False
        )
        async with httpx.AsyncClient(base_url=up.url, trust_env=False) as http:
            version = await http.get("/api/version", headers={"Authorization": f"Bearer {KEY}"})
            assert version.status_code == 200
            assert version.json()["version"].count(".") == 2

            # The key applies as on the OpenAI paths; the error is in Ollama's envelope.
            refused = await http.get("/api/tags")
            assert refused.status_code == 401
            assert isinstance(refused.json()["error"], str)

        listed = await client.list()
        assert {m.model for m in listed.models} == {"chat:latest", "embedder:latest"}
        assert await resident(client) == set()

        reply = await client.chat(
            model="chat",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            options=FEW_TOKENS,
        )
        assert reply.done
        assert reply.done_reason in ("stop", "length")
        assert reply.message.role == "assistant"
        assert "Paris" in (reply.message.content or ""), reply
        assert reply.model == "chat"  # the name the client gave, as Ollama answers
        assert (reply.eval_count or 0) > 0
        assert (reply.total_duration or 0) > 0
        assert await resident(client) == {"chat:latest"}  # loaded on demand

        parts = [
            part
            async for part in await client.chat(
                model="SmolLM2-135M-Instruct:latest",  # the roster's model name, with Ollama's tag
                messages=[{"role": "user", "content": "Count to five."}],
                options=FEW_TOKENS,
                stream=True,
            )
        ]
        assert len(parts) > 3
        assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
        assert parts[-1].done_reason in ("stop", "length")
        assert (parts[-1].eval_count or 0) > 0
        assert sum(ch.isalnum() for p in parts for ch in p.message.content or "") >= 3

        generated = await client.generate(model="chat:latest", prompt="Hello", options=FEW_TOKENS)
        assert generated.done
        assert sum(ch.isalpha() for ch in generated.response or "") >= 3

        streamed = [
            p
            async for p in await client.generate(
                model="chat", prompt="Hi", options=FEW_TOKENS, stream=True
            )
        ]
        assert streamed[-1].done
        assert len(streamed) > 3

        embedded = await client.embed(model="embedder", input=["hello", "world"])
        assert len(embedded.embeddings) == 2
        assert len(embedded.embeddings[0]) == len(embedded.embeddings[1]) > 8
        old = await client.embeddings(model="embedder", prompt="hello")
        assert len(old.embedding) == len(embedded.embeddings[0])
        assert await resident(client) == {"chat:latest", "embedder:latest"}

        # keep_alive 0: the answer comes, and by then the role is gone from ps.
        last = await client.chat(
            model="chat",
            messages=[{"role": "user", "content": "Bye."}],
            options=FEW_TOKENS,
            keep_alive=0,
        )
        assert last.done
        assert await resident(client) == {"embedder:latest"}

        # Only the model: load it, and with keep_alive 0 unload it.
        loaded = await client.generate(model="chat")
        assert loaded.done_reason == "load"
        assert loaded.response == ""
        assert "chat:latest" in await resident(client)
        unloaded = await client.chat(model="embedder", messages=[], keep_alive=0)
        assert unloaded.done_reason == "unload"
        assert await resident(client) == {"chat:latest"}

        shown = await client.show("chat")
        assert shown.capabilities == ["completion"]

        with pytest.raises(ollama.ResponseError) as pulled:
            await client.pull("llama3.2")
        assert pulled.value.status_code == 501
        assert "roster" in pulled.value.error

        with pytest.raises(ollama.ResponseError) as unknown:
            await client.chat(model="nope", messages=[{"role": "user", "content": "Hi"}])
        assert unknown.value.status_code == 404
        assert "known models: chat, embedder" in unknown.value.error

        async with httpx.AsyncClient(base_url=up.url, trust_env=False) as http:
            metrics = await http.get("/metrics", headers={"Authorization": f"Bearer {KEY}"})
        for label in ("ollama_chat", "ollama_generate", "ollama_embed", "ollama_embeddings"):
            assert f'endpoint="{label}"' in metrics.text, label
        counted = [
            line
            for line in metrics.text.splitlines()
            if line.startswith("rosterd_requests_total") and 'endpoint="ollama_chat"' in line
        ]
        assert any('code="404"' in line for line in counted), json.dumps(counted)
        await client.close()  # type: ignore[no-untyped-call]
