"""What a SIGKILLed proxy leaves behind: 3 controllers, 2 broker groups, 2 proxies, real paho v5 clients.

One cluster for the module (lease 1 s). A proxy is SIGKILLed holding a client with a will and a
persistent session: the broker groups take its sessions over, the will reaches a subscriber on the
other proxy within a lease (+ margin), and after the session's expiry it is gone, its filter's
interest released and the commit-log segments it pinned freed by retention (small segments and a
retention age under a second make that visible). A client back on the other proxy within its will
delay gets no will published; a taken-over session keeps its will and expiry across a restart of its
broker; a proxy cut off from a SIGSTOPped broker closes the sessions living there (and publishes their
wills itself); the copies of a killed proxy's session that its other groups keep go with its expiry, unless
its client came back. The killed proxy is relaunched for the next test. The same cluster
serves a virtual queue whose real queues hash to other groups than its name: a produce through one
proxy reaches every real queue, and a consume through the other finds them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cluster.remote import codec as store_codec
from cluster.remote.server import request_type
from cluster.routing import SlotTable
from cluster.rpc.connection import Opened
from cluster.rpc.frames import Result
from cluster.tools import launcher
from mqtt_proxy.native.client import BlockingClient
from tests.integration.test_rpc_broker import Peer
from tests.integration.waiting import metric_value, wait_until

pytestmark = pytest.mark.slow

def _virtual_names() -> tuple[str, tuple[str, ...]]:
    """A virtual queue and real queues in both groups, at least one of them not in the virtual queue's group
    (the launcher's groups g1 and g2 share the hash slots evenly)."""
    table = SlotTable.build(("g1", "g2"))
    names = [f"vjobs-{i}" for i in range(64)]
    home = table.group_of_queue(names[0])
    other = [n for n in names[1:] if table.group_of_queue(n) != home][:2]
    same = next(n for n in names[1:] if table.group_of_queue(n) == home)
    return names[0], (*other, same)


VIRTUAL, REAL = _virtual_names()
TABLE = SlotTable.build(("g1", "g2"))


def named(prefix: str, group: str, of=TABLE.group_of_client) -> str:
    """The first ``prefix-N`` whose group (by ``of``) is ``group``."""
    return next(f"{prefix}-{i}" for i in range(1000) if of(f"{prefix}-{i}") == group)
LEASE = 1.0
HEARTBEAT = 0.25
MARGIN = 2.0  # the loss is seen on a keeper tick, the will is appended and pushed to the other proxy
SEGMENT = 16384
BASE = f"""
[mqtt]
allow_anonymous = true

[discovery]
heartbeat_interval = {HEARTBEAT}
lease = {LEASE}
wheel_tick = 0.05

[store]
segment_size = {SEGMENT}
retention_hours = 0.0002
retention_check_s = 0.2

[native.virtual_queues]
{VIRTUAL} = {list(REAL)!r}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster-wills")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, controllers=3, base_config=str(base))
    doc["root"] = str(root / "c")
    yield doc
    launcher.down(str(root / "c"))


def procs(doc, role: str) -> list[dict]:
    return [p for p in doc["processes"] if p["role"] == role]


def brokers_total(doc, name: str) -> float:
    return sum(metric_value(b["ports"]["http"], name) for b in procs(doc, "broker"))


class Client:
    """A paho v5 client that records what it receives."""

    def __init__(self, client_id: str, port: int, expiry: int = 0, clean: bool = True, will: tuple | None = None):
        self.got: list[tuple[str, bytes, float]] = []
        self.lock = threading.Lock()
        self.acks: list = []
        self.connected = threading.Event()
        self.subacks: set[int] = set()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._message
        self.client.on_connect = self._connack
        self.client.on_subscribe = lambda c, u, mid, codes, p=None: self.subacks.add(mid)
        self.disconnects: list[int] = []
        self.client.on_disconnect = lambda c, u, flags, reason, p=None: self.disconnects.append(reason.value)
        self.client.reconnect_delay_set(3600, 3600)  # a client that is closed stays away (paho would come back)
        if will is not None:
            topic, payload, delay = will
            will_props = Properties(PacketTypes.WILLMESSAGE)
            will_props.WillDelayInterval = delay
            self.client.will_set(topic, payload, qos=1, properties=will_props)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry
        self.client.connect("127.0.0.1", port, clean_start=clean, properties=props)
        self.client.loop_start()
        assert self.connected.wait(15), f"no CONNACK for {client_id}"

    def _connack(self, client, userdata, flags, reason, properties=None):
        self.acks.append((flags.session_present, reason.is_failure))
        self.connected.set()

    def _message(self, client, userdata, message) -> None:
        with self.lock:
            self.got.append((message.topic, message.payload, time.monotonic()))

    def subscribe(self, topic_filter: str) -> None:
        result, mid = self.client.subscribe(topic_filter, 1)
        assert result == 0
        wait_until(lambda: mid in self.subacks, 15, what=f"SUBACK of {topic_filter}")

    def received(self, topic: str) -> list[float]:
        with self.lock:
            return [at for t, _p, at in self.got if t == topic]

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def drop(self) -> None:
        """Stop without a DISCONNECT (the proxy is gone anyway)."""
        self.client.loop_stop()
        self.client.socket() and self.client.socket().close()

    def received_payloads(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p, _at in self.got if t == topic]


def kill(doc, proxy: dict) -> float:
    os.kill(proxy["pid"], signal.SIGKILL)
    wait_until(lambda: not launcher.alive(proxy["pid"]), 10, what=f"{proxy['id']} to die")
    return time.monotonic()


def relaunch(doc, proxy: dict) -> None:
    proxy["pid"] = launcher.relaunch(doc["root"], proxy["id"])["pid"]


def logged_since(proc: dict, offset: int, line: str) -> bool:
    """Whether the process's log holds ``line`` past byte ``offset``."""
    with open(proc["data_dir"] + ".log", "rb") as f:
        f.seek(offset)
        return line.encode() in f.read()


def publish(port: int, topic: str, payloads: list[bytes]) -> None:
    pub = Client("pub-" + topic.replace("/", "-"), port)
    infos = [pub.client.publish(topic, p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(15)
    pub.stop()


def test_a_killed_proxys_will_is_published_and_its_session_expires_and_frees_retention(cluster):
    """SIGKILL the proxy of a v5 client with a will (delay 0) and a session (expiry 5 s) on exp/#: the will
    reaches a subscriber on the other proxy within a lease (+ margin); messages published to exp/ meanwhile are
    kept for the session; after the expiry the session is gone (a reconnect finds none), the brokers hold no
    filter interest for it, and retention deletes the segments it pinned."""
    victim_proxy, other = procs(cluster, "proxy")
    port = other["ports"]["mqtt"]
    watcher = Client("will-watcher", port)
    watcher.subscribe("will/#")
    before_filters = brokers_total(cluster, "twistmq_rpc_session_filters")
    victim = Client("victim", victim_proxy["ports"]["mqtt"], expiry=5, will=("will/victim", b"gone", 0))
    victim.subscribe("exp/#")
    wait_until(lambda: brokers_total(cluster, "twistmq_rpc_session_filters") > before_filters, 10,
               what="the brokers' interest in the stored subscription")
    killed = kill(cluster, victim_proxy)
    victim.drop()
    try:
        wait_until(lambda: watcher.received("will/victim"), LEASE + MARGIN + 5, what="the victim's will")
        took = watcher.received("will/victim")[0] - killed
        assert took <= LEASE + MARGIN, f"the will came {took:.2f} s after the kill"
        assert brokers_total(cluster, "twistmq_session_keeper_wills_published") >= 1

        # Published after the loss: owed to the session, so retention keeps them past their age.
        publish(port, "exp/data", [bytes([i % 256]) * 1024 for i in range(120)])
        full = brokers_total(cluster, "twistmq_store_bytes")
        assert full > 120 * 1024
        if time.monotonic() - killed < 4.0:  # still before the expiry: retention runs every 0.2 s, age 0.72 s
            wait_until(lambda: time.monotonic() - killed > 4.0, 6, what="4 s after the kill")
            assert brokers_total(cluster, "twistmq_session_keeper_sessions_expired") == 0
            assert brokers_total(cluster, "twistmq_store_bytes") > 120 * 1024, "segments owed were deleted"

        wait_until(lambda: brokers_total(cluster, "twistmq_session_keeper_sessions_expired") >= 1, 15,
                   what="the session's expiry by its groups")
        assert time.monotonic() - killed >= 5.0 - 0.1
        wait_until(lambda: brokers_total(cluster, "twistmq_rpc_session_filters") == before_filters, 10,
                   what="the stored subscription's interest released")
        wait_until(lambda: brokers_total(cluster, "twistmq_store_bytes") < full - 100 * 1024, 15,
                   what="retention deleting the segments the session pinned")
        again = Client("victim", port, expiry=5, clean=False)
        assert again.acks == [(False, False)], "the expired session was found"
        again.stop()
    finally:
        watcher.stop()
        relaunch(cluster, victim_proxy)


def test_a_client_back_on_another_proxy_within_its_will_delay_gets_no_will(cluster):
    """SIGKILL the proxy of two clients with a will delay of 4 s and a session of 60 s: the one that reconnects
    on the other proxy (after its group took it over, within the delay) finds its session and gets no will;
    the one that does not come back has its will published after the delay."""
    victim_proxy, other = procs(cluster, "proxy")
    port = other["ports"]["mqtt"]
    watcher = Client("delay-watcher", port)
    watcher.subscribe("will/#")
    back = Client("comes-back", victim_proxy["ports"]["mqtt"], expiry=60, will=("will/back", b"b", 4))
    away = Client("stays-away", victim_proxy["ports"]["mqtt"], expiry=60, will=("will/away", b"a", 4))
    takeovers = brokers_total(cluster, "twistmq_session_keeper_takeovers")
    killed = kill(cluster, victim_proxy)
    back.drop()
    away.drop()
    try:
        wait_until(lambda: brokers_total(cluster, "twistmq_session_keeper_takeovers") >= takeovers + 2, 10,
                   what="the groups taking the sessions over")
        assert time.monotonic() - killed < 4.0, "taken over too late to test the will delay"
        returned = Client("comes-back", port, expiry=60, clean=False)
        assert returned.acks == [(True, False)], "the session the group kept was not found"
        wait_until(lambda: watcher.received("will/away"), 15, what="the will of the client that stayed away")
        assert watcher.received("will/away")[0] - killed >= 4.0 - 0.1
        time.sleep(0.5)  # the returned client's will would have been due with the other's
        assert watcher.received("will/back") == []
        returned.stop()
    finally:
        watcher.stop()
        relaunch(cluster, victim_proxy)


def test_a_proxy_cut_off_from_a_group_for_a_lease_closes_the_sessions_living_there(cluster):
    """SIGSTOP the broker of group g1: after its RPC connections time out and one lease, the proxy closes the
    session homed in g1 (v5 DISCONNECT 0x89) and publishes its will itself (its topic lives in g2), while a
    session with nothing in g1 stays connected; after SIGCONT the proxy hands the session to g1, which expires
    it, and the will was published once."""
    proxy, other = procs(cluster, "proxy")
    g1 = next(b for b in procs(cluster, "broker") if b["group"] == "g1")
    topic_level = named("wt", "g2", TABLE.group_of_topic)
    watcher = Client(named("cut-watch", "g2"), other["ports"]["mqtt"])
    watcher.subscribe(f"{topic_level}/#")
    victim_id = named("cut-victim", "g1")
    victim = Client(victim_id, proxy["ports"]["mqtt"], expiry=5, will=(f"{topic_level}/v", b"cut", 0))
    bystander = Client(named("cut-bystander", "g2"), proxy["ports"]["mqtt"])
    expired = metric_value(g1["ports"]["http"], "twistmq_session_keeper_sessions_expired")
    os.kill(g1["pid"], signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_until(lambda: victim.disconnects, 20, what="the victim closed by its proxy")
        assert victim.disconnects == [0x89]
        took = time.monotonic() - stopped
        assert took >= LEASE, f"closed {took:.2f} s after the group stopped: before a lease"
        wait_until(lambda: watcher.received(f"{topic_level}/v"), 10, what="the victim's will")
        assert bystander.disconnects == [] and watcher.disconnects == []
    finally:
        os.kill(g1["pid"], signal.SIGCONT)
    try:
        wait_until(lambda: metric_value(g1["ports"]["http"], "twistmq_session_keeper_sessions_expired") > expired,
                   30, what="g1 expiring the session handed to it")
        assert watcher.received_payloads(f"{topic_level}/v") == [b"cut"]
        victim.client.loop_stop()
        again = Client(victim_id, other["ports"]["mqtt"], expiry=5, clean=False)
        assert again.acks == [(False, False)], "the session was not expired"
        again.stop()
    finally:
        for c in (watcher, bystander):
            c.stop()


def test_a_taken_over_sessions_will_and_expiry_survive_a_restart_of_its_broker(cluster):
    """SIGKILL a proxy; once group g1 took its session over (will delay 3 s, expiry 6 s), SIGKILL g1's broker and
    start it again: the will is still published (from the stored due time) and the session still expires (this
    one: the restarted broker also expires what the other proxy handed it while g1 was down)."""
    proxy, other = procs(cluster, "proxy")
    g1 = next(b for b in procs(cluster, "broker") if b["group"] == "g1")
    level = named("rt", "g1", TABLE.group_of_topic)
    # a persistent watcher: its stored subscription keeps the broker's interest across the broker's restart
    # homed in g1 too: if its proxy closes it while g1 is down, it is back (with its subscription) once g1 is
    watcher = Client(named("rt-watch", "g1"), other["ports"]["mqtt"], expiry=300, clean=False)
    watcher.client.reconnect_delay_set(0.2, 1)
    watcher.subscribe(f"{level}/#")
    victim_id = named("rt-victim", "g1")
    victim = Client(victim_id, proxy["ports"]["mqtt"], expiry=6, will=(f"{level}/v", b"restart", 3))
    takeovers = metric_value(g1["ports"]["http"], "twistmq_session_keeper_takeovers")
    kill(cluster, proxy)
    victim.drop()
    try:
        wait_until(lambda: metric_value(g1["ports"]["http"], "twistmq_session_keeper_takeovers") > takeovers, 10,
                   what="g1 taking the session over")
        restarted_at = os.path.getsize(g1["data_dir"] + ".log")
        kill(cluster, g1)
        relaunch(cluster, g1)
        wait_until(lambda: watcher.received(f"{level}/v"), 20, what="the will, published after the restart")
        # Not just any expiry: the other proxy, cut off from g1 for a lease by the restart, hands g1 the sessions
        # it kept homed there (a disconnected one of the test before, due within seconds), whose expiry counts too.
        wait_until(lambda: logged_since(g1, restarted_at, f"session_expired client={victim_id} by=group:g1"), 20,
                   what="the session's expiry after the restart")
        assert metric_value(g1["ports"]["http"], "twistmq_session_keeper_sessions_expired") >= 1
        again = Client(victim_id, other["ports"]["mqtt"], expiry=0, clean=False)
        assert again.acks == [(False, False)], "the session survived its expiry"
        again.stop()
    finally:
        watcher.stop()
        relaunch(cluster, proxy)


class _Ports:
    """A process of cluster.json as ``Peer`` dials it."""

    def __init__(self, proc: dict) -> None:
        self.proc = proc

    def port(self, name: str) -> int:
        return self.proc["ports"][name]


def stored_part(doc, broker: dict, client_id: str):
    """Broker ``broker``'s stored part of ``client_id``'s session (a ``SessionState``, or None), read over RPC."""
    peer = Peer(_Ports(broker), cluster_id=doc["cluster_id"], secret="")
    try:
        assert isinstance(peer.next_event(), Opened)
        result = peer.call(request_type("get_session"), store_codec.pack_call("get_session", (client_id,)))
    finally:
        peer.sock.close()
    assert isinstance(result, Result), result
    return store_codec.unpack_result("get_session", result.body)


def test_a_killed_proxys_session_copies_in_other_groups_go_with_its_expiry_unless_its_client_came_back(cluster):
    """SIGKILL the proxy of two clients homed in g1 with only the copy of their meta in g2 (expiry 3 s); once g2
    found the proxy lost, one reconnects through the other proxy: after g1 expired the other, g2 drops its copy
    and the dead proxy's claim (not before the expiry), while the one that came back keeps its copy in g2,
    claimed by its new proxy."""
    victim_proxy, other = procs(cluster, "proxy")
    g1, g2 = (next(b for b in procs(cluster, "broker") if b["group"] == g) for g in ("g1", "g2"))
    gone_id, back_id = named("copy-gone", "g1"), named("copy-back", "g1")
    logs = {b["id"]: os.path.getsize(b["data_dir"] + ".log") for b in (g1, g2)}
    gone = Client(gone_id, victim_proxy["ports"]["mqtt"], expiry=3)
    back = Client(back_id, victim_proxy["ports"]["mqtt"], expiry=3)
    assert stored_part(cluster, g2, gone_id).holder == victim_proxy["id"]
    killed = kill(cluster, victim_proxy)
    gone.drop()
    back.drop()
    returned = None
    try:
        wait_until(lambda: logged_since(g2, logs[g2["id"]], f"sessions_taken_over holder={victim_proxy['id']}"),
                   10, what="g2 finding the proxy lost")
        returned = Client(back_id, other["ports"]["mqtt"], expiry=3, clean=False)
        assert returned.acks == [(True, False)], "the session was not found"
        wait_until(lambda: logged_since(g1, logs[g1["id"]], f"session_expired client={gone_id} by=group:g1"), 15,
                   what="g1 expiring the session")
        wait_until(lambda: stored_part(cluster, g2, gone_id) is None, 10, what="g2 dropping its copy")
        assert time.monotonic() - killed >= 3.0, "dropped before the session's expiry"
        assert logged_since(g2, logs[g2["id"]], f"session_copy_dropped client={gone_id} "
                                                f"holder={victim_proxy['id']} group=g2")
        assert metric_value(g2["ports"]["http"], "twistmq_session_keeper_copies_dropped") >= 1
        # its deadline in g2 was the other's (same loss, same expiry): passed, and nothing dropped
        kept = stored_part(cluster, g2, back_id)
        assert kept is not None and kept.holder == other["id"]
        assert not logged_since(g2, logs[g2["id"]], f"session_copy_dropped client={back_id} ")
    finally:
        if returned is not None:
            returned.stop()
        relaunch(cluster, victim_proxy)


def test_a_virtual_queue_spanning_groups_works_through_either_proxy(cluster):
    """A produce to a virtual queue through proxy 1 reaches each real queue in its own group (routed by its
    name), so a consume of every real queue through proxy 2 gets it."""
    p1, p2 = procs(cluster, "proxy")
    with BlockingClient("127.0.0.1", p1["ports"]["native"]) as a, \
            BlockingClient("127.0.0.1", p2["ports"]["native"]) as b:
        for n in range(3):
            reply = a.request({"action": "produce", "queue": VIRTUAL, "data": f"job {n}"})
            assert reply["code"] == 0 and reply["queue"] == VIRTUAL, reply
        for queue in REAL:
            for n in range(3):
                reply = b.request({"action": "consume", "queue": queue})
                assert reply["code"] == 0 and reply.get("data") == f"job {n}", (queue, reply)
            assert "data" not in b.request({"action": "consume", "queue": queue}), "stored more than once"
