"""The page's usage table, in headless Chromium: a watch key sees each key's use of each
role as ``GET /rosterd/usage`` gives it (requests, tokens in and out, errors, queue wait,
time served); a key without the watch scope never gets it. The router runs for real over
stand-in backends (``support.keys_lab``); skipped where Chromium is missing."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest

from rosterd.usage import UsageStore
from support.browser import CHROMIUM_FLAGS, wait_for
from support.keys_lab import KEYS, USAGE, lab


def _browse(url: str, profile: Path) -> tuple[list[str], bool]:
    """Open the page with the watcher's key, then with a use-only key: the usage row of
    ``user`` on ``chat`` (its cells), and whether the table stayed hidden for the second."""
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

        def open_with(key: str) -> None:
            driver.get(url + "/")
            driver.execute_script("sessionStorage.clear()")
            driver.get(url + "/")
            wait_for(
                "the key dialog",
                lambda: driver.find_element(By.ID, "key-dialog").get_attribute("open") is not None,
            )
            driver.find_element(By.ID, "key-input").send_keys(key)
            driver.find_element(By.ID, "key-submit").click()

        open_with(KEYS["watcher"][0])
        row = 'tr[data-usage-key="user"][data-usage-role="chat"]'
        wait_for("the usage row", lambda: driver.find_elements(By.CSS_SELECTOR, row))
        assert driver.find_element(By.ID, "usage").get_attribute("hidden") is None
        cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"{row} td")]
        open_with(KEYS["user"][0])
        time.sleep(2)  # long enough for the page's first fetches
        hidden = driver.find_element(By.ID, "usage").get_attribute("hidden") is not None
        return cells, hidden
    finally:
        driver.quit()


async def test_a_watch_key_sees_the_usage_table_and_a_use_key_does_not(tmp_path: Path) -> None:
    store = UsageStore(tmp_path / "state")
    async with lab(tmp_path, usage=store) as up, httpx.AsyncClient(base_url=up.url) as client:
        user = {"Authorization": f"Bearer {KEYS['user'][0]}"}
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            (await client.post("/v1/chat/completions", json=body, headers=user)).raise_for_status()
        cells, hidden = await asyncio.to_thread(_browse, up.url, tmp_path / "profile")
    assert cells[:6] == [
        "user",
        "chat",
        "2",
        str(2 * USAGE["prompt_tokens"]),
        str(2 * USAGE["completion_tokens"]),
        "0",
    ]
    assert cells[6].endswith(" s")
    assert cells[7].endswith(" s")
    assert hidden
