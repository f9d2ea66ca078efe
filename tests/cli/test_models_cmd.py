"""``rosterd models``: every role's resolved weights and the estimate made from them."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rosterd.cli import _register, app
from support.up import (
    MODELS,
    llama_entry,
    prepare_example_models,
    write_box_fleet,
    write_roster,
)

_register()


def test_models_lists_weights_facts_and_the_estimate_in_parts(tmp_path: Path) -> None:
    prepare_example_models()
    roster = write_roster(
        tmp_path / "roster.yaml",
        [llama_entry("tiny", "tiny-a", 0.1, 18981), llama_entry("lost", "nowhere", 0.2, 18982)],
    )
    fleet = write_box_fleet(
        tmp_path / "fleet.yaml",
        {"tiny-a": {"path": str(MODELS / "tiny-a.gguf"), "ctx_size": 512, "parallel": 2}},
    )
    result = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet), "--json"])
    assert result.exit_code == 0, result.output
    models = json.loads(result.stdout)["models"]
    tiny = models["tiny"]
    assert tiny["weights"]["path"] == str(MODELS / "tiny-a.gguf")
    assert tiny["weights"]["format"] == "gguf"
    assert tiny["weights"]["architecture"] == "llama"
    assert tiny["weights"]["quantization"] == "F32"
    assert (tiny["ctx_size"], tiny["parallel"]) == (512, 2)
    parts = tiny["estimate"]
    assert (
        parts["total_bytes"] == parts["weights_bytes"] + parts["kv_bytes"] + parts["overhead_bytes"]
    )
    assert models["lost"]["estimate"] is None
    assert "no weights found" in models["lost"]["estimate_note"]
    table = CliRunner().invoke(app, ["models", str(roster), "--fleet", str(fleet)])
    assert table.exit_code == 0, table.output
    assert "KV cache" in table.stdout
