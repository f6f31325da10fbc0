"""Retention over a real store, light queues, retained index, MQTT broker and native engine, on a task.Clock.

Segment ages are file mtimes (wall time), so the clock starts at the wall time
and a "retention run" first moves it past the retention.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import namedtuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from cluster.local.native_service import NativeService
from cluster.local.store import LocalStore
from lightqueue import attach
from lightqueue.retained_index import RetainedIndex
from mqtt_proxy.codec import (
    Connect,
    MQTTParser,
    Properties,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
    SubscriptionOptions,
    encode,
)
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.native import codec as native_codec
from mqtt_proxy.protocol import MQTTServerFactory
from push.notifier import Notifier
from store.config import NativeConfig, StoreConfig
from store.executor import SynchronousExecutor
from store.kv import DurableKV
from store.message_store import MessageStore
from store.session_store import SessionStore
from store.timer_service import TimerService

RETENTION_S = 10.0
PERSIST = Properties(session_expiry_interval=86400)


class Node:
    """One node's parts wired as the node role wires them (retention holders and carrier included)."""

    def __init__(self, path, clock=None, **store_cfg) -> None:
        self.path = str(path)
        self.closed = False
        self.store_cfg = store_cfg
        cfg = {"segment_size": 4096, "retention_hours": RETENTION_S / 3600, "disk_max_used_ratio": 1.0,
               "retention_check_s": 1e6, **store_cfg}
        if clock is None:
            clock = task.Clock()
            clock.advance(time.time())
        self.clock = clock
        self.store = MessageStore(self.path, StoreConfig(**cfg), clock, SynchronousExecutor())
        self.index = attach(self.store)
        self.retained = RetainedIndex(os.path.join(self.path, "retained"))
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, os.path.join(self.path, "timer"), clock, 100, slot_count=600)
        self.kv = DurableKV(os.path.join(self.path, "sessions"), clock)
        self.notifier = Notifier(clock)
        self.store.add_listener(self.notifier.notify_now)
        self.native = NativeService(self.store, self.path, NativeConfig(max_reconsume=2), clock, self.timers)
        self.store.open()  # after the native service: its state log replays as a dispatcher
        self.timers.start()
        self.local = LocalStore(self.store, self.notifier, self.retained, self.timers, SessionStore(self.kv),
                                self.native.engine)
        self.broker = build_front_end(self.local, clock, MQTTConfig(sys_interval=0), LimitsConfig())
        self.native.open()
        self.store.retention.add_holder(self.broker.owed)
        self.store.retention.add_holder(self.native.engine.owed)
        self.store.retention.add_carrier(self.retained.records_to_carry)
        self.factory = MQTTServerFactory(self.broker, clock)
        self.tick()
        self.broker.restore()
        self.tick()

    def tick(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        for _ in range(5):
            self.clock.advance(0)

    def retention(self):
        """Age every segment past the retention, then run one pass; returns its report."""
        self.tick(RETENTION_S + 1)
        out = []
        self.store.apply_retention().addCallback(out.append)
        self.tick()
        assert out, "retention did not finish"
        return out[0]

    def connect(self, client_id, clean=False):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        proto.makeConnection(transport)
        conn = Conn(self, proto, transport)
        conn.send(Connect(client_id=client_id, protocol_level=5, clean_start=clean, properties=PERSIST))
        return conn

    def native_call(self, **request):
        req = native_codec.parse_request(json.dumps(request).encode(), self.native.config)
        out = []
        self.native.engine.handle(req).addCallback(out.append)
        self.tick()
        assert out, "no reply"
        return out[0]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.native.stop()
        self.timers.stop()
        self.store.close()
        self.kv.close()
        self.tick()

    def segments(self) -> int:
        return len(self.store.commit_log.segments())

    def restart(self) -> "Node":
        """A clean stop and start on the same directory and clock."""
        for conn in list(self.broker.connections):
            conn.transport.loseConnection()
        self.broker.shutdown()
        self.tick()
        self.close()
        return Node(self.path, self.clock, **self.store_cfg)


class Conn:
    def __init__(self, node, proto, transport) -> None:
        self.node, self.proto, self.transport = node, proto, transport
        self.parser = MQTTParser(server_side=False, protocol_level=5)

    def send(self, packet) -> None:
        self.proto.dataReceived(encode(packet, 5))
        self.node.tick()

    def drain(self) -> list[bytes]:
        """Every PUBLISH that arrives, acknowledged, until nothing more comes."""
        got = []
        while True:
            packets = [p for p in self.parser.feed(self.transport.value()) if isinstance(p, Publish)]
            self.transport.clear()
            if not packets:
                return got
            for p in packets:
                got.append(p.payload)
                if p.qos:
                    self.proto.dataReceived(encode(PubAck(p.packet_id), 5))
            self.node.tick()

    def close(self) -> None:
        self.proto.connectionLost(None)
        self.node.tick()


def _subscribe(node, client_id, topic_filter) -> None:
    c = node.connect(client_id, clean=True)
    c.send(Subscribe(1, (Subscription(topic_filter, SubscriptionOptions(qos=1)),)))
    c.close()


def _publish(node, topic, payloads, retain=False) -> None:
    c = node.connect(f"pub-{time.monotonic_ns()}", clean=True)
    for i, p in enumerate(payloads):
        c.proto.dataReceived(encode(Publish(topic, p, qos=1, packet_id=i % 60000 + 1, retain=retain), 5))
        if i % 50 == 0:
            node.tick()
    node.tick()
    c.close()


def _numbers(payloads) -> list[int]:
    return [int(p[:6]) for p in payloads]


def _msgs(start, n, size=100):
    return [b"%06d" % i + b"x" * (size - 6) for i in range(start, start + n)]


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path / "n")
    yield n
    n.close()


