"""The kept KV files themselves (issue 20): a save whose record no longer matches the run
is refused with one line naming the difference and removed, a slot saved while idle is
not written again by the stop (issue 31), and the disk budget prunes the least recently
used first.

The mismatch and the idle save run a real llama-server on the tiny GGUF through the local
backends (the same ``SupervisorBackends`` ``rosterd up`` uses); the budget needs no
server: it reads only the records.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

import httpx
import pytest

from rosterd.backends.kv_keep import KvKeeper
from rosterd.backends.local import SupervisorBackends
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.supervisor import Supervisor
from rosterd.weights import ResolvedWeights

if TYPE_CHECKING:
    from rosterd.adapters.base import Launch, SlotKeeping


async def generate(
    backends: SupervisorBackends, base_url: str, prompt: str = "a b c d e f"
) -> None:
    """A request on the role ``tiny`` as the node loop grants it: the lease marks its slots
    changed (``kv_changing``), then the backend generates."""
    backends.kv_changing("tiny")
    async with httpx.AsyncClient(base_url=base_url, timeout=60, trust_env=False) as client:
        answer = await client.post("/completion", json={"prompt": prompt, "n_predict": 4})
        assert answer.status_code == 200


async def test_a_save_of_other_settings_is_refused_named_and_removed(
    supervisor: Supervisor,
    tmp_path: Path,
    tiny_gguf: Path,
    llama_server_binary: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = InferenceSpec(role="tiny", flavor=InferFlavor.LLAMACPP, model="tiny")
    kv = KvKeeper(tmp_path / "state" / "kv")
    ctx = {"now": 512}

    def weights(_spec: InferenceSpec) -> ResolvedWeights:
        return ResolvedWeights(path=tiny_gguf, ctx_size=ctx["now"], parallel=1)

    backends = SupervisorBackends(
        supervisor, {"tiny": spec}, host="127.0.0.1", resolve_weights=weights, auto_ports=True,
        kv=kv,
    )  # fmt: skip
    endpoint = await backends.start("tiny")
    await generate(backends, endpoint.base_url)
    await backends.stop("tiny")
    folder = tmp_path / "state" / "kv" / "tiny"
    record = json.loads((folder / "slot0.json").read_text())
    assert record["identity"]["ctx"] == "512"
    assert (folder / record["file"]).is_file()

    ctx["now"] = 1024
    with caplog.at_level(logging.INFO, logger="rosterd.kv"):
        await backends.start("tiny")
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert refused == [
        "role tiny: kept KV of slot 0 refused: ctx was '512', is now '1024'; removed"
    ]
    assert not (folder / "slot0.json").exists()
    assert not (folder / record["file"]).exists()
    assert kv.last_restore["tiny"].outcome == "refused"
    assert kv.totals["tiny"].refusals == 1
    await backends.stop("tiny")


async def test_a_slot_saved_while_idle_is_not_written_again_by_the_stop(
    supervisor: Supervisor, tmp_path: Path, tiny_gguf: Path, llama_server_binary: Path
) -> None:
    """The idle save (``save_kv``) writes the slot; a stop with no request since writes
    nothing (the eviction only stops the process); a request since makes the stop save."""
    spec = InferenceSpec(role="tiny", flavor=InferFlavor.LLAMACPP, model="tiny")
    kv = KvKeeper(tmp_path / "state" / "kv")

    def weights(_spec: InferenceSpec) -> ResolvedWeights:
        return ResolvedWeights(path=tiny_gguf, ctx_size=512, parallel=1)

    backends = SupervisorBackends(
        supervisor, {"tiny": spec}, host="127.0.0.1", resolve_weights=weights, auto_ports=True,
        kv=kv,
    )  # fmt: skip
    folder = tmp_path / "state" / "kv" / "tiny"
    endpoint = await backends.start("tiny")
    await generate(backends, endpoint.base_url)
    await backends.save_kv("tiny")
    idle = json.loads((folder / "slot0.json").read_text())
    await backends.save_kv("tiny")  # nothing ran since: nothing written
    await backends.stop("tiny")
    assert json.loads((folder / "slot0.json").read_text()) == idle
    assert kv.totals["tiny"].saves == 1
    assert sorted(p.name for p in folder.glob("*.bin")) == [idle["file"]]

    endpoint = await backends.start("tiny")  # restores the idle save
    assert kv.last_restore["tiny"].outcome == "restored"
    await generate(backends, endpoint.base_url, "a b c d e f g h i j k l")
    await backends.save_kv("tiny")
    backends.kv_changing("tiny")  # a request granted after the idle save, then the stop
    await backends.stop("tiny")  # saves what changed
    stopped = json.loads((folder / "slot0.json").read_text())
    assert kv.totals["tiny"].saves == 3
    assert stopped["file"] != idle["file"]
    assert stopped["tokens"] > idle["tokens"]
    assert sorted(p.name for p in folder.glob("*.bin")) == [stopped["file"]]


def test_the_disk_budget_prunes_the_least_recently_used_first(tmp_path: Path) -> None:
    kv = KvKeeper(tmp_path / "kv", disk_budget_bytes=2500)
    for role, used_at in (("old", 100.0), ("mid", 200.0), ("new", 300.0)):
        folder = kv.folder(role)
        (folder / "slot0-1.bin").write_bytes(b"x" * 1000)
        (folder / "slot0.json").write_text(
            json.dumps({"version": 1, "file": "slot0-1.bin", "tokens": 10,
                        "file_bytes": 1000, "saved_at": used_at, "used_at": used_at})
        )  # fmt: skip
    assert kv.prune() == ["old/slot0-1.bin"]
    assert kv.kept("old").file_bytes == 0
    assert not (tmp_path / "kv" / "old" / "slot0-1.bin").exists()
    assert (kv.kept("mid").tokens, kv.kept("new").file_bytes) == (10, 1000)


async def test_a_refused_or_unanswered_slot_call_is_a_slot_file_error() -> None:
    """llama-server's refusal (its error body) and a server that does not answer both raise
    ``SlotFileError``, an ``AdapterError``, with the server's own words where it gave any."""
    from rosterd.adapters.llamacpp_slots import LlamaServerSlots
    from rosterd.errors import AdapterError, SlotFileError

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "failed to restore slot"}})

    slots = LlamaServerSlots()
    async with httpx.AsyncClient(
        base_url="http://127.0.0.1:1", transport=httpx.MockTransport(refuse)
    ) as client:
        with pytest.raises(SlotFileError, match=r"refused to restore .*failed to restore slot"):
            await slots.restore(client, 0, "slot0.bin", timeout_s=5.0)
    async with httpx.AsyncClient(base_url="http://127.0.0.1:1", trust_env=False) as client:
        with pytest.raises(SlotFileError, match="did not answer") as raised:
            await slots.save(client, 0, "slot0.bin", timeout_s=5.0)
    assert isinstance(raised.value, AdapterError)


