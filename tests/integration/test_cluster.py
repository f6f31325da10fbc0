"""Proxies and brokers as processes: 2 broker groups and 2 proxies from ``./dev cluster up``, real paho clients.

One cluster serves the whole module (started once: ~5 s); tests that kill a
process start it again from its ``argv`` before they end, so the next test
finds the cluster whole. The base config makes retention quick (2 s,
checked every 0.5 s, 64 KiB segments), so owed messages must survive it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cluster.routing import SlotTable
from cluster.runtime.config import ClusterConfig
from cluster.tools import launcher
from mqtt_proxy.native.client import BlockingClient
from store.reader import iter_records
from store.record import RecordKind
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

CALL_TIMEOUT = ClusterConfig().call_timeout  # the launcher's processes keep the default

RETENTION_S = 2.0016  # retention_hours below, in seconds
RETENTION_CHECK_S = 0.5
TIMER_MARGIN_S = 0.2  # a retention check runs on a loaded reactor a little after its interval

TIMINGS = f"""
[mqtt]
allow_anonymous = true

[store]
segment_size = 65536
retention_hours = {RETENTION_S / 3600!r}
retention_check_s = {RETENTION_CHECK_S}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two broker groups (g1, g2) and two proxies, started once for the module."""
    root = tmp_path_factory.mktemp("cluster")
    base = root / "base.toml"
    base.write_text(TIMINGS)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, base_config=str(base))
    yield Cluster(str(root / "c"), doc)
    launcher.down(str(root / "c"))


class Cluster:
    def __init__(self, root: str, doc: dict) -> None:
        self.root = root
        self.doc = doc
        self.table = SlotTable.build(("g1", "g2"))

    def procs(self, role: str) -> list[dict]:
        return [p for p in self.doc["processes"] if p["role"] == role]

    def proxy(self, n: int) -> dict:
        return self.procs("proxy")[n]

    def broker(self, group: str) -> dict:
        return [p for p in self.procs("broker") if p["group"] == group][0]

    def restart(self, proc: dict) -> None:
        """Relaunch a killed process from its argv: it comes back as the same member, on the same ports."""
        try:
            os.waitpid(proc["pid"], 0)
        except ChildProcessError:
            pass
        proc["pid"] = launcher.relaunch(self.root, proc["id"])["pid"]

    def metric(self, proc: dict, name: str, label: str | None = None) -> float:
        url = f"http://127.0.0.1:{proc['ports']['http']}/metrics"
        total = 0.0
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if line.startswith(name) and (label is None or label in line):
                total += float(line.rsplit(" ", 1)[1])
        return total


def levels(table: SlotTable) -> list[str]:
    out = [f"t{i}" for i in range(16)]
    assert {table.group_of_topic(level) for level in out} == {"g1", "g2"}
    return out


class Sink:
    """A paho client that records what it receives and how it was disconnected."""

    def __init__(self, client_id: str, port: int, clean: bool = True, v5: bool = False) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.disconnects: list[int] = []
        self.connected = threading.Event()
        self.lock = threading.Lock()
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        kwargs = {} if v5 else {"clean_session": clean}
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol, **kwargs)
        self.client.on_message = self._message
        self.client.on_connect = lambda c, u, f, rc, p=None: self.connected.set()
        self.client.on_disconnect = self._gone
        self.subacks: set[int] = set()
        self.client.on_subscribe = lambda c, u, mid, codes, p=None: self.subacks.add(mid)
        self.v5, self.clean = v5, clean
        self.connect(port)

    def connect(self, port: int) -> None:
        self.connected.clear()
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0 if self.clean else 3600
            self.client.connect("127.0.0.1", port, clean_start=self.clean, properties=props)
        else:
            self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(10), "no CONNACK"

    def _message(self, client, userdata, message) -> None:
        with self.lock:
            self.got.append((message.topic, message.payload))

    def _gone(self, client, userdata, flags, reason, properties=None) -> None:
        self.disconnects.append(reason.value if hasattr(reason, "value") else int(reason))

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        result, mid = self.client.subscribe(topic_filter, qos)
        assert result == 0
        # The proxy sends SUBACK once every group has taken the filter's interest.
        wait_for(lambda: mid in self.subacks, timeout=10, what=f"SUBACK of {topic_filter}")

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def payloads(self) -> set[bytes]:
        with self.lock:
            return {p for _, p in self.got}


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    wait_until(predicate, timeout, what=what)


def publish_all(port: int, messages: list[tuple[str, bytes]], client_id: str = "pub") -> set[bytes]:
    """Publish QoS 1 and return the payloads whose PUBACK came (what the cluster acknowledged)."""
    acked: set[bytes] = set()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    connected = threading.Event()
    pub.on_connect = lambda *_: connected.set()
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    # With a group down, CONNECT waits call_timeout for its claim there: each PUBACK's 10 s below counts
    # from the CONNACK, not from the TCP connect.
    connected.wait(30)
    infos = [(payload, pub.publish(topic, payload, qos=1)) for topic, payload in messages]
    for payload, info in infos:
        try:
            info.wait_for_publish(10)
        except (RuntimeError, ValueError):
            continue
        if info.is_published():
            acked.add(payload)
    pub.loop_stop()
    pub.disconnect()
    return acked


def timed_connect(port: int, client_id: str, v5: bool = False, results: dict | None = None) -> tuple[float, bool]:
    """(seconds from CONNECT to CONNACK, whether the CONNACK accepted); a v5 client asks for a stored session.

    With ``results``, the pair is also stored there under the client id (for threads)."""
    protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    acked: list = []
    done = threading.Event()

    def on_connect(c, u, flags, reason, properties=None):
        acked.append((time.monotonic(), not reason.is_failure))
        done.set()

    client.on_connect = on_connect
    props = None
    if v5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
    start = time.monotonic()
    client.connect("127.0.0.1", port, properties=props)
    client.loop_start()
    try:
        assert done.wait(4 * CALL_TIMEOUT), f"no CONNACK for {client_id}"
    finally:
        client.loop_stop()
        client.disconnect()
    at, accepted = acked[0]
    if results is not None:
        results[client_id] = (at - start, accepted)
    return at - start, accepted


def group_topics(cluster: Cluster, group: str) -> set[str]:
    """First levels of the MQTT publishes in a group's commit log."""
    directory = os.path.join(cluster.broker(group)["data_dir"], "commitlog")
    return {r.topic.partition("/")[0] for r in iter_records(directory)
            if r.kind is RecordKind.MQTT_PUBLISH and not r.topic.startswith("$")}