def test_offline_backlog_outlives_age_retention_then_is_freed(node):
    """An offline session's messages stay however old; once delivered, one run frees all but the active segment."""
    _subscribe(node, "off", "a/#")
    _publish(node, "a/1", _msgs(0, 300))
    assert node.segments() > 5
    for _ in range(3):
        report = node.retention()
        assert report.deleted == [] and report.floor is not None
    c = node.connect("off")
    assert _numbers(c.drain()) == list(range(300))
    report = node.retention()
    assert node.segments() == 1 and len(report.deleted) > 5


def test_retention_deletes_what_nobody_owes(node):
    """Messages no session subscribed to go at the first run after their age (the log does not grow forever)."""
    _publish(node, "nobody/1", _msgs(0, 200))
    node.retention()
    assert node.segments() == 1


def test_connected_session_in_flight_messages_are_owed(node):
    """A QoS 1 message sent but not acknowledged pins its segment until the PUBACK."""
    _subscribe(node, "slow", "s/#")
    c = node.connect("slow")
    _publish(node, "s/1", _msgs(0, 1))
    unacked = [p for p in c.parser.feed(c.transport.value()) if isinstance(p, Publish)]
    c.transport.clear()
    assert len(unacked) == 1
    _publish(node, "other/1", _msgs(1, 200))
    node.retention()
    first = node.store.commit_log.segments()[0]
    assert first.base == 0  # the segment of the unacknowledged message is kept
    c.send(PubAck(unacked[0].packet_id))
    node.retention()
    assert node.segments() == 1


def test_shared_group_offset_is_owed(node):
    """A shared subscription group's committed offset holds the log for its offline members."""
    _subscribe(node, "m1", "$share/g/sh/#")
    _publish(node, "sh/1", _msgs(0, 150))
    node.retention()
    assert node.store.commit_log.min_offset == 0
    c = node.connect("m1")
    assert _numbers(c.drain()) == list(range(150))
    node.retention()
    assert node.segments() == 1


def test_retained_message_is_carried_and_survives_restart_and_full_replay(node, tmp_path):
    """A retained message outlives the deletion of its segment, a restart, and an index rebuilt from the log."""
    _publish(node, "keep/r", [b"value"], retain=True)
    _publish(node, "noise/1", _msgs(0, 200))
    report = node.retention()
    assert report.carried == 1 and node.store.commit_log.min_offset > 0
    n2 = node.restart()
    assert n2.retained.get("keep/r") is not None
    n2.close()
    shutil.rmtree(os.path.join(n2.path, "retained"))  # rebuilt from what the log still holds
    n3 = Node(n2.path, n2.clock)
    c = n3.connect("reader", clean=True)
    c.send(Subscribe(1, (Subscription("keep/#", SubscriptionOptions(qos=1)),)))
    assert c.drain() == [b"value"]
    n3.close()


