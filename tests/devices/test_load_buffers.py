"""What llama-server logs allocating per buffer as it loads, as recorded from llama.cpp's issues
for CUDA, ROCm, Vulkan and Metal and from this machine's build (each file names its source),
read by rosterd.devices.load_buffers into bytes per device and on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from rosterd.devices.load_buffers import (
    HOST,
    LoadBuffer,
    largest_per_device,
    parse_load_report,
    pool_of_buffer,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "load_buffers"


def mib(figure: float) -> int:
    """The bytes of ``figure`` MiB as llama.cpp prints it (two decimals), rounded."""
    return round(figure * 2**20)


def _read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_every_recorded_log_names_its_source() -> None:
    paths = sorted(DATA.glob("*.txt"))
    assert len(paths) == 8
    for path in paths:
        assert path.read_text(encoding="utf-8").startswith("# source:"), path.name


def test_cuda_two_gpus_each_device_gets_its_model_kv_and_compute_buffers() -> None:
    # An older build: "CUDA0 buffer size" is the model's buffer, without the word "model".
    report = parse_load_report(_read("cuda_two_gpus_pr6122.txt"))
    assert report.device_bytes() == {
        "CUDA0": mib(5434.38) + mib(1536.00) + mib(672.01),
        "CUDA1": mib(13989.53) + mib(3584.00),
    }
    assert report.buffers[0] == LoadBuffer("CPU", "model", mib(1640.62))
    assert report.host_bytes() == mib(1640.62) + mib(1.95)  # CPU model, CUDA_Host output
    assert report.host_bytes("output") == mib(1.95)


def test_cuda_eight_gpus_model_buffers_named_as_newer_builds_name_them() -> None:
    report = parse_load_report(_read("cuda_eight_gpus_issue9390.txt"))
    on_devices = report.device_bytes()
    assert on_devices["CUDA2"] == mib(25338.47) + mib(5824.00)
    assert on_devices["CUDA7"] == mib(19728.83)
    assert on_devices["CUDA0"] == mib(5824.00)  # its model buffer is before the quoted part
    assert sorted(on_devices) == [f"CUDA{i}" for i in range(8)]
    assert report.host_bytes() == 0


def test_a_coloured_time_stamped_log_of_a_recent_build() -> None:
    report = parse_load_report(_read("cuda_colored_issue27680.txt"))
    assert report.device_bytes() == {"CUDA0": mib(182.75)}
    assert report.host_bytes("output") == mib(0.49)
    # the same lines as a terminal shows them, with the escape byte of each colour code
    coloured = (
        "\x1b[34m1.14.610.021\x1b[0m \x1b[32mI \x1b[0m"
        "llama_kv_cache:      CUDA0 KV buffer size =   182.75 MiB\n"
    )
    assert parse_load_report(coloured).device_bytes() == {"CUDA0": mib(182.75)}


def test_rocm_kv_and_compute_on_the_gpu_output_and_host_compute_on_the_host() -> None:
    # ROCm has no NVML: this report is the only measured figure of the device.
    report = parse_load_report(_read("rocm_issue11337.txt"))
    assert report.device_bytes() == {"ROCm0": mib(4352.00) + mib(307.00)}
    assert report.host_bytes() == mib(0.58) + mib(74.01)  # ROCm_Host output and compute
    # "KV self size", "size = ... MiB free" and the allocator's lines are no buffers
    assert [b.kind for b in report.buffers] == ["KV", "output", "compute", "compute"]


def test_vulkan_kv_and_compute_buffers() -> None:
    report = parse_load_report(_read("vulkan_issue12728.txt"))
    assert report.device_bytes() == {"Vulkan0": mib(19200.00) + mib(1174.00)}
    assert report.host_bytes("compute") == mib(18.01)


def test_metal_the_mapped_gguf_counts_in_the_gpu_share() -> None:
    report = parse_load_report(_read("metal_m2_pro_pr22673.txt"))
    assert report.device_bytes() == {"MTL0": mib(14803.73)}
    assert report.host_bytes("model") == mib(644.14)


def test_metal_on_an_older_build_is_named_metal() -> None:
    # As such a build lists the Mac's GPU (--list-devices: "Metal"); the allocator's own
    # "allocated buffer, size =" line is not a buffer of the load.
    report = parse_load_report(_read("metal_m1_pro_distilabel593.txt"))
    assert report.device_bytes() == {"Metal": mib(1114.92)}
    assert report.host_bytes() == mib(66.41)


def test_this_builds_cpu_only_log_has_host_buffers_alone() -> None:
    report = parse_load_report(_read("cpu_only_this_build.txt"))
    assert report.device_bytes() == {}
    assert report.host_bytes("model") == mib(235.16) + mib(12.66)  # CPU_Mapped + CPU_REPACK
    assert report.host_bytes("KV") == mib(12.00) + mib(60.00)  # non-SWA and SWA caches
    assert report.host_bytes("compute") == mib(25.77)
    assert report.host_bytes("output") == mib(1.00)


def test_a_draft_models_buffers_add_to_the_main_models() -> None:
    text = (
        "load_tensors:        CUDA0 model buffer size =  4000.00 MiB\n"
        "llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB\n"
        "srv    load_model: loading draft model 'draft.gguf'\n"
        "load_tensors:        CUDA0 model buffer size =   400.00 MiB\n"
    )
    assert parse_load_report(text).device_bytes() == {"CUDA0": mib(4912.00)}


@pytest.mark.parametrize(
    ("buffer_type", "pool"),
    [
        ("CPU", HOST),
        ("CPU_Mapped", HOST),
        ("CPU_REPACK", HOST),
        ("AMX", HOST),
        ("CUDA_Host", HOST),
        ("ROCm_Host", HOST),
        ("Vulkan_Host", HOST),
        ("CUDA0", "CUDA0"),
        ("CUDA12", "CUDA12"),
        ("ROCm1", "ROCm1"),
        ("Vulkan0", "Vulkan0"),
        ("SYCL0", "SYCL0"),
        ("MTL0", "MTL0"),
        ("MTL0_Mapped", "MTL0"),
        ("Metal", "Metal"),
        ("Metal_Mapped", "Metal"),
        ("CUDA_Split", None),
    ],
)
def test_each_buffer_type_goes_to_its_pool(buffer_type: str, pool: str | None) -> None:
    assert pool_of_buffer(buffer_type) == pool


def test_a_log_without_load_lines_reports_nothing() -> None:
    text = "0.01.212.732 I srv  llama_server: model loaded\nINFO: Uvicorn running\n"
    report = parse_load_report(text)
    assert report.buffers == ()
    assert report.device_bytes() == {}
    assert report.host_bytes() == 0


def test_the_larger_figure_of_two_readings_counts_per_role_and_device() -> None:
    nvml = {"chat": {"CUDA0": 700}, "code": {"CUDA1": 300}}
    logged = {"chat": {"CUDA0": 600, "CUDA1": 50}, "voice": {"ROCm0": 900}}
    assert largest_per_device(nvml, logged) == {
        "chat": {"CUDA0": 700, "CUDA1": 50},
        "code": {"CUDA1": 300},
        "voice": {"ROCm0": 900},
    }
    assert largest_per_device({}, {"idle": {}}) == {}
