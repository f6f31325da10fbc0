"""The admin role and proxies that route by the controllers' metadata: ``./dev cluster up`` with 3
controllers, 2 broker groups, 2 proxies and the admin process, real paho clients on both proxies.

One cluster for the module (tests run in file order; the last one moves a broker). The admin process
pages through the clients of both proxies with no duplicates or gaps and lists the members the
controllers hold; a broker restarted on another RPC port under the same name and group is found by
both proxies through the controllers (pushed, or polled with the heartbeat), without restarting them,
and their clients keep publishing and receiving through it.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pytest

from cluster.routing import SlotTable
from cluster.tools import launcher
from tests.integration.admin_support import call, table_rows, validate
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT = 20.0
BASE = """
[mqtt]
allow_anonymous = true

[discovery]
heartbeat_interval = 0.25
# Longer than a broker's restart (it registers with the controllers before it serves): a proxy closes the
# sessions of a group it lost for a lease, and the moved-broker test keeps its subscriber connected.
lease = 3.0
wheel_tick = 0.05
"""


def get(proc: dict, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc['ports']['http']}{path}", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def wait_for(predicate, what: str, timeout: float = WAIT):
    return wait_until(predicate, timeout, 0.05, what)


class Cluster:
    def __init__(self, root: str, doc: dict) -> None:
        self.root, self.doc = root, doc

    def procs(self, role: str) -> list[dict]:
        return [p for p in self.doc["processes"] if p["role"] == role]

    def one(self, member: str) -> dict:
        return next(p for p in self.doc["processes"] if p["id"] == member)

    def admin(self, path: str):
        """(status, answer) of a GET on the admin process's API."""
        status, _ctype, answer = call(self.one("admin")["ports"]["http"], "GET", path)
        return status, answer

    def metadata(self) -> dict | None:
        for controller in self.procs("controller"):
            answer = get(controller, "/api/v1/cluster/controllers/metadata")
            if answer and answer.get("slots"):
                return answer
        return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-admin")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, controllers=3, base_config=str(base))
    c = Cluster(str(root / "c"), doc)
    yield c
    launcher.stop(doc["processes"])  # the moved broker's pid is in doc, not in cluster.json


@pytest.fixture
def clients():
    made: list[mqtt.Client] = []

    def connect(port: int, client_id: str, subscribe: str | None = None, received: list | None = None):
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        subscribed = []
        c.on_subscribe = lambda *_a: subscribed.append(1)
        if received is not None:
            c.on_message = lambda _c, _u, msg: received.append((msg.topic, msg.payload))
        connected = []
        c.on_connect = lambda *_a: connected.append(1)
        c.connect("127.0.0.1", port)
        c.loop_start()
        made.append(c)
        wait_for(lambda: connected, f"CONNACK for {client_id}")
        if subscribe:
            c.subscribe(subscribe, qos=1)
            wait_for(lambda: subscribed, f"SUBACK for {client_id}")
        return c

    yield connect
    for c in made:
        c.disconnect()
        c.loop_stop()


def walk(cluster, limit: int, query: str = "") -> list[tuple[str, str]]:
    """Every page of GET clients?limit=N on the admin process, each validated; (proxy, client id) in order."""
    seen, cursor = [], None
    for _ in range(200):
        path = f"/api/v1/clients?limit={limit}{query}" + (f"&cursor={quote(cursor)}" if cursor else "")
        status, page = cluster.admin(path)
        assert status == 200, page
        validate("ClientPage", page)
        assert len(page["items"]) <= limit
        seen += [(c["proxy"], c["client_id"]) for c in page["items"]]
        cursor = page["next"]
        if cursor is None:
            return seen
    raise AssertionError("paging did not end")