def test_each_group_log_holds_only_the_topics_its_slots_own(cluster):
    """Publishes through either proxy land in the group owning their first level, and only there."""
    table = cluster.table
    messages = [(f"{lv}/own/{i}", f"own-{lv}-{i}".encode()) for lv in levels(table) for i in range(3)]
    acked = publish_all(cluster.proxy(0)["ports"]["mqtt"], messages[::2], "own-a")
    acked |= publish_all(cluster.proxy(1)["ports"]["mqtt"], messages[1::2], "own-b")
    assert len(acked) == len(messages)
    for group in ("g1", "g2"):
        held = group_topics(cluster, group)
        assert held and all(table.group_of_topic(level) == group for level in held), (group, held)


def test_notify_goes_only_to_the_proxy_holding_a_matching_filter(cluster):
    """A subscriber on proxy 1 only: proxy 2, holding no filter, receives 0 queue news events."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    before = cluster.metric(p2, "twistmq_notify_events_received_total")
    sink = Sink("notify-sub", p1["ports"]["mqtt"])
    try:
        sink.subscribe("+/news/#")
        acked = publish_all(p2["ports"]["mqtt"], [(f"{lv}/news/x", lv.encode()) for lv in levels(cluster.table)],
                            "notify-pub")
        wait_for(lambda: sink.payloads() >= acked, what="all news delivered")
        assert cluster.metric(p1, "twistmq_notify_events_received_total") > 0
        assert cluster.metric(p2, "twistmq_notify_events_received_total") == before == 0
    finally:
        sink.stop()


def test_a_connect_on_the_other_proxy_takes_the_session_over(cluster):
    """MQTT-3.1.4-3 across proxies: the first proxy disconnects its client with 0x8E; the session moves."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    first = Sink("roamer", p1["ports"]["mqtt"], clean=False, v5=True)
    first.subscribe("+/roam/#")
    second = Sink("roamer", p2["ports"]["mqtt"], clean=False, v5=True)
    try:
        wait_for(lambda: first.disconnects, what="the first connection closed")
        assert first.disconnects[0] == 0x8E
        acked = publish_all(p1["ports"]["mqtt"], [(f"{lv}/roam/1", lv.encode()) for lv in levels(cluster.table)],
                            "roam-pub")
        wait_for(lambda: second.payloads() >= acked, what="the session's messages on the second proxy")
    finally:
        first.client.loop_stop()
        second.stop()


