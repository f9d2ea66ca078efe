"""The live page, driven in headless Chromium as an operator uses it.

``rosterd up`` serves the example lab (real llama-server backends) with an API key;
Chromium opens ``/``, is asked for the key, sees every role of the example, clicks
"Load" on a stopped role and sees it become ready on the same page (no reload: a mark
set in the page's window is still there), follows that role's log, and takes a
screenshot kept as an artifact (``page.png`` under the test's tmp folder, or in
``--screenshot-dir``). The page's plain HTTP side (served without a key, the stream
guarded by it, the stream's events) is checked too.

Chromium and chromedriver are Debian's (``scripts/setup`` installs them where it runs
as root with apt-get); without them the browser test skips, saying so. selenium (a dev
extra) talks to chromedriver; it is the well-kept WebDriver client, and with the driver's
path given it fetches nothing.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from backend_helpers import pick_free_port
from test_up_support import EXAMPLE_LAB, Up, prepare_example_models, start_up

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.slow

KEY = "page-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLE_ROLES = {"chat-small", "voice-lite", "scratch-a", "scratch-b"}
#: Chromium's flags for a test: no sandbox (root in a container), nothing fetched from
#: the network, no GPU, a window the size of an operator's screen.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--window-size=1440,1000",
    "--force-device-scale-factor=1",
    "--lang=en-GB",
]


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, llama_server_binary: Path) -> Iterator[Up]:
    prepare_example_models()
    tmp = tmp_path_factory.mktemp("page-up")
    running = start_up(
        [*EXAMPLE_LAB, "--api-key", KEY, "--min-residency", "1"], tmp, pick_free_port()
    )
    try:
        yield running
    finally:
        code = running.stop()
        assert code == 0, running.output()


def _get(up: Up, path: str, *, key: bool = False) -> httpx.Response:
    return httpx.get(up.url + path, timeout=30, trust_env=False, headers=AUTH if key else None)


def _wait_ready(up: Up, roles: set[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    ready: set[str] = set()
    while time.monotonic() < deadline:
        nodes = _get(up, "/status", key=True).json()["nodes"]
        ready = {r for n in nodes.values() for r, i in n["roles"].items() if i["phase"] == "ready"}
        if roles <= ready:
            return
        time.sleep(0.2)
    raise AssertionError(f"{roles - ready} not ready")


def test_the_page_is_served_without_a_key_and_its_data_is_not(up: Up) -> None:
    for path in ("/", "/ui", "/ui/static/page.js", "/ui/static/page.css"):
        r = _get(up, path)
        assert r.status_code == 200, path
    page = _get(up, "/")
    assert page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "/ui/static/page.js" in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # nothing from elsewhere
    assert _get(up, "/status").status_code == 401
    assert _get(up, "/rosterd/events/stream").status_code == 401
    assert _get(up, "/rosterd/logs/chat-small").status_code == 401
    assert _get(up, "/ui/static/../../status").status_code in (401, 404)


def test_the_stream_sends_history_snapshots_and_events(up: Up) -> None:
    _wait_ready(up, {"voice-lite", "chat-small"})
    seen: dict[str, list[object]] = {}
    with (
        httpx.Client(base_url=up.url, timeout=60, trust_env=False) as client,
        client.stream("GET", "/rosterd/events/stream", headers=AUTH) as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        name = ""
        loaded = False
        for line in stream.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                seen.setdefault(name, []).append(json.loads(line.removeprefix("data: ")))
                if name == "snapshot" and not loaded:
                    loaded = True  # a load while the stream is open: its events must come
                    client.post("/rosterd/load/scratch-b", headers=AUTH).raise_for_status()
                if name == "scheduler" and any(
                    e["kind"] == "loaded" and e["role"] == "scratch-b"  # type: ignore[index]
                    for e in seen["scheduler"]
                ):
                    break
    history = seen["history"][0]
    assert isinstance(history, dict)
    kinds = {(e["kind"], e["role"]) for e in history["events"]}
    assert ("loaded", "voice-lite") in kinds  # the warm-up, from before the stream
    snapshot = seen["snapshot"][0]
    assert isinstance(snapshot, dict)
    assert set(snapshot["nodes"]["local"]["roles"]) >= EXAMPLE_ROLES
    assert "uptime_s" in snapshot
    assert [e["kind"] for e in seen["scheduler"] if e["role"] == "scratch-b"][-2:] == [  # type: ignore[index]
        "loading",
        "loaded",
    ]
    log = _get(up, "/rosterd/logs/chat-small?lines=10000", key=True).text
    assert "--- rosterd: starting chat-small at " in log  # the supervisor's header line
    assert "llama" in log  # and llama-server's own output


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (dev extra) drives it")
    chromium = _find("chromium", "chromium-browser")
    driver_path = _find("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(
            "headless Chromium is missing (Debian's chromium and chromium-driver; "
            "scripts/setup installs them when run as root where apt-get is)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    service = webdriver.ChromeService(executable_path=driver_path)
    driver: WebDriver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(what: str, check: Callable[[], object], timeout_s: float = 90.0) -> None:
    """Wait until ``check()`` is true (an exception counts as "not yet": the page may be
    between two renders)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as err:
            last = err
        if last and not isinstance(last, Exception):
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def _phases(driver: WebDriver) -> dict[str, str]:
    """Role -> the phase its row shows."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "tr[data-role]")
    return {str(r.get_attribute("data-role")): str(r.get_attribute("data-phase")) for r in rows}


def _attribute(driver: WebDriver, element_id: str, name: str) -> str | None:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).get_attribute(name)


def test_an_operator_loads_a_role_on_the_live_page(
    up: Up, browser: WebDriver, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    # scratch-b (loaded by the stream test, if it ran) excludes scratch-a: start from a
    # state where scratch-a is stopped.
    httpx.post(up.url + "/rosterd/unload/scratch-a", headers=AUTH, timeout=60).raise_for_status()
    driver.get(up.url + "/")

    # The key is asked for, then the page goes live.
    _wait("the key dialog", lambda: _attribute(driver, "key-dialog", "open") is not None)
    driver.find_element(By.ID, "key-input").send_keys(KEY)
    driver.find_element(By.ID, "key-submit").click()
    _wait("the live stream", lambda: _attribute(driver, "conn", "data-state") == "live")
    driver.execute_script("window.rosterdMark = 'same page';")

    _wait("every role of the example", lambda: set(_phases(driver)) >= EXAMPLE_ROLES)
    _wait(
        "the warmed-up roles ready",
        lambda: _phases(driver)["voice-lite"] == _phases(driver)["chat-small"] == "ready",
    )
    assert _phases(driver)["scratch-a"] == "stopped"
    bar = driver.find_element(By.CSS_SELECTOR, 'section.node[data-node="local"] .bar')
    assert "GiB resident" in str(bar.get_attribute("aria-label"))

    row = driver.find_element(By.CSS_SELECTOR, 'tr[data-role="scratch-a"]')
    row.find_element(By.CSS_SELECTOR, 'button[data-action="load"]').click()
    _wait("scratch-a ready", lambda: _phases(driver)["scratch-a"] == "ready")
    assert driver.execute_script("return window.rosterdMark") == "same page"  # no reload
    assert _phases(driver)["scratch-b"] == "stopped"  # they exclude each other
    events = driver.find_element(By.ID, "events").text
    assert "scratch-a" in events
    assert "loaded" in events

    # The files served and the last reload, in words (not JSON).
    config = driver.find_element(By.ID, "config-list").text
    assert "roster.yaml" in config
    assert "none yet" in config
    assert "{" not in config
    httpx.post(up.url + "/rosterd/reload", headers=AUTH, timeout=60).raise_for_status()
    _wait(
        "the reload on the page",
        lambda: "what it changed\nnothing" in driver.find_element(By.ID, "config-list").text,
    )
    assert " ago, at " in driver.find_element(By.ID, "config-list").text

    row.find_element(By.CSS_SELECTOR, 'button[data-action="log"]').click()
    _wait("scratch-a's log", lambda: "starting scratch-a" in driver.find_element(By.ID, "log").text)
    time.sleep(1.5)  # one more snapshot: RSS and idle times filled in
    shot = tmp_path / "page.png"
    assert driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    keep = request.config.getoption("--screenshot-dir")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "page.png")
    print(f"screenshot: {shot}")