def test_admin_pages_through_the_clients_of_both_proxies(cluster, clients):
    """GET clients?limit=N on the admin process walks every client of both proxies once, in (proxy, client id)
    order, whatever N; show and kick find a client on either proxy, and a session is shown and deleted there."""
    p1, p2 = (cluster.one(p)["ports"]["mqtt"] for p in ("proxy-1", "proxy-2"))
    want = []
    for i in range(13):  # interleaved ids: client-id order alone would mix the proxies
        proxy, port = ("proxy-1", p1) if i % 2 else ("proxy-2", p2)
        clients(port, f"adm-{i:02d}")
        want.append((proxy, f"adm-{i:02d}"))
    want.sort()
    wait_for(lambda: len(cluster.admin("/api/v1/clients?like=adm-&limit=1000")[1].get("items", ())) == len(want),
             "the admin to list every client")
    for limit in (1, 2, 4, 6, 12, 13, 1000):
        seen = walk(cluster, limit, "&like=adm-")
        assert seen == want, limit
    status, row = cluster.admin("/api/v1/clients/adm-04")
    assert status == 200 and row["proxy"] == "proxy-2" and row["connected"]
    validate("Client", row)
    status, _ = cluster.admin("/api/v1/clients/nobody")
    assert status == 404
    status, _ctype, kicked = call(cluster.one("admin")["ports"]["http"], "DELETE", "/api/v1/clients/adm-07")
    assert status == 200 and kicked == {"client_id": "adm-07", "kicked": True}
    wait_for(lambda: ("proxy-1", "adm-07") not in walk(cluster, 100, "&like=adm-&connected=true"),
             "the kicked client to be gone")
    status, detail = cluster.admin("/api/v1/sessions/adm-04")
    assert status == 200 and detail["proxy"] == "proxy-2"
    validate("Session", detail)
    status, _ctype, deleted = call(cluster.one("admin")["ports"]["http"], "DELETE", "/api/v1/sessions/adm-02")
    assert status == 200 and deleted == {"client_id": "adm-02", "deleted": True}
    validate("SessionDeleted", deleted)
    wait_for(lambda: ("proxy-2", "adm-02") not in walk(cluster, 100, "&like=adm-"), "the deleted session to be gone")
    status, bad = cluster.admin("/api/v1/clients?cursor=bm90LWpzb24")
    assert status == 400 and bad["code"] == "bad_request"


def test_admin_lists_the_members_the_controllers_hold(cluster):
    """GET cluster/members on the admin process: the controllers (one the leader), the brokers with their groups,
    both proxies and itself, every page valid against openapi.json."""
    def listed():
        status, page = cluster.admin("/api/v1/cluster/members?limit=1000")
        rows = {m["id"]: m for m in page["items"]} if status == 200 else {}
        want = {"broker-g1", "broker-g2", "proxy-1", "proxy-2", "admin"}
        leaders = [m for m in rows.values() if m["role"] == "controller" and m["leader"]]
        return (page, rows) if want <= set(rows) and len(leaders) == 1 else None

    page, rows = wait_for(listed, "the admin to list every member and one leader")
    validate("MemberPage", page)
    assert rows["broker-g2"]["group"] == "g2" and rows["admin"]["role"] == "admin"
    assert sum(1 for m in rows.values() if m["role"] == "controller") == 3


CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.skip(f"{path} is not installed (./dev test installs chromium and chromium-driver with apt-get)")
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


def test_the_admin_dashboard_shows_the_clients_of_both_proxies(cluster, clients, browser):
    """The dashboard on the admin process: the overview it does not serve leaves the navigation, and the clients
    page lists clients of both proxies."""
    from selenium.webdriver.common.by import By

    clients(cluster.one("proxy-1")["ports"]["mqtt"], "dash-one")
    clients(cluster.one("proxy-2")["ports"]["mqtt"], "dash-two")
    browser.get(f"http://127.0.0.1:{cluster.one('admin')['ports']['http']}/dashboard/")
    wait_for(lambda: not browser.find_element(By.CSS_SELECTOR, 'nav a[data-page="overview"]').is_displayed(),
             "the overview link to be hidden")
    browser.get(f"http://127.0.0.1:{cluster.one('admin')['ports']['http']}/dashboard/#clients")

    wait_for(lambda: {"dash-one", "dash-two"} <= set(table_rows(browser, "clients-table")),
             "both proxies' clients on the clients page")
    error = browser.find_element(By.ID, "error")  # a refresh may meet a busy proxy; never a route it lacks
    assert error.get_attribute("hidden") is not None or "no route" not in error.text