def test_cleared_retained_message_is_not_revived_by_its_carried_copy(node):
    """A topic cleared after its retained message was carried stays cleared, even on a full replay."""
    _publish(node, "keep/c", [b"old"], retain=True)
    _publish(node, "noise/1", _msgs(0, 200))
    assert node.retention().carried == 1
    _publish(node, "keep/c", [b""], retain=True)
    assert node.retained.get("keep/c") is None
    node.close()
    shutil.rmtree(os.path.join(node.path, "retained"))
    n2 = Node(node.path, node.clock)
    assert n2.retained.get("keep/c") is None
    n2.close()


def test_disk_quota_drops_owed_messages_counts_them_once_and_the_session_resumes_after_the_gap(tmp_path, caplog):
    """Only the disk limit deletes owed messages: counted per queue once, logged with owner and offsets."""
    node = Node(tmp_path / "q", disk_quota_mb=1, retention_hours=1000.0)
    _subscribe(node, "lagging", "q/#")
    _publish(node, "q/1", _msgs(0, 3000, size=1000))
    total = 0
    for _ in range(3):
        report = node.retention()
        total += report.dropped.get("%LMQ%q/#", 0)
    assert total > 0 and node.store.retention.dropped["%LMQ%q/#"] == total
    assert "retention_dropped_owed queue=%LMQ%q/# owner='session lagging' queue_offsets=[0," in caplog.text
    c = node.connect("lagging")
    assert _numbers(c.drain()) == list(range(total, 3000))
    assert node.broker.sessions["lagging"].subs["q/#"].dropped == total
    assert node.broker.stats.messages_gap == total
    node.close()


def test_disk_used_ratio_forces_deletion(node):
    """A file system fuller than disk_max_used_ratio makes retention delete owed segments too."""
    _subscribe(node, "lag", "r/#")
    _publish(node, "r/1", _msgs(0, 200))
    full = namedtuple("statvfs", "f_blocks f_frsize f_bfree f_bavail")(1000, 4096, 10, 10)  # 99 % used
    node.store.config = StoreConfig(**{**node.store.config.__dict__, "disk_max_used_ratio": 0.5})
    node.store.retention.statvfs = lambda _path: full
    report = node.retention()
    assert report.reason == "disk_limit" and report.dropped["%LMQ%r/#"] > 0
    assert node.segments() == 1


def test_disk_used_ratio_is_df_use_percent(node):
    """The ratio is df's Use% (used over used + available): blocks reserved for root do not count as used."""
    _subscribe(node, "lag", "r/#")
    _publish(node, "r/1", _msgs(0, 200))
    # 1,000 blocks, 700 free of which 600 are reserved for root: df says 300 / (300 + 100) = 75 % used.
    reserved = namedtuple("statvfs", "f_blocks f_frsize f_bfree f_bavail")(1000, 4096, 700, 100)
    node.store.config = StoreConfig(**{**node.store.config.__dict__, "disk_max_used_ratio": 0.8})
    node.store.retention.statvfs = lambda _path: reserved
    report = node.retention()
    assert report.reason != "disk_limit" and not report.dropped
    node.store.config = StoreConfig(**{**node.store.config.__dict__, "disk_max_used_ratio": 0.7})
    report = node.retention()
    assert report.reason == "disk_limit" and report.dropped["%LMQ%r/#"] > 0


def test_native_queue_unread_and_pop_invisible_messages_are_owed(node):
    """A native queue nobody consumed yet and a popped, unacknowledged message both hold their segments."""
    ids = [node.native_call(action=1, queue="jobs", data=f"{i:06d}" + "y" * 100)["msg_id"] for i in range(50)]
    node.native_call(action=1, queue="popq", data="hidden")
    popped = node.native_call(action=11, queue="popq", invisible_time=3600)
    _publish(node, "noise/1", _msgs(0, 200))
    node.retention()
    assert node.store.commit_log.min_offset == 0
    assert [node.native_call(action=2, queue="jobs")["msg_id"] for _ in range(50)] == ids
    node.retention()
    assert node.store.commit_log.min_offset > 0 and node.segments() > 1  # the popped message still holds
    node.tick(3600)
    again = node.native_call(action=11, queue="popq")
    assert again["msg_id"] == popped["msg_id"]
    node.native_call(action=12, queue="popq", msg_id=again["msg_id"])
    node.retention()
    assert node.segments() == 1


def test_expired_native_messages_do_not_hold_the_log(node):
    """Messages whose ttl ended are skipped at the queue's head (counted expired) and stop holding the log."""
    for i in range(100):
        node.native_call(action=1, queue="short", data="x" * 100, ttl=5)
    node.retention()  # ages the segments past the 5 s ttl too
    node.retention()
    assert node.segments() == 1
    assert node.native.engine.counters["expired"] == 100