def test_a_stopped_proxy_cannot_corrupt_a_session_taken_from_it(cluster):
    """SIGSTOP the holder, take the session over on the other proxy, SIGCONT: the old holder lets go."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    old = Sink("sleeper", p1["ports"]["mqtt"], clean=False, v5=True)
    old.subscribe("+/sleep/#")
    os.kill(p1["pid"], signal.SIGSTOP)
    try:
        new = Sink("sleeper", p2["ports"]["mqtt"], clean=False, v5=True)
        acked = publish_all(p2["ports"]["mqtt"], [(f"{lv}/sleep/1", b"a" + lv.encode())
                                                  for lv in levels(cluster.table)], "sleep-pub")
        wait_for(lambda: new.payloads() >= acked, what="delivery to the new holder")
    finally:
        os.kill(p1["pid"], signal.SIGCONT)
    try:
        wait_for(lambda: old.disconnects, timeout=20, what="the woken proxy to drop the old connection")
        acked2 = publish_all(p2["ports"]["mqtt"], [(f"{lv}/sleep/2", b"b" + lv.encode())
                                                   for lv in levels(cluster.table)], "sleep-pub2")
        wait_for(lambda: new.payloads() >= acked | acked2, what="delivery after the old holder woke")
        assert not ({p for _, p in old.got} & acked2)
    finally:
        old.client.loop_stop()
        new.stop()


def test_retention_in_every_group_keeps_what_an_offline_session_owes(cluster):
    """An offline persistent '+/ret/#' session (held in one group) owes messages in both groups' logs:
    neither group's retention (2 s, 64 KiB segments) drops them; on return it gets all 1,600."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    sub = Sink("ret-sub", p1["ports"]["mqtt"], clean=False)
    sub.subscribe("+/ret/#")
    sub.stop()
    body = b"x" * 200
    acked = publish_all(p2["ports"]["mqtt"], [(f"{lv}/ret/{i}", b"%s-%d-" % (lv.encode(), i) + body)
                                              for i in range(100) for lv in levels(cluster.table)], "ret-pub")
    assert len(acked) == 1600
    # Retention age is the subject: every full segment (its mtime is at most now) must get older than the
    # retention, then a check run must see it. No metric counts the runs, so wait out age plus one interval.
    time.sleep(RETENTION_S + RETENTION_CHECK_S + TIMER_MARGIN_S)
    sub.got.clear()
    sub.connect(p2["ports"]["mqtt"])
    try:
        wait_for(lambda: sub.payloads() >= acked, timeout=30, what="every owed message after retention ran")
    finally:
        sub.stop()


def test_native_queues_route_by_name_through_either_proxy(cluster):
    """A native produce on proxy 1 and consume on proxy 2 meet in the queue's group."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    with BlockingClient("127.0.0.1", p1["ports"]["native"]) as a, \
            BlockingClient("127.0.0.1", p2["ports"]["native"]) as b:
        for n in range(8):
            reply = a.request({"action": "produce", "queue": f"jobs-{n}", "data": f"job {n}"})
            assert reply["code"] == 0, reply
        for n in range(8):
            reply = b.request({"action": "consume", "queue": f"jobs-{n}"})
            assert reply["code"] == 0 and reply["data"] == f"job {n}", reply


def test_persistent_subscriber_resumes_on_the_other_proxy_after_sigkill(cluster):
    """QoS 1 '+/chk/#' on proxy 1, publisher on proxy 2 over 16 topics; SIGKILL proxy 1 midway: the
    subscriber reconnects to proxy 2 and gets every acknowledged message."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    sub = Sink("chk-sub", p1["ports"]["mqtt"], clean=False)
    sub.subscribe("+/chk/#")
    lvls = levels(cluster.table)
    acked = publish_all(p2["ports"]["mqtt"], [(f"{lv}/chk/a", f"a-{lv}-{i}".encode())
                                              for i in range(20) for lv in lvls], "chk-pub-a")
    os.kill(p1["pid"], signal.SIGKILL)
    sub.client.loop_stop()
    acked |= publish_all(p2["ports"]["mqtt"], [(f"{lv}/chk/b", f"b-{lv}-{i}".encode())
                                               for i in range(20) for lv in lvls], "chk-pub-b")
    assert len(acked) == 2 * 20 * 16
    sub.connect(p2["ports"]["mqtt"])
    try:
        wait_for(lambda: sub.payloads() >= acked, timeout=30, what="every acknowledged message")
    finally:
        sub.stop()
        cluster.restart(p1)