def test_a_moved_broker_is_found_without_restarting_the_proxies(cluster, clients):
    """SIGKILL broker-g1 and start it again on another RPC port (same id, group and data): the controllers'
    metadata names the new address, both proxies dial it there, and a subscriber on one proxy that stayed
    connected receives what a client of the other publishes to a g1 topic."""
    meta = wait_for(cluster.metadata, "the controllers' metadata")
    table = SlotTable.from_metadata(meta)
    level = next(f"moved{i}" for i in range(1000) if table.group_of_topic(f"moved{i}") == "g1")
    proxies = [cluster.one("proxy-1"), cluster.one("proxy-2")]
    pids = [p["pid"] for p in proxies]
    received: list = []
    clients(proxies[1]["ports"]["mqtt"], "mv-sub", subscribe=f"{level}/#", received=received)
    pub = clients(proxies[0]["ports"]["mqtt"], "mv-pub-1")
    pub.publish(f"{level}/before", b"1", qos=1).wait_for_publish(10)
    wait_for(lambda: (f"{level}/before", b"1") in received, "delivery before the move")

    broker = cluster.one("broker-g1")
    old = broker["ports"]["rpc"]
    os.kill(broker["pid"], signal.SIGKILL)
    wait_for(lambda: not launcher.alive(broker["pid"]), "broker-g1 to die")
    new = launcher.free_ports(1)[0]
    broker["argv"] = [a.replace(f"tcp:{old}:", f"tcp:{new}:") for a in broker["argv"]]
    broker["ports"]["rpc"] = new
    launcher.start(broker)

    def moved():
        m = cluster.metadata()
        return m and any(r["node_id"] == "broker-g1" and r["rpc_address"] == f"tcp:127.0.0.1:{new}" and r["joined"]
                         for r in m["members"])
    wait_for(moved, "the controllers to list broker-g1 at its new address")
    wait_for(lambda: all((get(p, "/health") or {}).get("status") == "ok" for p in proxies),
             "both proxies connected to every group again")
    pub = clients(proxies[0]["ports"]["mqtt"], "mv-pub-2")
    pub.publish(f"{level}/after", b"2", qos=1).wait_for_publish(10)
    wait_for(lambda: (f"{level}/after", b"2") in received, "delivery through the moved broker")
    assert [p["pid"] for p in proxies] == pids and all(launcher.alive(pid) for pid in pids)


def test_sessions_of_a_dead_proxy_are_listed_from_the_brokers(cluster, clients):
    """A persistent session whose proxy was SIGKILLed is no proxy's to list: once that proxy's lease ends the
    admin process lists it from the broker groups, offline, under the dead proxy's id (this test kills proxy-1:
    it runs last)."""
    proxy = cluster.one("proxy-1")
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="orphan-1", clean_session=False)
    subscribed = []
    c.on_subscribe = lambda *_a: subscribed.append(1)
    c.connect("127.0.0.1", proxy["ports"]["mqtt"])
    c.loop_start()
    c.subscribe("orphan/#", qos=1)
    wait_for(lambda: subscribed, "SUBACK for orphan-1")
    wait_for(lambda: [(r["proxy"], r["connected"]) for r in cluster.admin("/api/v1/sessions?like=orphan-")[1]
                      .get("items", ())] == [("proxy-1", True)], "the session listed by its proxy")
    os.kill(proxy["pid"], signal.SIGKILL)
    wait_for(lambda: not launcher.alive(proxy["pid"]), "proxy-1 to die")
    c.loop_stop()

    def listed():
        status, page = cluster.admin("/api/v1/sessions?like=orphan-")
        return page if status == 200 and page["items"] and not page["items"][0]["connected"] else None
    page = wait_for(listed, "the dead proxy's session listed from the brokers")
    validate("ClientPage", page)
    assert [(r["proxy"], r["client_id"], r["subscriptions"]) for r in page["items"]] == [("proxy-1", "orphan-1", 1)]
    status, page = cluster.admin("/api/v1/clients?like=orphan-")
    assert status == 200 and page["items"] == []  # clients are the live proxies' only