def test_pop_moves_a_message_to_the_dead_letter_queue_after_max_reconsume(node):
    """A popped message handed out more than max_reconsume times goes to %DLQ%group, from where it can be re-driven."""
    produced = node.native_call(action=1, queue="work", data="poison")
    attempts = []
    for _ in range(3):  # max_reconsume=2: the first hand-out and two redeliveries
        r = node.native_call(action=11, queue="work", group="g", invisible_time=1)
        attempts.append(r.get("attempts", 1))
        node.tick(1.1)
    assert attempts == [1, 2, 3]
    assert "data" not in node.native_call(action=11, queue="work", group="g")  # moved, not redelivered
    dead = node.native_call(action=2, queue="%DLQ%g")
    assert dead["data"] == "poison" and dead["dlq_queue"] == "work" and dead["dlq_msg_id"] == produced["msg_id"]
    node.native_call(action=1, queue=dead["dlq_queue"], data=dead["data"])  # re-drive
    assert node.native_call(action=11, queue="work", group="g")["data"] == "poison"
    assert node.native.engine.counters["dead_lettered"] == 1


def test_pending_delayed_message_survives_retention(node):
    """A delayed message whose TIMER record's segment ages out is still delivered when due."""
    node.native_call(action=1, queue="later", data="wake", delay=60)
    _publish(node, "noise/1", _msgs(0, 200))
    for _ in range(8):
        node.retention()
    node.tick(60)
    assert node.native_call(action=2, queue="later")["data"] == "wake"


# -- property: no owed message is lost below the disk limits -------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 80)),
    st.tuples(st.just("produce"), st.integers(1, 40)),
    st.tuples(st.just("consume"), st.integers(1, 40)),
    st.tuples(st.just("connect"), st.just(0)),
    st.tuples(st.just("disconnect"), st.just(0)),
    st.tuples(st.just("subscribe2"), st.just(0)),
    st.tuples(st.just("retention"), st.just(0)),
    st.tuples(st.just("restart"), st.just(0)),
), min_size=1, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_no_owed_message_is_lost(tmp_path_factory, ops):
    """Random publish/subscribe/disconnect/consume/retention/restart sequences: every owed message arrives once."""
    node = Node(tmp_path_factory.mktemp("prop"))
    _subscribe(node, "s1", "p/#")
    expected = {"s1": [], "s2": None}
    got = {"s1": [], "s2": []}
    produced, consumed = [], []
    conn = None
    n = 0
    try:
        for op, k in ops:
            if op == "publish":
                _publish(node, f"p/{n % 3}", _msgs(n, k))
                for sid in expected:
                    if expected[sid] is not None:
                        expected[sid].extend(range(n, n + k))
                n += k
            elif op == "produce":
                for _ in range(k):
                    produced.append(node.native_call(action=1, queue="pq", data="d" * 80)["msg_id"])
            elif op == "consume":
                for _ in range(k):
                    r = node.native_call(action=2, queue="pq")
                    if "data" in r:
                        consumed.append(r["msg_id"])
            elif op == "connect" and conn is None:
                conn = node.connect("s1")
                got["s1"].extend(_numbers(conn.drain()))
            elif op == "disconnect" and conn is not None:
                got["s1"].extend(_numbers(conn.drain()))
                conn.close()
                conn = None
            elif op == "subscribe2" and expected["s2"] is None:
                _subscribe(node, "s2", "p/+")
                expected["s2"] = []
            elif op == "retention":
                if conn is not None:
                    got["s1"].extend(_numbers(conn.drain()))
                node.retention()
            elif op == "restart":
                if conn is not None:
                    got["s1"].extend(_numbers(conn.drain()))
                    conn = None
                node = node.restart()
        if conn is not None:
            got["s1"].extend(_numbers(conn.drain()))
            conn.close()
        for sid in expected:
            if expected[sid] is not None:
                c = node.connect(sid)
                got[sid].extend(_numbers(c.drain()))
                c.close()
                assert sorted(set(got[sid])) == expected[sid], sid
        while True:
            r = node.native_call(action=2, queue="pq")
            if "data" not in r:
                break
            consumed.append(r["msg_id"])
        assert consumed == produced
        assert sum(node.store.retention.dropped.values()) == 0
    finally:
        node.close()
