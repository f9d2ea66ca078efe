"""The live page, driven in headless Chromium as an operator uses it.

``rosterd up`` serves the example lab (real llama-server backends) with an API key;
Chromium opens ``/``, is asked for the key, sees every role of the example, clicks
"Load" on a stopped role and sees it become ready on the same page (no reload: a mark
set in the page's window is still there), follows that role's log, and takes a
screenshot kept as an artifact (``page.png`` under the test's tmp folder, or in
``--screenshot-dir``). Then the charts and the playground: after some traffic the
charts have points, and a message sent in the playground to the example's chat role
(``chat-small``, unloaded first) gets a streamed answer with its time to first token,
tokens per second and the load it had to wait for (``page-charts.png`` and
``page-playground.png``: the two sections, as ``docs/`` shows them). The page's
plain HTTP side (served without a key, the stream guarded by it, the stream's events,
the history, the headers that say what a request waited for) is checked too. The
server runs with an API key and without ``--cors-origin``, as a lab's does.

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

from support.backends import pick_free_port
from support.up import EXAMPLE_LAB, Up, prepare_example_models, start_up

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
        [*EXAMPLE_LAB, "--api-key", KEY, "--min-residency", "1", "--history-interval", "1"],
        tmp,
        pick_free_port(),
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
    for path in (
        "/",
        "/ui",
        "/ui/static/page.js",
        "/ui/static/page.css",
        "/ui/static/charts.js",
        "/ui/static/playground.js",
        "/ui/static/vendor/uPlot.iife.min.js",
        "/ui/static/vendor/uPlot.min.css",
    ):
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
    assert _get(up, "/rosterd/history").status_code == 401
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


def _kv_cells(driver: WebDriver) -> dict[str, str]:
    """Role -> the text of its row's "KV kept" cell."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "tr[data-role]")
    return {
        str(r.get_attribute("data-role")): r.find_element(By.CSS_SELECTOR, ".kv").text for r in rows
    }


def _kv_summaries(up: Up) -> dict[str, str]:
    """Role -> its ``kv_summary`` in ``/status`` (such as ``52 tok · 0.4 MiB`` or ``—``)."""
    nodes = _get(up, "/status", key=True).json()["nodes"]
    return {r: i["kv_summary"] for n in nodes.values() for r, i in n["roles"].items()}


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
    # Each role's KV kept across swaps and its last restore, as /status words it.
    head = driver.find_element(By.CSS_SELECTOR, 'section.node[data-node="local"] thead').text
    assert "KV kept" in head
    _wait("the KV cells as /status says", lambda: _kv_cells(driver) == _kv_summaries(up))
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