def test_a_broker_killed_and_restarted_loses_nothing_acknowledged(cluster):
    """SIGKILL broker g1 while publishing; publishes to it are held, then the client is dropped (not
    acknowledged); after its restart (recovery runs) the proxies reconnect and every acknowledged message
    reaches the persistent subscriber."""
    p1, p2 = cluster.proxy(0), cluster.proxy(1)
    sub = Sink("crash-sub", p1["ports"]["mqtt"], clean=False)
    sub.subscribe("+/crash/#")
    lvls = levels(cluster.table)
    acked = publish_all(p2["ports"]["mqtt"], [(f"{lv}/crash/a", f"a-{lv}".encode()) for lv in lvls], "crash-a")
    broker = cluster.broker("g1")
    os.kill(broker["pid"], signal.SIGKILL)
    g2_only = [lv for lv in lvls if cluster.table.group_of_topic(lv) == "g2"]
    # CONNECT with g1 down takes one call timeout (the claim there), not two: a clean and a persistent
    # client whose sessions live in g2 are accepted within 1.5 call timeouts; one living in g1 is refused.
    homed = {g: [f"crash-{g}-{n}" for n in range(100) if cluster.table.group_of_client(f"crash-{g}-{n}") == g]
             for g in ("g1", "g2")}
    clients = [(homed["g2"][0], False), (homed["g2"][1], True), (homed["g1"][0], False)]
    wait_for(lambda: cluster.metric(p2, "twistmq_rpc_peer_connected", "broker-g1") == 0, what="g1 seen down")
    times: dict = {}
    threads = [threading.Thread(target=timed_connect, args=(p2["ports"]["mqtt"], cid, v5, times))
               for cid, v5 in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5 * CALL_TIMEOUT)
    assert set(times) == {cid for cid, _ in clients}, times
    for cid, _ in clients[:2]:
        assert times[cid][1] and times[cid][0] < 1.5 * CALL_TIMEOUT, (cid, times[cid])
    assert times[clients[2][0]][1] is False, times
    # a client whose session lives in g2 connects while g1 is down, and its publishes to g2 are acknowledged
    publisher = next(f"crash-b-{n}" for n in range(100) if cluster.table.group_of_client(f"crash-b-{n}") == "g2")
    during = publish_all(p2["ports"]["mqtt"], [(f"{lv}/crash/b", f"b-{lv}".encode()) for lv in g2_only], publisher)
    assert len(during) == len(g2_only)
    acked |= during
    cluster.restart(broker)
    wait_for(lambda: cluster.metric(p1, "twistmq_rpc_peer_connected", "broker-g1") == 1, what="reconnect")
    acked |= publish_all(p2["ports"]["mqtt"], [(f"{lv}/crash/c", f"c-{lv}".encode()) for lv in lvls], "crash-c")
    try:
        wait_for(lambda: sub.payloads() >= acked, timeout=30, what="every acknowledged message")
    finally:
        sub.stop()


def test_an_unreachable_group_holds_the_ack_then_disconnects_with_server_busy(cluster):
    """With broker g1 stopped, a v5 QoS 1 publish to one of its topics gets no PUBACK and, after the call
    timeout, DISCONNECT 0x89 (Server busy); nothing is acknowledged that was not stored."""
    p1 = cluster.proxy(0)
    broker = cluster.broker("g1")
    level = [lv for lv in levels(cluster.table) if cluster.table.group_of_topic(lv) == "g1"][0]
    client = Sink("held", p1["ports"]["mqtt"], v5=True)
    os.kill(broker["pid"], signal.SIGKILL)
    try:
        info = client.client.publish(f"{level}/held", b"x", qos=1)
        wait_for(lambda: client.disconnects, timeout=30, what="the disconnect")
        assert client.disconnects[0] == 0x89
        assert not info.is_published()
    finally:
        client.client.loop_stop()
        cluster.restart(broker)
        wait_for(lambda: cluster.metric(p1, "twistmq_rpc_peer_connected", "broker-g1") == 1, what="reconnect")
