"""Kept KV behind a proxy setting (issue 28): a KV save and restore talk to the role's own
server on 127.0.0.1 directly, whatever ``HTTP_PROXY``, ``http_proxy`` or ``ALL_PROXY`` say.

A lab machine often has a proxy set for the internet; it cannot reach a backend on
127.0.0.1, so a client that read it lost every slot save. A real llama-server on the
tiny GGUF through the local backends (the ``SupervisorBackends`` ``rosterd up`` uses),
with every proxy variable pointing at a port nothing listens on.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rosterd.backends.kv_keep import KvKeeper
from rosterd.backends.local import SupervisorBackends
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import Supervisor
from rosterd.weights import ResolvedWeights

#: A proxy nothing answers at (port 9, discard): a request sent through it fails at once.
DEAD_PROXY = "http://127.0.0.1:9"


async def test_a_kv_save_and_restore_ignore_a_dead_proxy_in_the_environment(
    supervisor: Supervisor,
    tmp_path: Path,
    tiny_gguf: Path,
    llama_server_binary: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ):
        monkeypatch.setenv(name, DEAD_PROXY)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    spec = InferenceSpec(role="tiny", flavor=InferFlavor.LLAMACPP, model="tiny")
    kv = KvKeeper(tmp_path / "state" / "kv")

    def weights(_spec: InferenceSpec) -> ResolvedWeights:
        return ResolvedWeights(path=tiny_gguf, ctx_size=512, parallel=1)

    backends = SupervisorBackends(
        supervisor, {"tiny": spec}, host="127.0.0.1", resolve_weights=weights, auto_ports=True,
        kv=kv,
    )  # fmt: skip
    endpoint = await backends.start("tiny")
    # The test's own client: this one must not read the proxy either.
    async with httpx.AsyncClient(base_url=endpoint.base_url, timeout=60, trust_env=False) as client:
        answer = await client.post("/completion", json={"prompt": "a b c d e f", "n_predict": 4})
        assert answer.status_code == 200
    await backends.stop("tiny")  # saves slot 0
    folder = tmp_path / "state" / "kv" / "tiny"
    record = json.loads((folder / "slot0.json").read_text())
    assert record["tokens"] > 0
    assert (folder / record["file"]).is_file()
    assert kv.totals["tiny"].saves == 1
    assert kv.totals["tiny"].failures == 0

    await backends.start("tiny")  # restores slot 0
    restore = kv.last_restore["tiny"]
    assert restore.outcome == "restored", restore.detail
    assert restore.tokens == record["tokens"]
    assert kv.totals["tiny"].restores == 1
    await backends.stop("tiny")