def _chat(up: Up, role: str) -> httpx.Response:
    body = {"model": role, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    r = httpx.post(
        up.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120, trust_env=False
    )
    r.raise_for_status()
    return r


def test_an_answer_says_whether_it_had_to_load_or_swap(up: Up) -> None:
    for role in ("scratch-a", "scratch-b"):
        httpx.post(f"{up.url}/rosterd/unload/{role}", headers=AUTH, timeout=60).raise_for_status()
    loaded = _chat(up, "scratch-a").headers
    assert loaded["x-rosterd-role"] == "scratch-a"
    assert loaded["x-rosterd-node"] == "local"
    assert float(loaded["x-rosterd-load-s"]) > 0
    assert float(loaded["x-rosterd-queue-wait-s"]) >= float(loaded["x-rosterd-load-s"])
    assert "x-rosterd-evicted" not in loaded
    swapped = _chat(up, "scratch-b").headers  # scratch-b excludes scratch-a
    assert float(swapped["x-rosterd-load-s"]) > 0
    assert swapped["x-rosterd-evicted"] == "scratch-a=exclusion"
    resident = _chat(up, "scratch-b").headers
    assert "x-rosterd-load-s" not in resident
    assert float(resident["x-rosterd-queue-wait-s"]) < 0.5


def test_the_history_has_points_for_every_role(up: Up) -> None:
    _wait_ready(up, {"voice-lite"})
    for _ in range(3):
        _chat(up, "voice-lite")
    deadline = time.monotonic() + 30
    while True:
        data = _get(up, "/rosterd/history", key=True).json()
        voice = data["roles"].get("voice-lite", {})
        if any(v for v in voice.get("requests_per_s", [])) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert data["interval_s"] == 1.0
    assert data["points"] == 360
    assert 1 <= len(data["t"]) <= 360
    assert set(data["roles"]) >= EXAMPLE_ROLES
    assert max(voice["requests_per_s"]) > 0
    assert max(v or 0 for v in voice["tokens_per_s"]) > 0  # llama-server's usage, counted
    assert any(v is not None for v in voice["queue_wait_p50_s"])
    memory = data["nodes"]["local"]
    assert len(memory["capacity_bytes"]) == len(data["t"])
    assert any(v for v in memory["roles"]["voice-lite"])
    assert {m["kind"] for m in data["marks"]} >= {"loaded"}


def _open_page(driver: WebDriver, up: Up) -> None:
    """Open ``/``, give the key if the page asks (a tab that gave it already keeps it)."""
    from selenium.webdriver.common.by import By

    driver.get(up.url + "/")
    _wait(
        "the key dialog or the live stream",
        lambda: (
            _attribute(driver, "key-dialog", "open") is not None
            or _attribute(driver, "conn", "data-state") == "live"
        ),
    )
    if _attribute(driver, "key-dialog", "open") is not None:
        driver.find_element(By.ID, "key-input").send_keys(KEY)
        driver.find_element(By.ID, "key-submit").click()
    _wait("the live stream", lambda: _attribute(driver, "conn", "data-state") == "live")


def _chart(driver: WebDriver, chart: str) -> tuple[int, float]:
    """The points a chart holds and its largest value (its ``data-points``/``data-peak``)."""
    from selenium.webdriver.common.by import By

    fig = driver.find_element(By.CSS_SELECTOR, f'figure[data-chart="{chart}"]')
    assert fig.find_element(By.TAG_NAME, "canvas").size["width"] > 100
    return int(fig.get_attribute("data-points") or 0), float(fig.get_attribute("data-peak") or 0)


def test_charts_have_points_and_the_playground_streams_an_answer(
    up: Up, browser: WebDriver, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    _wait_ready(up, {"chat-small", "voice-lite"})
    # chat-small is the example's chat model: unloaded, the playground's message has to load it.
    httpx.post(up.url + "/rosterd/unload/chat-small", headers=AUTH, timeout=60).raise_for_status()
    _open_page(driver, up)
    for _ in range(3):
        _chat(up, "voice-lite")  # traffic for the charts
    _wait("a chart with requests", lambda: _chart(driver, "requests")[1] > 0, timeout_s=30)
    points, _ = _chart(driver, "requests")
    assert points >= 2
    memory_points, held_gib = _chart(driver, "memory:local")
    assert memory_points >= 2
    assert held_gib > 0
    assert _chart(driver, "tokens")[1] > 0
    assert "of 360 points, one every 1 s" in driver.find_element(By.ID, "charts-window").text

    _wait(
        "chat-small in the playground",
        lambda: (
            "chat-small"
            in [
                o.get_attribute("value")
                for o in Select(driver.find_element(By.ID, "play-role")).options
            ]
        ),
    )
    Select(driver.find_element(By.ID, "play-role")).select_by_value("chat-small")
    size = driver.find_element(By.ID, "play-max")
    size.clear()
    size.send_keys("24")
    driver.find_element(By.ID, "play-input").send_keys("Name three colours.")
    driver.find_element(By.ID, "play-send").click()
    # Streamed: the answer's text grows before the request is done.
    _wait(
        "the first streamed words",
        lambda: driver.find_elements(By.CSS_SELECTOR, ".bubble:not(.you) .text")[-1].text,
        timeout_s=120,
    )
    _wait(
        "the answer done",
        lambda: _attribute(driver, "play-stats", "data-state") != "sending",
        timeout_s=120,
    )
    stats = driver.find_element(By.ID, "play-stats").text
    assert _attribute(driver, "play-stats", "data-state") == "done", stats
    answer = driver.find_elements(By.CSS_SELECTOR, ".bubble:not(.you) .text")[-1].text
    assert answer.strip()
    assert "time to first token " in stats
    assert "tokens/s" in stats
    assert "had to load chat-small: " in stats
    assert _phases(driver)["chat-small"] == "ready"

    driver.set_window_size(1440, 2400)  # the whole page: nodes, charts, playground
    time.sleep(1.5)  # a point more on the charts, drawn at the new width
    shots = {
        "page-all.png": None,  # the whole page, an artifact only (it shows this run's paths)
        "page-charts.png": "charts",  # the two sections the docs show
        "page-playground.png": "playground",
    }
    keep = request.config.getoption("--screenshot-dir")
    for name, section in shots.items():
        shot = tmp_path / name
        if section is None:
            assert driver.save_screenshot(str(shot))
        else:
            assert driver.find_element(By.ID, section).screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if keep and section is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(keep) / name)
        print(f"screenshot: {shot}")
    driver.set_window_size(1440, 1000)
