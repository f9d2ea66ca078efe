"""A role whose architecture cannot reuse a restored slot keeps no KV cache, and says why
before anything is saved (issue 31): a GGUF written under a hybrid architecture's name
(``scripts/make_tiny_gguf.py --hybrid lfm2``). ``rosterd models`` says so from the file
alone; under ``rosterd up`` the role is launched without ``--slot-save-path``, nothing is
written to its KV folder when it stops, and ``/status`` and ``rosterd ps`` say why.

llama-server cannot load that file (its recurrent layers' tensors are not written), so the
role is served by the fast stand-in for llama-server (``support/fake_llama_server.py``),
launched by rosterd's llama.cpp adapter as the real one is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil

from support.backends import pick_free_port
from support.gguf import write_gguf
from support.reliability import fake_llama_server_wrapper
from support.up import llama_entry, rosterd_argv, start_up, write_roster

WHY = "a hybrid model (lfm2): llama-server cannot reuse a restored slot"


def _rosterd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*rosterd_argv(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "250", "NO_COLOR": "1"},
    )


def test_a_hybrid_models_kv_is_not_kept_and_every_view_says_why(tmp_path: Path) -> None:
    gguf = write_gguf(tmp_path / "tiny-hybrid.gguf", hybrid="lfm2")
    roster = write_roster(
        tmp_path / "roster.yaml", [llama_entry("hybrid", "tiny-hybrid", 0.1, 18671)]
    )
    fleet = tmp_path / "fleet.yaml"
    node = {"name": "box", "memory_gb": 4, "reserved_gb": 1, "platform": "linux-x86_64"}
    models = {"tiny-hybrid": {"path": str(gguf)}}
    fleet.write_text(
        json.dumps({"nodes": [node], "models": models, "model_roots": [str(tmp_path)]})
    )

    listed = _rosterd("models", str(roster), "--fleet", str(fleet), "--json")
    assert listed.returncode == 0, listed.stderr
    kept = json.loads(listed.stdout)["models"]["hybrid"]["kv_kept"]
    assert kept["kept"] is False
    assert kept["why"].startswith(WHY)
    table = _rosterd("models", str(roster), "--fleet", str(fleet))
    assert table.returncode == 0, table.stderr
    assert "KV cache not kept across swaps: a hybrid model (lfm2)" in " ".join(table.stdout.split())

    wrapper = fake_llama_server_wrapper(tmp_path / "bin")
    up = start_up(
        [str(roster), "--fleet", str(fleet), "--no-warm-up"],
        tmp_path,
        pick_free_port(),
        env={"ROSTERD_LLAMA_SERVER": str(wrapper)},
    )
    try:
        loaded = httpx.post(up.url + "/rosterd/load/hybrid", timeout=60, trust_env=False)
        assert loaded.status_code == 200, loaded.text
        role = up.get("/status")["nodes"]["box"]["roles"]["hybrid"]
        assert role["kv_summary"] == "not kept"
        assert role["kv"]["not_kept"].startswith(WHY)
        argv = psutil.Process(role["pid"]).cmdline()
        assert "--slot-save-path" not in argv
        ps = _rosterd("ps", "--url", up.url)
        assert ps.returncode == 0, ps.stderr
        assert "hybrid: KV cache not kept across swaps: a hybrid model (lfm2)" in " ".join(
            ps.stdout.split()
        )
        unloaded = httpx.post(up.url + "/rosterd/unload/hybrid", timeout=60, trust_env=False)
        assert unloaded.status_code == 200, unloaded.text
        assert not list((tmp_path / "state" / "kv").glob("hybrid/*"))  # nothing saved
    finally:
        assert up.stop(signal.SIGINT) == 0