class _NoProps:
    """A slot keeper whose server has no ``/props`` (a stand-in, an older build): its
    version cannot be read, as llama-server's keeper says of a 404."""

    def identity(self, launch: object) -> dict[str, str]:
        return {"slots": "1"}

    async def version(self, client: httpx.AsyncClient, *, timeout_s: float) -> str:
        from rosterd.errors import SlotFileError

        raise SlotFileError("llama-server refused to report its version (GET /props: HTTP 404)")


async def test_a_backend_without_props_is_not_a_warning_on_every_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each load of a backend without ``/props`` once logged a warning; now its restore is
    skipped without a word but one debug line per role, and the reason is a sentence."""
    from rosterd.adapters.llamacpp_slots import LlamaServerSlots
    from rosterd.errors import SlotFileError

    def not_found(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="Not Found")

    async with httpx.AsyncClient(
        base_url="http://127.0.0.1:1", transport=httpx.MockTransport(not_found)
    ) as client:
        with pytest.raises(
            SlotFileError, match=r"refused to report its version \(GET /props: HTTP 404"
        ):
            await LlamaServerSlots().version(client, timeout_s=5.0)

    keeper = KvKeeper(tmp_path / "kv")
    caplog.set_level(logging.DEBUG, logger="rosterd")
    for _ in range(3):
        result = await keeper.started(
            "tiny",
            cast("SlotKeeping", _NoProps()),
            cast("Launch", object()),
            "http://127.0.0.1:1",
            tmp_path / "w.gguf",
        )
        assert result.outcome == "failed"
    said = [r for r in caplog.records if "no restore" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]
