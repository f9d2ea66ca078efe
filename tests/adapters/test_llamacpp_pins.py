"""The flags that pin a role's device and offload on llama-server (``--device``, ``-ngl``,
``--fit off``, and ``-lv 4`` so that its log says what it allocated there), and that a node
without devices gets none of them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rosterd.adapters.llamacpp import LlamaCppAdapter, help_lists_fit, pinned_args
from rosterd.devices.listing import parse_list_devices
from rosterd.spec import InferenceSpec, InferFlavor
from rosterd.weights import ResolvedWeights


def test_a_role_on_a_gpu_is_pinned_to_it_with_every_layer_and_fit_off() -> None:
    # -lv 4: such a build logs what it allocates on the device at trace level only, and
    # rosterd reads it from the log (rosterd.devices.load_buffers).
    assert pinned_args("CUDA0", None, fit_flag=True) == (
        "--device",
        "CUDA0",
        "-ngl",
        "999",
        "--fit",
        "off",
        "-lv",
        "4",
    )


def test_a_partial_offload_pins_its_layer_count() -> None:
    assert pinned_args("CUDA1", 21, fit_flag=True)[:4] == ("--device", "CUDA1", "-ngl", "21")


def test_a_cpu_role_on_a_node_with_devices_touches_no_gpu() -> None:
    # `--device none` keeps llama-server off every GPU (llama.cpp PR #10497), so it does
    # not take a CUDA context on each of them.
    assert pinned_args(None, None, fit_flag=True) == (
        "--device",
        "none",
        "-ngl",
        "0",
        "--fit",
        "off",
    )


def test_a_build_without_fit_gets_no_fit_flag() -> None:
    assert pinned_args("CUDA0", None, fit_flag=False) == ("--device", "CUDA0", "-ngl", "999")
    assert help_lists_fit("-fit,   --fit [on|off]   whether to adjust unset arguments to fit\n")
    assert not help_lists_fit("-fitt,  --fit-target MiB0,MiB1   target margin per device\n")


def _spec() -> InferenceSpec:
    return InferenceSpec(role="chat", flavor=InferFlavor.LLAMACPP, model="chat")


def test_the_pins_come_last_so_rosterds_decision_wins_over_extra_args(tmp_path: Path) -> None:
    adapter = LlamaCppAdapter(server_binary=tmp_path / "llama-server")
    weights = ResolvedWeights(path=tmp_path / "m.gguf", extra_args=("-ngl", "5"))
    pins = pinned_args("CUDA0", None, fit_flag=True)
    argv = adapter.launch(_spec(), weights, host="127.0.0.1", port=9000, pins=pins).argv
    assert argv[-len(pins) :] == pins
    assert argv.index("-ngl") < len(argv) - len(pins)  # the operator's, overridden later


def test_without_pins_the_argv_is_as_before(tmp_path: Path) -> None:
    adapter = LlamaCppAdapter(server_binary=tmp_path / "llama-server")
    weights = ResolvedWeights(path=tmp_path / "m.gguf")
    argv = adapter.launch(_spec(), weights, host="127.0.0.1", port=9000).argv
    assert not {"--device", "-ngl", "--fit"} & set(argv)


def test_this_llama_server_lists_fit_and_no_device(llama_server_binary: Path) -> None:
    """This build: a portable CPU build, whose --help lists --fit and which lists no device."""
    shown = subprocess.run(
        [str(llama_server_binary), "--help"], capture_output=True, text=True, timeout=60
    )
    assert help_lists_fit(shown.stdout + shown.stderr)
    listed = subprocess.run(
        [str(llama_server_binary), "--list-devices"], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0
    assert "Available devices:" in listed.stdout
    assert parse_list_devices(listed.stdout + listed.stderr) == ()
