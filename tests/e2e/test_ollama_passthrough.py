"""Ollama's API passed through to an ``ollama`` role's own server, used with the official
``ollama`` client.

Ollama cannot run on the test machine, so the role's server is the FAKE ollama of
``tests/support/fake_ollama.py``, which stands in for ``ollama serve``: it follows Ollama's
documented API, and its chat reply says which model and ``keep_alive`` it was sent. A
translation to the OpenAI routes would fail there (the fake has none), so every answer
below shows the request went through on Ollama's own path.
"""

from __future__ import annotations

import os
from pathlib import Path

import ollama
import pytest

from rosterd.up.runtime import UpOptions
from support.backends import pick_free_port
from support.ollama import fake_ollama_binary
from support.up import llama_entry, serving, write_box_fleet, write_roster

#: What the fake's chat reply says for the role's tag: rosterd sent the tag and asked the
#: server to keep the model (its scheduler decides when it leaves memory).
REPLY = "fake ollama answers llama3.2:1b (keep_alive -1)"


async def test_an_ollama_role_gets_the_ollama_requests_as_they_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bin").mkdir()
    binary = fake_ollama_binary(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_OLLAMA_MODELS", "llama3.2:1b=1300000000")
    entry = {**llama_entry("general", "llama3.2:1b", 1.5, 11434), "backend": "ollama"}
    options = UpOptions(
        roster_path=write_roster(tmp_path / "roster.yaml", [entry]),
        fleet_path=write_box_fleet(tmp_path / "fleet.yaml", {}),
        port=pick_free_port(),
        state_dir=tmp_path / "state",
        auto_backend_ports=True,
        warm_up=False,
    )
    async with serving(options) as up:
        client = ollama.AsyncClient(host=up.url, trust_env=False)
        hi = [{"role": "user", "content": "Hi"}]

        reply = await client.chat(model="general:latest", messages=hi)
        assert reply.message.content == REPLY
        assert reply.model == "llama3.2:1b"  # the server's own answer, unchanged

        parts = [p async for p in await client.chat(model="general", messages=hi, stream=True)]
        assert "".join(p.message.content or "" for p in parts).strip() == REPLY
        assert parts[-1].done
        assert parts[-1].eval_count == 2

        embedded = await client.embed(model="general", input=["a", "b"])
        assert embedded.embeddings == [[0.5, 0.25, 0.125]] * 2
        assert [m.model for m in (await client.ps()).models] == ["general:latest"]

        await client.chat(model="general", messages=hi, keep_alive=0)
        assert (await client.ps()).models == []  # rosterd unloaded it after the answer
        await client.close()  # type: ignore[no-untyped-call]
