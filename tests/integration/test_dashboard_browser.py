"""The dashboard in a real browser (Debian's chromium through chromedriver and selenium) against a running
node with paho clients: the known client ids appear, the msg/s chart shows traffic while a publisher runs,
and kick from the page disconnects the client. Writes a screenshot of the overview."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from tests.integration.admin_support import click, close, paho, table_rows, wait_for
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PUBLISH_SECONDS = 60  # the publisher's bound: it stops sooner when the test is done


def _missing_browser() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (./dev test installs chromium and chromium-driver with apt-get as root)"
    return None


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(str(tmp_path_factory.mktemp("dashboard") / "data"), listeners=("mqtt", "http")).start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def browser():
    reason = _missing_browser()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def publisher(node):
    """A paho client publishing about 50 msg/s to a subscriber until the test ends (or PUBLISH_SECONDS)."""
    sub = paho(node.port("mqtt"), "dash-subscriber", subscribe="dash/#")
    pub = paho(node.port("mqtt"), "dash-publisher")
    stop = threading.Event()

    def run():
        deadline = time.monotonic() + PUBLISH_SECONDS
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            pub.publish(f"dash/{i % 10}", b"%d" % i, qos=0)
            i += 1
            stop.wait(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield sub
    stop.set()
    thread.join(10)
    close(pub)
    close(sub)


_LIFTED_PIXELS = """
const c = arguments[0], ctx = c.getContext("2d");
const baseline = c.height - 18 - 10;  // the zero line (pad / 2 above the bottom), less a margin
const data = ctx.getImageData(0, 0, c.width, baseline).data;
let n = 0;
for (let i = 0; i < data.length; i += 4) {
  const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
  if ((Math.abs(r - 0x2e) < 40 && Math.abs(g - 0x7d) < 40 && b > 0xa0) ||
      (r > 0xc0 && Math.abs(g - 0x83) < 40 && b < 0x50)) n++;
}
return n;
"""


def test_overview_chart_shows_the_traffic(node, browser, publisher, tmp_path):
    """While a publisher runs, the overview's msg/s chart has drawn non-zero "in" values; a screenshot is kept."""
    from selenium.webdriver.common.by import By

    browser.get(f"http://127.0.0.1:{node.port('http')}/dashboard/#overview")
    chart = browser.find_element(By.ID, "rate-chart")
    wait_for(lambda: int(chart.get_attribute("data-points") or 0) >= 5, timeout=30, what="five seconds of history")
    wait_for(lambda: float(chart.get_attribute("data-max-in") or 0) > 0, timeout=30,
             what="the chart to draw a non-zero msg/s in")
    wait_for(lambda: float(chart.get_attribute("data-max-out") or 0) > 0, timeout=30,
             what="the chart to draw a non-zero msg/s out")
    # The line really left the zero line: pixels of the series colours well above the baseline.
    lifted = browser.execute_script(_LIFTED_PIXELS, chart)
    assert lifted > 20, f"only {lifted} pixels of the msg/s lines above the zero line"
    assert int(browser.find_element(By.ID, "stat-connections").text) >= 2
    shot = tmp_path / "dashboard-overview.png"
    assert browser.save_screenshot(str(shot))
    keep = os.environ.get("TWISTMQ_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, keep)
    print(f"dashboard screenshot: {shot}")
    assert shot.stat().st_size > 10_000


def test_clients_page_lists_ids_and_kick_disconnects(node, browser):
    """The clients page lists the connected paho clients by id; its kick button disconnects one of them."""
    victim = paho(node.port("mqtt"), "dash-victim", clean=False, subscribe="v/#")
    bystander = paho(node.port("mqtt"), "dash-bystander")
    browser.get(f"http://127.0.0.1:{node.port('http')}/dashboard/#clients")
    rows = wait_for(lambda: (lambda r: r if {"dash-victim", "dash-bystander"} <= set(r) else None)(
        table_rows(browser, "clients-table")), timeout=20, what="both client ids on the clients page")
    assert rows["dash-victim"]["connected"] == "true"
    click(browser, 'button.kick[data-client-id="dash-victim"]')
    wait_for(lambda: victim.disconnects, timeout=20, what="the kicked client to be disconnected")
    victim.loop_stop()
    wait_for(lambda: table_rows(browser, "clients-table").get("dash-victim", {}).get("connected") == "false",
             timeout=20, what="the page to show the kicked client offline")
    assert not bystander.disconnects, "only the kicked client was disconnected"
    close(bystander)


def test_a_node_with_a_token_asks_for_it(browser, tmp_path):
    """With [admin] token set, the page asks for the token, then shows the overview with it."""
    from selenium.webdriver.common.by import By

    config = tmp_path / "twistmq.toml"
    config.write_text('[admin]\ntoken = "dash-token"\nmember_id = "dash-node"\n')
    node = NodeProcess(str(tmp_path / "data"), listeners=("mqtt", "http"), extra_args=["--config", str(config)])
    node.start()
    try:
        browser.get(f"http://127.0.0.1:{node.port('http')}/dashboard/#overview")
        browser.execute_script("sessionStorage.clear()")
        browser.refresh()
        wait_for(lambda: browser.find_element(By.ID, "auth").is_displayed(), what="the token prompt")
        assert "bearer token" in browser.find_element(By.ID, "error").text
        browser.find_element(By.ID, "token").send_keys("dash-token")
        browser.find_element(By.ID, "token-save").click()
        wait_for(lambda: "dash-node" in browser.find_element(By.ID, "member").text, what="the overview with the token")
        assert not browser.find_element(By.ID, "auth").is_displayed()
    finally:
        node.stop()
