"""Weights resolution: the fleet's models: map, then the Hugging Face cache (offline),
else a clear error; paths never leave the model roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rosterd.errors import WeightsError
from rosterd.fleet import Fleet, ModelSource
from rosterd.fleet.reader import load_fleet
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import ResolvedWeights, resolve_for_fleet, resolve_weights

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def llama(role: str = "chat-small", model: str | None = "gemma-3-270m") -> InferenceSpec:
    return InferenceSpec(role=role, flavor=InferFlavor.LLAMACPP, model=model)


def touch(path: Path, size: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    return path


def hf_cache_repo(cache: Path, repo: str, files: dict[str, int]) -> Path:
    """A Hugging Face hub cache entry laid out as huggingface_hub writes it (blobs + symlinks)."""
    entry = cache / ("models--" + repo.replace("/", "--"))
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(COMMIT)
    snapshot = entry / "snapshots" / COMMIT
    for name, size in files.items():
        blob = touch(entry / "blobs" / f"blob-{name.replace('/', '-')}", size)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_models_map_by_role_wins_over_model_name(tmp_path: Path) -> None:
    by_role = touch(tmp_path / "role.gguf", 100)
    by_name = touch(tmp_path / "name.gguf", 50)
    models = {
        "gemma-3-270m": ModelSource(path=by_name),
        "chat-small": ModelSource(path=by_role, ctx_size=2048, parallel=2, extra_args=("-t", "2")),
    }
    got = resolve_weights(llama(), models=models, model_roots=[tmp_path])
    assert got == ResolvedWeights(
        path=by_role, ctx_size=2048, parallel=2, extra_args=("-t", "2"), size_bytes=100
    )
    only_name = resolve_weights(
        llama(), models={"gemma-3-270m": models["gemma-3-270m"]}, model_roots=[tmp_path]
    )
    assert only_name is not None
    assert only_name.path == by_name


def test_path_outside_the_model_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "models"
    root.mkdir()
    outside = touch(tmp_path / "elsewhere" / "x.gguf")
    with pytest.raises(WeightsError, match="outside the model roots"):
        resolve_weights(llama(), models={"chat-small": ModelSource(path=outside)},
                        model_roots=[root])  # fmt: skip
    # A symlink inside the root that points outside is judged by where it really goes.
    (root / "sneaky.gguf").symlink_to(outside)
    with pytest.raises(WeightsError, match="really"):
        resolve_weights(llama(), models={"chat-small": ModelSource(path=root / "sneaky.gguf")},
                        model_roots=[root])  # fmt: skip


def test_missing_or_wrong_kind_of_weights(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match="does not exist"):
        resolve_weights(llama(), models={"chat-small": ModelSource(path=tmp_path / "no.gguf")},
                        model_roots=[tmp_path])  # fmt: skip
    bad = touch(tmp_path / "model.bin")
    with pytest.raises(WeightsError, match=r"not a \.gguf file"):
        resolve_weights(llama(), models={"chat-small": ModelSource(path=bad)},
                        model_roots=[tmp_path])  # fmt: skip
    mlx = InferenceSpec(role="planner", flavor=InferFlavor.MLX_LM)
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match=r"no config\.json"):
        resolve_weights(mlx, models={"planner": ModelSource(path=tmp_path / "empty")},
                        model_roots=[tmp_path])  # fmt: skip


def test_folder_with_gguf_files(tmp_path: Path) -> None:
    folder = tmp_path / "gemma"
    touch(folder / "gemma-3-270m-Q4_K_M.gguf")
    got = resolve_weights(llama(), models={"chat-small": ModelSource(path=folder)},
                          model_roots=[tmp_path])  # fmt: skip
    assert got is not None
    assert got.path.name == "gemma-3-270m-Q4_K_M.gguf"
    touch(folder / "other-Q8_0.gguf")
    got = resolve_weights(llama(), models={"chat-small": ModelSource(path=folder)},
                          model_roots=[tmp_path])  # fmt: skip
    assert got is not None
    assert got.path.name == "gemma-3-270m-Q4_K_M.gguf"  # the one named like the model
    with pytest.raises(WeightsError, match=r"several \.gguf files"):
        resolve_weights(llama(model="tiny"), models={"chat-small": ModelSource(path=folder)},
                        model_roots=[tmp_path])  # fmt: skip


def test_hugging_face_cache_offline(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    hf_cache_repo(cache, "google/gemma-3-270m-GGUF", {"gemma-3-270m-Q4_K_M.gguf": 300})
    got = resolve_weights(
        llama(), models={}, model_roots=[], repo="google/gemma-3-270m-GGUF", hf_cache_dir=cache
    )
    assert got is not None
    assert got.path.name == "gemma-3-270m-Q4_K_M.gguf"
    assert got.path.is_relative_to(cache)
    assert got.path.resolve().name.startswith("blob-")  # the symlink is served, not its blob
    assert got.size_bytes == 300

    snapshot = hf_cache_repo(
        cache, "mlx-community/Qwen3-8B-4bit", {"config.json": 2, "model.safetensors": 1000}
    )
    mlx = InferenceSpec(
        role="planner", flavor=InferFlavor.MLX_LM, model="mlx-community/Qwen3-8B-4bit"
    )
    got = resolve_weights(mlx, models={}, model_roots=[], hf_cache_dir=cache)
    assert got is not None
    assert got.path == snapshot
    assert got.size_bytes == 1002


def test_nothing_found_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as info:
        resolve_weights(
            llama(), models={}, model_roots=[tmp_path], repo="google/absent", hf_cache_dir=tmp_path
        )
    message = str(info.value)
    assert "'chat-small'" in message
    assert "'gemma-3-270m'" in message
    assert "google/absent" in message
    assert str(tmp_path) in message
    assert "never downloads" in message


def test_ollama_needs_no_weights(tmp_path: Path) -> None:
    spec = InferenceSpec(role="coder", flavor=InferFlavor.OLLAMA, model="qwen3:8b")
    assert resolve_weights(spec, models={}, model_roots=[]) is None


def test_from_a_fleet_file(tmp_path: Path) -> None:
    touch(tmp_path / "models" / "gemma.gguf", 42)
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "nodes:\n"
        "  - name: here\n"
        "    memory_gb: 8\n"
        "    platform: linux-x86_64\n"
        "models:\n"
        "  gemma-3-270m: {path: models/gemma.gguf, ctx_size: 1024}\n"
        "model_roots: [models]\n"
    )
    fleet: Fleet = load_fleet(fleet_file)
    got = resolve_for_fleet(llama(), fleet)
    assert got is not None
    assert got.path.resolve() == (tmp_path / "models" / "gemma.gguf").resolve()
    assert got.ctx_size == 1024
    assert got.size_bytes == 42


def _aliased_roster(tmp_path: Path) -> Path:
    """Three llama.cpp entries the import makes one role and two aliases of it."""
    roster = tmp_path / "roster.yaml"
    entry = "role: chat, ram_gb: 0.5, backend: llama.cpp, status: live"
    roster.write_text(
        f"roster:\n  - {{id: a, {entry}}}\n  - {{id: b, {entry}}}\n  - {{id: c, {entry}}}\n"
    )
    return roster


def test_separate_aliases_follows_the_fleets_files(tmp_path: Path) -> None:
    from rosterd.roster.importer import load_roster
    from rosterd.weights import separate_aliases

    roster = load_roster(_aliased_roster(tmp_path), None)
    assert roster.aliases == {"b": "a", "c": "a"}
    one, two = touch(tmp_path / "one.gguf"), touch(tmp_path / "two.gguf")
    nodes = Fleet(nodes=(), model_roots=(tmp_path,))

    # No entry of its own, or the same entry as its target: still an alias.
    same = Fleet(nodes=(), models={"a": ModelSource(one), "b": ModelSource(one)})
    assert separate_aliases(roster, nodes) is roster
    assert separate_aliases(roster, same) is roster

    # b on other weights is served on its own; c, on b's file, becomes b's alias.
    split = Fleet(
        nodes=(), models={"a": ModelSource(one), "b": ModelSource(two), "c": ModelSource(two)}
    )
    out = separate_aliases(roster, split)
    assert [s.spec.role for s in out.specs] == ["a", "b"]
    assert out.aliases == {"c": "b"}
    assert [i for i, _ in out.skipped] == ["c"]
    (warning,) = out.warnings
    assert f"b: {two}; a: {one}" in warning
    assert "as a role of its own" in warning

    # The same file with other settings is another server too, and says so.
    tuned = Fleet(nodes=(), models={"a": ModelSource(one), "b": ModelSource(one, ctx_size=512)})
    (said,) = separate_aliases(roster, tuned).warnings
    assert "the same file with other settings" in said
