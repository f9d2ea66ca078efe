"""The page's memory pools, in headless Chromium (issue 29): a node whose fleet entry declares
a GPU shows one bar per pool, host RAM and the device, each resident of its capacity and
labelled by the device; a node with host RAM alone looks as it did before pools.

This machine has no GPU: the device is declared, and the ``llama-server`` that ``up`` runs
is ``test_up_devices.py``'s kind of wrapper (``support.devices``): it stands in for a CUDA
build by running the real llama-server with ``--device none``. Skipped where Chromium is
missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support.browser import CHROMIUM_FLAGS, wait_for
from support.devices import chat, cuda_stand_in, tiny_llama_entry, tiny_model
from support.up import MODELS, prepare_example_models, start_up, write_roster

pytestmark = pytest.mark.slow

GIB = 2**30


def _pools_on_page(url: str, profile: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Per node card, its pool rows as the page shows them: (name, bar's label, figures)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (dev extra) drives it")
    from selenium.webdriver.common.by import By

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("headless Chromium is missing (Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver_path))
    try:
        driver.get(url + "/")
        box_pool = 'section.node[data-node="box"] .pool[data-pool="CUDA0"] .pool-figures'
        wait_for(
            "the box's GPU pool with its resident role",
            lambda: (
                "0.80 GiB" in driver.find_element(By.CSS_SELECTOR, box_pool).text
                and not driver.find_element(By.CSS_SELECTOR, box_pool).text.startswith("0.00")
            ),
        )
        wait_for("the plain node's card", lambda: driver.find_elements(By.CSS_SELECTOR, ".node"))
        shown: dict[str, list[tuple[str, str, str]]] = {}
        for card in driver.find_elements(By.CSS_SELECTOR, "section.node"):
            rows = card.find_elements(By.CSS_SELECTOR, ".pools:not([hidden]) .pool")
            shown[str(card.get_attribute("data-node"))] = [
                (
                    row.find_element(By.CSS_SELECTOR, ".pool-name").text,
                    str(row.find_element(By.CSS_SELECTOR, ".pool-bar").get_attribute("aria-label")),
                    row.find_element(By.CSS_SELECTOR, ".pool-figures").text,
                )
                for row in rows
            ]
        return shown
    finally:
        driver.quit()


def test_a_node_with_a_gpu_shows_a_bar_per_pool_and_a_plain_node_none(
    tmp_path: Path, llama_server_binary: Path, free_port: int
) -> None:
    prepare_example_models()
    # It lists no GPU, as this machine's build: the plain node, on the same machine, must
    # have host RAM alone (box's role then runs on the CPU, counted on the declared GPU).
    binary = cuda_stand_in(tmp_path, llama_server_binary, tmp_path / "argv.log", listing=None)
    roster = write_roster(tmp_path / "roster.yaml", [tiny_llama_entry("x", "tiny-a")])
    local = {"memory_gb": 4, "reserved_gb": 1, "platform": "linux-x86_64", "address": "127.0.0.1"}
    nodes = [
        {"name": "box", **local, "devices": [{"id": "CUDA0", "memory_gb": 0.8}]},
        # It runs no llama.cpp role: the role is the box's, on its GPU.
        {"name": "plain", **local, "flavors": ["ollama"]},
    ]
    models = {"tiny-a": tiny_model("tiny-a")}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(json.dumps({"nodes": nodes, "models": models, "model_roots": [str(MODELS)]}))
    up = start_up(
        [str(roster), "--fleet", str(fleet)],
        tmp_path,
        free_port,
        env={"ROSTERD_LLAMA_SERVER": str(binary)},
    )
    try:
        answer = chat(up.url, "x")
        assert answer.status_code == 200, answer.text
        status = up.get("/status")
        shown = _pools_on_page(up.url, tmp_path / "profile")
    finally:
        code = up.stop()
    assert code == 0, up.output()
    gpu = status["nodes"]["box"]["pools"]["CUDA0"]
    assert gpu["resident_bytes"] > 0, json.dumps(status)
    assert [name for name, _label, _figures in shown["box"]] == ["host RAM", "CUDA0"]
    _name, label, figures = shown["box"][1]
    resident = f"{gpu['resident_bytes'] / GIB:.2f}"
    assert label == f"CUDA0: {resident} of 0.80 GiB resident", shown
    assert figures == f"{resident} of 0.80 GiB resident (declared 0.80 GiB; no probe sees it)"
    assert shown["plain"] == []  # host RAM alone: no pool bars, the node's bar as before
