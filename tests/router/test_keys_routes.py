"""Keys at the router: every route of ``/openapi.json`` with a key of each scope, a wrong key
and none; a ``use`` key's model list, as the official ``openai``, ``anthropic`` and
``ollama`` clients see it; operator actions logged by key name; a reload of the keys.

The router runs for real (uvicorn, the scheduler, the proxy) over a stand-in backend that
answers every inference path with one generic body (no model is needed to judge who may
call what)."""

from __future__ import annotations

import logging
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from rosterd.keys import Scope
from rosterd.router.auth import scope_for
from support.keys_lab import (
    BODY,
    KEYS,
    MASTER,
    NOT_200,
    OPEN,
    lab,
    ring,
)


def concrete(path: str) -> str:
    return (
        path.replace("{role}", "chat")
        .replace("{model}", "chat")
        .replace("{digest}", "sha256:00")
        .replace("{path}", "page.css")
    )


async def call(
    client: httpx.AsyncClient, method: str, path: str, token: str | None, model: str = "chat"
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {**BODY, "model": model}
    kwargs: dict[str, Any] = {"headers": headers}
    if method in ("post", "delete"):
        kwargs["json"] = body
    async with client.stream(method.upper(), concrete(path), **kwargs) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response  # the page's endless stream: its status is the answer
        await response.aread()
        return response


def refusal_shape(path: str, response: httpx.Response) -> str:
    """The refusal's error type in the path's envelope (asserting the envelope)."""
    body = response.json()
    if path.startswith("/api/"):
        assert set(body) == {"error"}, body
        assert isinstance(body["error"], str)
        return "ollama"
    if path.startswith("/v1/messages"):
        assert body["type"] == "error", body
        return str(body["error"]["type"])
    return str(body["error"]["code"])


async def test_every_route_answers_each_scope_as_documented(tmp_path: Any) -> None:
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        document = (
            await client.get("/openapi.json", headers={"Authorization": f"Bearer {MASTER}"})
        ).json()
        operations = sorted(
            (path, method) for path, ops in document["paths"].items() for method in ops
        )
        assert len(operations) > 30
        seen_scopes = set()
        for path, method in operations:
            master = await call(client, method, path, MASTER)
            expected = 501 if path in NOT_200 else 200
            assert master.status_code == expected, (path, method, master.text[:300])
            if path in OPEN:
                for token in (None, "wrong", *(t for t, _, _ in KEYS.values())):
                    assert (await call(client, method, path, token)).status_code == 200, path
                continue
            for token in (None, "rk-wrong"):
                refused = await call(client, method, path, token)
                assert refused.status_code == 401, (path, method, token, refused.text)
                kind = refusal_shape(path, refused)
                assert kind in ("ollama", "authentication_error", "invalid_api_key"), kind
                assert "rk-wrong" not in refused.text
            needed = scope_for(path)
            seen_scopes.add(needed)
            for name, (token, scopes, _models) in KEYS.items():
                answer = await call(client, method, path, token)
                if needed is None or needed in scopes:
                    assert answer.status_code == expected, (path, method, name, answer.text[:300])
                else:
                    assert answer.status_code == 403, (path, method, name, answer.text[:300])
                    kind = refusal_shape(path, answer)
                    assert kind in ("ollama", "permission_error", "permission_denied"), kind
                    if kind != "ollama":
                        assert needed.value in answer.text
                    assert token not in answer.text
        assert seen_scopes == {Scope.USE, Scope.WATCH, Scope.OPERATE, None}


async def test_a_model_outside_the_key_list_is_an_unknown_model(tmp_path: Any) -> None:
    user = KEYS["user"][0]
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        document = (
            await client.get("/openapi.json", headers={"Authorization": f"Bearer {user}"})
        ).json()
        with_model = [
            (path, method)
            for path, ops in document["paths"].items()
            for method in ops
            if scope_for(path) is Scope.USE
            and path not in NOT_200
            and "{" not in path
            and method == "post"
        ]
        assert len(with_model) >= 12
        for path, method in with_model:
            for hidden in ("secret", "secret-m"):
                hidden_answer = await call(client, method, path, user, model=hidden)
                unknown = await call(client, method, path, user, model="nope-x")
                assert hidden_answer.status_code == unknown.status_code == 404, (
                    path,
                    hidden_answer.text,
                )
                # The same words, the name aside: nothing says the model exists.
                assert hidden_answer.text.replace(hidden, "N") == unknown.text.replace(
                    "nope-x", "N"
                )
                assert "secret" not in hidden_answer.text.replace(hidden, "")
            master = await call(client, method, path, MASTER, model="secret")
            assert master.status_code == 200, (path, master.text)
        retrieved = await call(client, "get", "/v1/models/secret", user)
        assert retrieved.status_code == 404
        listed = (
            await client.get("/v1/models", headers={"Authorization": f"Bearer {user}"})
        ).json()
        assert [m["id"] for m in listed["data"]] == ["chat"]
        tags = (await client.get("/api/tags", headers={"Authorization": f"Bearer {user}"})).json()
        assert [m["name"] for m in tags["models"]] == ["chat:latest"]
        every = (
            await client.get("/v1/models", headers={"Authorization": f"Bearer {MASTER}"})
        ).json()
        assert [m["id"] for m in every["data"]] == ["chat", "secret"]
        # The page's data (/status, as its stream sends it) lists the key's roles only.
        looker: dict[str, tuple[str, frozenset[Scope], tuple[str, ...]]] = {
            "user": ("rk-user", frozenset({Scope.USE, Scope.WATCH}), ("chat",))
        }
        up.keys.replace(ring(looker))
        status = (await client.get("/status", headers={"Authorization": f"Bearer {user}"})).json()
        assert list(status["nodes"]["n1"]["roles"]) == ["chat"]
        everything = {"Authorization": f"Bearer {MASTER}"}
        status = (await client.get("/status", headers=everything)).json()
        assert list(status["nodes"]["n1"]["roles"]) == ["chat", "secret"]


async def test_the_official_clients_see_only_their_key_models(tmp_path: Any) -> None:
    user = KEYS["user"][0]
    async with lab(tmp_path) as up:
        oa = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=user, max_retries=0)
        assert [m.id async for m in oa.models.list()] == ["chat"]
        done = await oa.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert done.choices[0].message.content == "ok"
        with pytest.raises(openai.NotFoundError):
            await oa.chat.completions.create(
                model="secret", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        with pytest.raises(openai.PermissionDeniedError):
            await oa.with_options(api_key=KEYS["watcher"][0]).models.list()
        with pytest.raises(openai.AuthenticationError):
            await oa.with_options(api_key="rk-wrong").models.list()
        await oa.close()

        an = anthropic.AsyncAnthropic(base_url=up.url, api_key=user, max_retries=0)
        with pytest.raises(anthropic.NotFoundError):
            await an.messages.create(
                model="secret", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(anthropic.PermissionDeniedError):
            await an.with_options(api_key=KEYS["ops"][0]).messages.create(
                model="chat", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(anthropic.AuthenticationError):
            await an.with_options(api_key="rk-wrong").messages.create(
                model="chat", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        await an.close()

        ol = ollama.AsyncClient(host=up.url, headers={"Authorization": f"Bearer {user}"})
        assert [m.model for m in (await ol.list()).models] == ["chat:latest"]
        with pytest.raises(ollama.ResponseError) as caught:
            await ol.chat(
                model="secret", messages=[{"role": "user", "content": "hi"}], stream=False
            )
        assert caught.value.status_code == 404
        assert "secret" not in caught.value.error.replace("'secret'", "")
        everyone = ollama.AsyncClient(host=up.url, headers={"Authorization": f"Bearer {MASTER}"})
        assert {m.model for m in (await everyone.list()).models} == {"chat:latest", "secret:latest"}
        await ol.close()  # type: ignore[no-untyped-call]
        await everyone.close()  # type: ignore[no-untyped-call]


async def test_operator_actions_are_logged_by_key_name_never_by_key(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ops = KEYS["ops"][0]
    caplog.set_level(logging.INFO, logger="rosterd")
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        headers = {"Authorization": f"Bearer {ops}"}
        assert (await client.post("/rosterd/load/chat", headers=headers)).status_code == 200
        assert (await client.post("/rosterd/unload/chat", headers=headers)).status_code == 200
        assert (await client.post("/rosterd/reload?force=true", headers=headers)).status_code == 200
        master = {"Authorization": f"Bearer {MASTER}"}
        assert (await client.post("/rosterd/unload/chat", headers=master)).status_code == 200
    said = [r.getMessage() for r in caplog.records if r.name == "rosterd.access"]
    assert said == [
        "operator action POST /rosterd/load/chat by key 'ops': 200",
        "operator action POST /rosterd/unload/chat by key 'ops': 200",
        "operator action POST /rosterd/reload?force=true by key 'ops': 200",
        "operator action POST /rosterd/unload/chat by key '--api-key': 200",
    ]
    every_line = "\n".join(r.getMessage() for r in caplog.records)
    for token in (ops, MASTER, *(t for t, _, _ in KEYS.values())):
        assert token not in every_line


async def test_new_keys_apply_to_the_next_request(tmp_path: Any) -> None:
    async with lab(tmp_path) as up, httpx.AsyncClient(base_url=up.url, timeout=30) as client:
        watcher = {"Authorization": f"Bearer {KEYS['watcher'][0]}"}
        assert (await client.get("/status", headers=watcher)).status_code == 200
        up.keys.replace(ring({"user": KEYS["user"]}))
        assert (await client.get("/status", headers=watcher)).status_code == 401
        user = {"Authorization": f"Bearer {KEYS['user'][0]}"}
        assert (await client.get("/v1/models", headers=user)).status_code == 200
