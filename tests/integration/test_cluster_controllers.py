"""Brokers and proxies with controllers: ``./dev cluster up`` with 3 controllers, 2 broker groups, 2 proxies.

One cluster for the module (tests run in file order; each leaves every process running). Members
register with the controllers' leader and heartbeat (lease 1 s here); a SIGSTOPped proxy is evicted
and comes back; the controller leader is SIGKILLed under QoS 1 load (a new leader within 2 s, no
publish acknowledgement gap over 1 s, no member evicted); with a majority of controllers down,
publishing and delivery go on, and a leader is elected again when they return.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from cluster.tools import launcher
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT = 15.0
LEASE = 1.0
HEARTBEAT = 0.25
BASE = f"""
[mqtt]
allow_anonymous = true

[discovery]
heartbeat_interval = {HEARTBEAT}
lease = {LEASE}
wheel_tick = 0.05
"""


def get(proc: dict, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc['ports']['http']}{path}", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def wait_for(predicate, what: str, timeout: float = WAIT):
    return wait_until(predicate, timeout, 0.02, what)


class Cluster:
    def __init__(self, root: str, doc: dict) -> None:
        self.root, self.doc = root, doc

    def procs(self, role: str) -> list[dict]:
        return [p for p in self.doc["processes"] if p["role"] == role]

    def alive(self, proc) -> bool:
        return launcher.alive(proc["pid"])

    def leader(self, timeout: float = WAIT) -> dict:
        """The controller that says it leads, once every live controller agrees."""
        def agreed():
            live = [c for c in self.procs("controller") if self.alive(c)]
            health = [(c, get(c, "/health")) for c in live]
            leaders = [c for c, h in health if h and h["is_leader"]]
            if len(leaders) == 1 and all(h and h["leader"] == f"127.0.0.1:{leaders[0]['ports']['raft']}"
                                         for _, h in health):
                return leaders[0]
            return None
        return wait_for(agreed, "an agreed controller leader", timeout)

    def members(self, controller: dict | None = None) -> dict:
        controller = controller or self.leader()
        answer = get(controller, "/api/v1/cluster/members?limit=1000") or {"items": []}
        return {m["id"]: m for m in answer["items"] if m["role"] != "controller"}

    def kill(self, proc) -> None:
        os.kill(proc["pid"], signal.SIGKILL)
        wait_for(lambda: not self.alive(proc), f"{proc['id']} to die")

    def restart(self, proc) -> None:
        proc["pid"] = launcher.relaunch(self.root, proc["id"])["pid"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-ctl")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, controllers=3, base_config=str(base))
    yield Cluster(str(root / "c"), doc)
    for proc in doc["processes"]:  # a test that failed half-way may leave one stopped
        try:
            os.kill(proc["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    launcher.down(str(root / "c"))


def everyone_joined(cluster) -> dict | None:
    members = cluster.members()
    want = {p["id"] for p in cluster.procs("broker") + cluster.procs("proxy")}
    return members if want <= set(members) and all(members[m]["joined"] for m in want) else None


def test_brokers_and_proxies_register_with_their_addresses(cluster):
    """Every broker and proxy is listed joined by the leader, with the addresses it serves on; the metadata's
    groups name the brokers (any controller's cluster/members agrees)."""
    members = wait_for(lambda: everyone_joined(cluster), "every member joined")
    for proxy in cluster.procs("proxy"):
        row = members[proxy["id"]]
        assert row["role"] == "proxy" and row["healthy"] and row["version"]
    for broker in cluster.procs("broker"):
        row = members[broker["id"]]
        assert row["role"] == "broker" and row["group"] == broker["group"]
        assert row["address"] == f"tcp:127.0.0.1:{broker['ports']['rpc']}"
    follower = next(c for c in cluster.procs("controller") if c is not cluster.leader())
    wait_for(lambda: set(cluster.members(follower)) == set(members), "a follower listing the same members")


def test_controllers_are_listed_by_their_cluster_json_ids(cluster):
    """cluster/members on any controller lists the three controllers by their cluster.json ids (their Raft
    addresses as address), the leader's row with leader true."""
    leader = cluster.leader()
    want = {c["id"]: f"127.0.0.1:{c['ports']['raft']}" for c in cluster.procs("controller")}
    for controller in cluster.procs("controller"):
        rows = [m for m in get(controller, "/api/v1/cluster/members?limit=1000")["items"] if m["role"] == "controller"]
        assert {m["id"]: m["address"] for m in rows} == want
        assert [m["id"] for m in rows if m["leader"]] == [leader["id"]]


def test_stopped_proxy_is_evicted_after_its_lease_and_rejoins_after_sigcont(cluster):
    """SIGSTOP a proxy: listed joined false after one lease (within a tick or two); SIGCONT: it registers again."""
    wait_for(lambda: everyone_joined(cluster), "every member joined")
    proxy = cluster.procs("proxy")[1]
    os.kill(proxy["pid"], signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: cluster.members().get(proxy["id"], {}).get("joined") is False, "the proxy's eviction")
        took = time.monotonic() - stopped
        # A lease runs from the last heartbeat, at most one interval before the SIGSTOP (less on a loaded machine).
        assert LEASE - HEARTBEAT - 0.1 <= took <= LEASE + 2.0, took
        assert all(cluster.members()[p["id"]]["joined"] for p in cluster.procs("broker"))
    finally:
        os.kill(proxy["pid"], signal.SIGCONT)
    wait_for(lambda: cluster.members().get(proxy["id"], {}).get("joined"), "the proxy to rejoin")


class Publisher:
    """A paho client publishing QoS 1 every 20 ms; records when each acknowledgement came."""

    def __init__(self, port: int) -> None:
        self.acks: list[float] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ctl-load")
        self.client.on_publish = lambda *a: self.acks.append(time.monotonic())
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.client.publish(f"load/{n % 7}", b"x", qos=1)
            n += 1
            time.sleep(0.02)

    def stop(self) -> float:
        """Stop; the longest gap between two acknowledgements (seconds)."""
        self._stop.set()
        self._thread.join(5)
        self.client.loop_stop()
        self.client.disconnect()
        return max((b - a for a, b in zip(self.acks, self.acks[1:])), default=0.0)


def test_leader_killed_under_qos1_load(cluster):
    """SIGKILL the controller leader while a client publishes QoS 1: a new leader within 2 s, no gap of more
    than 1 s between acknowledgements, no broker or proxy evicted; the old one rejoins as a follower."""
    wait_for(lambda: everyone_joined(cluster), "every member joined")
    old = cluster.leader()
    load = Publisher(cluster.procs("proxy")[0]["ports"]["mqtt"])
    wait_for(lambda: len(load.acks) > 20, "acknowledgements before the kill")
    cluster.kill(old)
    killed = time.monotonic()
    new = cluster.leader(timeout=5.0)
    took = time.monotonic() - killed
    time.sleep(LEASE * 2)  # past a lease after the takeover: anyone the new leader thought dead would show
    gap = load.stop()
    members = cluster.members(new)
    assert new is not old and took < 2.0, took
    assert gap < 1.0, gap
    assert all(members[p["id"]]["joined"] for p in cluster.procs("broker") + cluster.procs("proxy")), members
    cluster.restart(old)
    assert cluster.leader() is new
    print(f"new leader in {took:.2f} s; longest ack gap {gap * 1000:.0f} ms")


def test_majority_of_controllers_down_publishing_goes_on(cluster):
    """Two of three controllers SIGKILLed: a subscriber on one proxy still gets what a publisher sends on the
    other; when the two come back a leader is elected and every member is joined again."""
    leader = cluster.leader()
    down = [c for c in cluster.procs("controller") if c is not leader][:1] + [leader]
    for c in down:
        cluster.kill(c)
    got = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ctl-sub")
    sub.on_message = lambda c, u, m: got.append(m.payload)
    sub.connect("127.0.0.1", cluster.procs("proxy")[0]["ports"]["mqtt"])
    sub.subscribe("majority/#", qos=1)
    sub.loop_start()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ctl-pub")
    pub.connect("127.0.0.1", cluster.procs("proxy")[1]["ports"]["mqtt"])
    pub.loop_start()
    try:
        time.sleep(0.5)
        for i in range(5):
            pub.publish(f"majority/{i}", str(i).encode(), qos=1).wait_for_publish(WAIT)
        wait_for(lambda: len(got) == 5, "the five messages across proxies")
    finally:
        pub.loop_stop()
        pub.disconnect()
        sub.loop_stop()
        sub.disconnect()
    for c in down:
        cluster.restart(c)
    cluster.leader()
    wait_for(lambda: everyone_joined(cluster), "every member joined again")
