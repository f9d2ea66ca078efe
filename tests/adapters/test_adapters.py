"""The adapters' pure builders: argv, environment, readiness and generation probes,
request rewrites, and how the llama-server binary is found. No processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rosterd.adapters import adapter_for
from rosterd.adapters.base import HttpProbe, Launch
from rosterd.adapters.llamacpp import (
    LLAMA_CPP_PYTHON_VERSION,
    LlamaCppAdapter,
    find_llama_server,
    llama_server_cache_path,
    slot_counters,
)
from rosterd.adapters.mlx_lm import MlxLmAdapter
from rosterd.adapters.ollama import OllamaAdapter
from rosterd.errors import AdapterError
from rosterd.fleet import ModelSource
from rosterd.spec import InferenceSpec, InferFlavor, MemorySpec
from rosterd.tokens import GB
from rosterd.weights import ResolvedWeights, WeightsSource

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path("/opt/llama/bin/llama-server")


def llama_spec(model: str | None = "gemma-3-270m") -> InferenceSpec:
    return InferenceSpec(
        role="chat-small",
        flavor=InferFlavor.LLAMACPP,
        model=model,
        memory=MemorySpec(weights_bytes=GB // 2),
    )


def test_llama_server_argv_and_readiness() -> None:
    source = ModelSource(
        path=Path("/models/gemma.gguf"), ctx_size=8192, parallel=2, extra_args=("-t", "4")
    )
    launch = LlamaCppAdapter(server_binary=SERVER).launch(
        llama_spec(), source, host="127.0.0.1", port=8301
    )
    assert launch.argv == (
        str(SERVER),
        "-m", "/models/gemma.gguf",
        "--host", "127.0.0.1",
        "--port", "8301",
        "-c", "8192",
        "-np", "2",
        "--alias", "gemma-3-270m",
        # the RAM prompt cache's small bound, and a sliding-window cache that restores
        "--cache-ram", "64",
        "--swa-full",
        "-t", "4",
    )  # fmt: skip
    kept_nothing = LlamaCppAdapter(server_binary=SERVER).launch(
        llama_spec(),
        ModelSource(path=Path("/m/g.gguf"), keep_kv=False, cache_ram_mb=512),
        host="127.0.0.1",
        port=8301,
    )
    assert kept_nothing.argv[-2:] == ("--cache-ram", "512")  # no --swa-full
    # The port opens before the model is loaded and answers 503 meanwhile.
    assert launch.readiness == HttpProbe(method="GET", path="/health")
    assert launch.served_model == "gemma-3-270m"
    assert launch.base_url == "http://127.0.0.1:8301"
    assert launch.weights_bytes == GB // 2  # from the spec when the source has no size


def test_llama_server_defaults_and_role_as_name() -> None:
    source = ResolvedWeights(path=Path("/m/t.gguf"), size_bytes=1234)
    launch = LlamaCppAdapter(server_binary=SERVER).launch(
        llama_spec(model=None), source, host="127.0.0.1", port=9000
    )
    argv = list(launch.argv)
    assert argv[argv.index("-c") + 1] == "4096"
    assert argv[argv.index("-np") + 1] == "1"
    assert argv[argv.index("--alias") + 1] == "chat-small"
    assert launch.weights_bytes == 1234


def test_llama_cpp_python_mode() -> None:
    adapter = LlamaCppAdapter(mode="llama-cpp-python", python="/venv/bin/python")
    launch = adapter.launch(
        llama_spec(),
        ResolvedWeights(path=Path("/m/g.gguf"), ctx_size=2048),
        host="127.0.0.1",
        port=8400,
    )
    assert launch.argv == (
        "/venv/bin/python", "-m", "llama_cpp.server",
        "--model", "/m/g.gguf",
        "--host", "127.0.0.1",
        "--port", "8400",
        "--n_ctx", "2048",
        "--model_alias", "gemma-3-270m",
    )  # fmt: skip
    # No /health there, and the port opens only after the load.
    assert launch.readiness == HttpProbe(method="GET", path="/v1/models")


@pytest.mark.parametrize(
    ("spec", "path", "message"),
    [
        (llama_spec(), Path("/m/model.safetensors"), "needs a .gguf file"),
        (llama_spec(model="a,b"), Path("/m/x.gguf"), "contains a comma"),
        (
            InferenceSpec(role="r", flavor=InferFlavor.MLX_LM, model="m"),
            Path("/m/x.gguf"),
            "is mlx_lm, not llamacpp",
        ),
    ],
)
def test_llama_launch_refuses_what_it_cannot_serve(
    spec: InferenceSpec, path: Path, message: str
) -> None:
    with pytest.raises(AdapterError, match=message):
        LlamaCppAdapter(server_binary=SERVER).launch(
            spec, ResolvedWeights(path=path), host="127.0.0.1", port=1
        )


def test_generation_probe_is_one_token_completion() -> None:
    probe = LlamaCppAdapter(server_binary=SERVER).generation_probe("gemma-3-270m")
    assert probe.method == "POST"
    assert probe.path == "/v1/completions"
    assert probe.json is not None
    assert probe.json["max_tokens"] == 1
    assert probe.json["model"] == "gemma-3-270m"
    assert probe.expect_json_key == "choices"


def test_rewrite_request_sets_the_served_name_and_copies() -> None:
    body: dict[str, object] = {"model": "chat-small", "messages": [], "stream": True}
    out = LlamaCppAdapter(server_binary=SERVER).rewrite_request(body, "gemma-3-270m")
    assert out == {"model": "gemma-3-270m", "messages": [], "stream": True}
    assert body["model"] == "chat-small"


def test_only_llama_server_tells_how_far_a_request_has_come() -> None:
    probe = LlamaCppAdapter().progress_probe
    assert probe is not None
    assert probe.path == "/slots"
    assert LlamaCppAdapter(mode="llama-cpp-python").progress_probe is None
    assert MlxLmAdapter().progress_probe is None
    assert OllamaAdapter().progress_probe is None
    # The shape of llama-server's /slots (fields it has beyond these are ignored).
    busy = [
        {"id": 0, "id_task": 7, "n_prompt_tokens_processed": 2048, "next_token": {"n_decoded": 0}},
        {"id": 1, "id_task": -1, "n_prompt_tokens_processed": 0, "next_token": {"n_decoded": 0}},
    ]
    assert slot_counters(busy) == (7, 2048, 0, -1, 0, 0)
    busy[0]["next_token"] = {"n_decoded": 3}
    assert slot_counters(busy) == (7, 2048, 3, -1, 0, 0)
    # This llama-server's shape: next_token is a list, and what it generated counts too
    # (read as an object only, a healthy long answer was cut as wedged).
    busy[0]["next_token"] = [{"n_decoded": 5, "has_next_token": True}]
    assert slot_counters(busy) == (7, 2048, 5, -1, 0, 0)
    for not_slots in ({"error": "no"}, ["x"]):
        with pytest.raises(ValueError, match="/slots answered"):
            slot_counters(not_slots)


def test_mlx_lm_launch_is_offline_and_ready_means_generating() -> None:
    spec = InferenceSpec(role="planner", flavor=InferFlavor.MLX_LM, model="Qwen3-8B-4bit")
    adapter = MlxLmAdapter(python="/venv/bin/python", hf_hub_cache="/srv/hf")
    launch = adapter.launch(
        spec,
        ResolvedWeights(path=Path("/srv/qwen3"), extra_args=("--max-tokens", "64")),
        host="127.0.0.1",
        port=8500,
    )
    assert launch.argv == (
        "/venv/bin/python", "-m", "mlx_lm", "server",
        "--model", "/srv/qwen3",
        "--host", "127.0.0.1",
        "--port", "8500",
        "--max-tokens", "64",
    )  # fmt: skip
    assert launch.env == {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "/srv/hf"}
    # /health answers before the model is loaded, so readiness is a generation.
    assert launch.readiness == adapter.generation_probe("/srv/qwen3")
    assert launch.served_model == "/srv/qwen3"
    assert adapter.rewrite_request({"model": "planner"}, launch.served_model) == {
        "model": "/srv/qwen3"
    }
    # SIGTERM gives Metal's wired memory back; a SIGKILL may not: a long grace, said why.
    assert launch.stop_grace_s is not None
    assert launch.stop_grace_s >= 30
    assert "reboot" in launch.sigkill_note


def test_mlx_lm_refuses_a_single_file() -> None:
    spec = InferenceSpec(role="planner", flavor=InferFlavor.MLX_LM)
    with pytest.raises(AdapterError, match="needs a model folder"):
        MlxLmAdapter().launch(
            spec, ResolvedWeights(path=Path("/m/x.gguf")), host="127.0.0.1", port=1
        )


def test_ollama_server_launch_and_probe() -> None:
    adapter = OllamaAdapter()
    launch = adapter.server_launch(host="127.0.0.1")
    assert launch.argv == ("ollama", "serve")
    assert launch.port == 11434
    assert launch.env == {"OLLAMA_HOST": "127.0.0.1:11434"}
    assert launch.readiness == HttpProbe(method="GET", path="/api/version")
    probe = adapter.generation_probe("qwen3:8b")
    assert probe.path == "/api/generate"
    assert probe.expect_json_key == "response"
    with pytest.raises(AdapterError, match="needs a model name"):
        adapter.launch(
            InferenceSpec(role="x", flavor=InferFlavor.OLLAMA), None, host="127.0.0.1", port=1
        )


@pytest.mark.parametrize("flavor", list(InferFlavor))
def test_adapter_for_every_flavor(flavor: InferFlavor) -> None:
    adapter = adapter_for(flavor)
    assert adapter.flavor is flavor
    assert (adapter.shared_server is not None) is (flavor is InferFlavor.OLLAMA)


def test_fleet_model_source_is_a_weights_source() -> None:
    assert isinstance(ModelSource(path=Path("/m/x.gguf")), WeightsSource)


def test_ipv6_base_url() -> None:
    launch = Launch(argv=("x",), host="::1", port=80, readiness=HttpProbe("GET", "/"),
                    served_model="m")  # fmt: skip
    assert launch.base_url == "http://[::1]:80"


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_llama_server_order(tmp_path: Path) -> None:
    override = executable(tmp_path / "custom" / "llama-server")
    cache_home = tmp_path / "cache"
    on_path = executable(tmp_path / "bin" / "llama-server")
    env = {"XDG_CACHE_HOME": str(cache_home), "PATH": str(on_path.parent)}
    assert find_llama_server(env) == on_path
    cached = executable(llama_server_cache_path(env))
    assert cached == (
        cache_home / "rosterd" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"
    )
    assert find_llama_server(env) == cached
    assert find_llama_server({**env, "ROSTERD_LLAMA_SERVER": str(override)}) == override


def test_find_llama_server_says_how_to_build_it(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": str(tmp_path)}
    with pytest.raises(AdapterError, match="run scripts/build-llama-server"):
        find_llama_server(env)
    with pytest.raises(AdapterError, match="not an executable file"):
        find_llama_server({**env, "ROSTERD_LLAMA_SERVER": str(tmp_path / "missing")})


def test_build_script_builds_the_pinned_version() -> None:
    script = (ROOT / "scripts" / "build-llama-server").read_text()
    match = re.search(r"LLAMA_CPP_PYTHON_VERSION:-([0-9.]+)\}", script)
    assert match is not None
    assert match.group(1) == LLAMA_CPP_PYTHON_VERSION
    assert "-DGGML_NATIVE=OFF" in script
