"""Broker and protocol state machines driven by task.Clock and StringTransport over a real store."""

from __future__ import annotations

import pytest
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from cluster.local.store import LocalStore
from lightqueue import attach
from lightqueue.native_engine import NativeEngine
from lightqueue.retained_index import RetainedIndex
from mqtt_proxy.codec import (
    Connect,
    Disconnect,
    MQTTParser,
    Properties,
    PubAck,
    Publish,
    ReasonCode,
    Subscribe,
    Subscription,
    SubscriptionOptions,
    encode,
)
from mqtt_proxy.codec.packets import ConnAck, SubAck, Will
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.protocol import MQTTServerFactory
from push.notifier import Notifier
from store.config import NativeConfig, StoreConfig
from store.executor import DeferredExecutor, SynchronousExecutor
from store.kv import DurableKV
from store.message_store import MessageStore
from store.session_log import SessionLog
from store.session_store import SessionStore
from store.timer_service import TimerService


class Harness:
    """A broker over a real store in a temp dir, with a fake clock and in-memory transports."""

    def __init__(self, path, limits=None, store_config=None, executor=None, own_holder="",
                 log_connections=True, left_wills=False) -> None:
        self.clock = task.Clock()
        self.clock.advance(1_700_000_000)
        self.executor = executor or SynchronousExecutor()
        self.store = MessageStore(str(path), store_config or StoreConfig(), self.clock, self.executor)
        attach(self.store)
        self.retained = RetainedIndex(str(path / "retained"))
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, str(path / "timer"), self.clock, 100, slot_count=600)
        self.kv = DurableKV(str(path / "sessions"), self.clock)
        self.session_log = SessionLog(self.store, self.kv, self.clock)  # session state through the log
        self.native_kv = DurableKV(str(path / "native"), self.clock)
        self.notifier = Notifier(self.clock)
        self.store.add_listener(self.notifier.notify_now)  # as cluster/local/parts.py wires it
        self.store.open()
        self.session_log.open()
        self.timers.start()
        engine = NativeEngine(self.store, self.native_kv, NativeConfig(), self.clock, self.timers)
        self.local = LocalStore(self.store, self.notifier, self.retained, self.timers, SessionStore(self.session_log),
                                engine, own_holder=own_holder)
        self.broker = build_front_end(self.local, self.clock, MQTTConfig(sys_interval=0), limits or LimitsConfig(),
                                      log_connections=log_connections, left_wills=left_wills)
        self.factory = MQTTServerFactory(self.broker, self.clock)

    def connect(self, client_id, level=5, **kw):
        proto = self.factory.buildProtocol(None)
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        proto.makeConnection(transport)
        conn = Conn(self, proto, transport, level)
        conn.send(Connect(client_id=client_id, protocol_level=level, **kw))
        return conn

    def tick(self, seconds=0.0):
        self.clock.advance(seconds)
        for _ in range(5):
            self.clock.advance(0)

    def close(self):
        self.session_log.stop()
        self.timers.stop()
        self.store.close()
        self.kv.close()
        self.native_kv.close()


class Conn:
    def __init__(self, h, proto, transport, level):
        self.h, self.proto, self.transport, self.level = h, proto, transport, level
        self.parser = MQTTParser(server_side=False, protocol_level=level)

    def send(self, packet):
        self.proto.dataReceived(encode(packet, self.level))
        self.h.tick()

    def received(self):
        data = self.transport.value()
        self.transport.clear()
        return self.parser.feed(data)

    def lose(self):
        self.proto.connectionLost(None)
        self.h.tick()


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def published(conn):
    return [p for p in conn.received() if isinstance(p, Publish)]


def test_connect_timeout_aborts(h):
    """A connection that sends no CONNECT within 10 s is dropped."""
    proto = h.factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    h.clock.advance(9)
    assert not transport.disconnecting
    h.clock.advance(1.5)
    assert transport.disconnecting or getattr(transport, "disconnected", False)


def test_keep_alive_one_and_a_half_times(h):
    """Keep-alive 10 s: still open at 14 s, DISCONNECT 0x8D and the will at 15 s."""
    watcher = h.connect("watcher")
    watcher.send(Subscribe(1, (Subscription("will/ka"),)))
    watcher.received()
    c = h.connect("sleepy", keep_alive=10, will=Will("will/ka", b"bye"))
    assert isinstance(c.received()[0], ConnAck)
    h.tick(14)
    assert not c.transport.disconnecting
    h.tick(1.1)
    assert c.received()[-1].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert [p.payload for p in published(watcher)] == [b"bye"]


def test_traffic_resets_keep_alive(h):
    """Any packet from the client restarts the keep-alive clock."""
    c = h.connect("chatty", keep_alive=10)
    for _ in range(5):
        h.tick(9)
        c.send(Publish("t/x", b"."))
    assert not c.transport.disconnecting


def test_keep_alive_zero_never_expires(h):
    """Keep-alive 0 turns the mechanism off (MQTT-3.1.2-24 applies only to a non-zero value)."""
    c = h.connect("forever", keep_alive=0)
    assert isinstance(c.received()[0], ConnAck)
    h.tick(100_000)
    assert not c.transport.disconnecting


def test_idle_connections_share_one_timer(h):
    """A thousand connected clients with keep-alives hold one pending call between them, not one each."""
    before = len(h.clock.getDelayedCalls())
    conns = [h.connect(f"idle{i}", level=4, keep_alive=60 + i % 7) for i in range(1000)]
    assert all(isinstance(c.received()[0], ConnAck) for c in conns)
    assert len(h.clock.getDelayedCalls()) <= before + 1
    h.tick(60 * 1.5 - 1)
    assert not any(c.transport.disconnecting for c in conns)
    h.tick(10)
    assert all(c.transport.disconnecting for c in conns) and h.broker.sessions == {}


def test_an_idle_connection_holds_no_instance_dicts_or_empty_containers(h):
    """The per-client objects are slotted and an idle client holds no set, list or dict made just in case."""
    c = h.connect("lean", level=4, keep_alive=60)
    assert isinstance(c.received()[0], ConnAck)
    session = c.proto.session
    for obj in (c.proto, c.proto.parser, session, session.state):
        assert not hasattr(obj, "__dict__"), type(obj).__name__
    assert c.proto.inbound_aliases is None and c.proto._backlog is None and c.proto.asked is None
    assert session.state.aliases is None and not isinstance(session.state.inbound_qos2, (set, dict))


def test_an_idle_clients_objects_stay_within_their_size_classes(h):
    """An idle client's protocol, parser, session and session state take 224, 80, 232 and 160 bytes at most
    (CPython's allocator rounds to 16: a slot more on any of them costs every connection 16 bytes; the session's
    three slots for QoS 1 in flight not yet written cost 32)."""
    import sys
    c = h.connect("sized", level=4, keep_alive=60)
    session = c.proto.session
    sizes = {type(o).__name__: sys.getsizeof(o) for o in (c.proto, c.proto.parser, session, session.state)}
    limits = {"MQTTServerProtocol": 224, "MQTTParser": 80, "Session": 232, "SessionState": 160}
    assert all(sizes[name] <= limit for name, limit in limits.items()), sizes


def test_idle_connections_with_one_keep_alive_share_its_int(h):
    """Clients asking the same keep-alive (past the small ints Python shares) hold one int object for it."""
    a, b = h.connect("ka1", level=4, keep_alive=300), h.connect("ka2", level=4, keep_alive=300)
    assert a.proto._keep_alive == 300 and a.proto._keep_alive is b.proto._keep_alive


def test_takeover_disconnects_old_connection_with_0x8e(h):
    """A second connection with the same client id closes the first with SESSION_TAKEN_OVER."""
    first = h.connect("twin")
    first.received()
    second = h.connect("twin")
    assert isinstance(second.received()[0], ConnAck)
    out = first.received()
    assert out[-1] == Disconnect(ReasonCode.SESSION_TAKEN_OVER)
    assert first.transport.disconnecting


def test_normal_disconnect_sends_no_will_but_0x04_does(h):
    """DISCONNECT 0x00 discards the will; DISCONNECT 0x04 publishes it."""
    watcher = h.connect("w2")
    watcher.send(Subscribe(1, (Subscription("will/+"),)))
    watcher.received()
    a = h.connect("polite", will=Will("will/a", b"a"))
    a.send(Disconnect())
    b = h.connect("asks", will=Will("will/b", b"b"))
    b.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    assert [p.payload for p in published(watcher)] == [b"b"]


def test_will_delay_and_cancel_on_return(h):
    """A delayed will waits its delay; a client returning in time cancels it."""
    watcher = h.connect("w3")
    watcher.send(Subscribe(1, (Subscription("will/d/+"),)))
    watcher.received()
    persist = Properties(session_expiry_interval=60)
    will_props = Properties(will_delay_interval=5)
    a = h.connect("late", properties=persist, will=Will("will/d/late", b"late", properties=will_props))
    a.lose()
    h.tick(4)
    assert published(watcher) == []
    h.tick(1.1)
    assert [p.payload for p in published(watcher)] == [b"late"]
    b = h.connect("back", properties=persist, will=Will("will/d/back", b"back", properties=will_props))
    b.lose()
    h.tick(2)
    h.connect("back", clean_start=False, properties=persist)
    h.tick(10)
    assert published(watcher) == []


def test_session_expiry_forgets_session(h):
    """A session with expiry 10 s is gone 10 s after its client left, and kept before."""
    c = h.connect("brief", properties=Properties(session_expiry_interval=10))
    c.send(Subscribe(1, (Subscription("exp/x", SubscriptionOptions(qos=1)),)))
    c.lose()
    h.tick(9)
    assert "brief" in h.broker.sessions
    h.tick(1.5)
    assert "brief" not in h.broker.sessions
    again = h.connect("brief", clean_start=False, properties=Properties(session_expiry_interval=10))
    assert again.received()[0].session_present is False


def test_slow_consumer_is_paused_and_resumed(h):
    """When the transport pauses the protocol, nothing more is pushed; resuming sends the rest."""
    sub = h.connect("slow")
    sub.send(Subscribe(1, (Subscription("slow/t"),)))
    sub.received()
    sub.proto.pauseProducing()
    pub = h.connect("fast")
    for i in range(10):
        pub.send(Publish("slow/t", b"%d" % i))
    assert published(sub) == []
    sub.proto.resumeProducing()
    h.tick()
    assert [p.payload for p in published(sub)] == [b"%d" % i for i in range(10)]


def test_publisher_reading_pauses_while_store_lags(tmp_path):
    """With puts waiting on a slow fsync, the broker stops reading the publisher's socket, then resumes."""
    executor = DeferredExecutor()
    h = Harness(tmp_path, limits=LimitsConfig(max_pending_puts=4), store_config=StoreConfig(flush="sync"),
                executor=executor)
    try:
        pub = h.connect("eager")
        executor.run_pending()
        h.tick()
        pub.received()
        for i in range(6):
            pub.send(Publish("lag/t", b"x", qos=1, packet_id=i + 1))
        assert pub.transport.producerState == "paused"
        executor.run_pending()
        h.tick()
        assert pub.transport.producerState == "producing"
        assert [type(p) for p in pub.received()] == [PubAck] * 6
    finally:
        h.close()


def test_max_connections_refused_with_quota_exceeded(tmp_path):
    """Over max_connections, a v5 CONNECT gets CONNACK 0x97 and the others keep working."""
    h = Harness(tmp_path, limits=LimitsConfig(max_connections=1))
    try:
        ok = h.connect("one")
        assert ok.received()[0].reason_code == 0
        refused = h.connect("two")
        assert refused.received()[0].reason_code == ReasonCode.QUOTA_EXCEEDED
        ok.send(Subscribe(1, (Subscription("still/ok"),)))
        assert isinstance(ok.received()[0], SubAck)
    finally:
        h.close()


@pytest.mark.parametrize("level", [4, 5])
def test_pubacks_of_one_batch_go_out_in_one_write_per_connection_in_order(h, level):
    """The PUBACKs of one tick's QoS 1 publishes are one transport write per publisher, in PUBLISH order."""
    pubs = [h.connect(f"pub{i}", level=level) for i in range(2)]
    for pub in pubs:
        pub.received()
    writes = {}
    for pub in pubs:
        real = pub.transport.write
        writes[pub] = []
        pub.transport.write = lambda data, real=real, log=writes[pub]: (log.append(data), real(data))
    ids = [7, 3, 65535, 1, 200]
    for pub in pubs:  # one read each: every PUBLISH lands in the same batch
        pub.proto.dataReceived(b"".join(encode(Publish("dev/p/t", b"x", qos=1, packet_id=i), level) for i in ids))
    h.tick()
    for pub in pubs:
        assert len(writes[pub]) == 1
        assert [(type(p), p.packet_id) for p in pub.received()] == [(PubAck, i) for i in ids]


def test_a_shared_message_dropped_as_too_large_is_done_with_for_the_group(h):
    """MQTT-3.1.2-25: a group's QoS 1 message over its member's Maximum Packet Size is discarded as if delivered, so
    the group's committed position moves past it (it is not held as in flight forever)."""
    member = h.connect("member", properties=Properties(maximum_packet_size=64))
    member.send(Subscribe(1, (Subscription("$share/g/big/#", SubscriptionOptions(qos=1)),),
                          properties=Properties()))
    member.received()
    pub = h.connect("pub")
    pub.send(Publish("big/1", b"x" * 200, qos=1, packet_id=1))
    pub.send(Publish("big/1", b"small", qos=1, packet_id=2))
    h.tick()
    (sent,) = published(member)
    assert sent.payload == b"small"
    member.send(PubAck(sent.packet_id))
    (group,) = h.broker.router.groups.values()
    (cursor,) = group.cursors.values()
    assert cursor.inflight == {} and cursor.committed == cursor.next


class _FillingTransport(StringTransport):
    """A transport whose write buffer fills past ``limit`` bytes, as a socket's does: it pauses its producer."""

    limit = 65536

    def write(self, data):
        super().write(data)
        if self.producer is not None and len(self.io.getvalue()) > self.limit and not self.producerState == "paused":
            self.producerState = "paused"
            self.producer.pauseProducing()

    def drained(self):
        """The peer read everything: the buffer is empty and the producer resumes."""
        data = self.value()
        self.clear()
        self.producerState = "producing"
        self.producer.resumeProducing()
        return data


def test_expired_messages_are_counted_once_when_back_pressure_stops_a_read(h):
    """MQTT-3.3.2-5: messages found expired after the point where a full connection stopped a read are read again
    later; each is counted once in messages_expired."""
    sub = h.connect("late", clean_start=False, properties=Properties(session_expiry_interval=600))
    sub.send(Subscribe(1, (Subscription("bp/#", SubscriptionOptions(qos=0)),)))
    sub.lose()
    pub = h.connect("pub")
    for i in range(100):
        pub.send(Publish("bp/big", b"x" * 1000))
    for i in range(5):
        pub.send(Publish("bp/short", b"s", properties=Properties(message_expiry_interval=1)))
    h.tick(2)
    before = h.broker.stats.messages_expired
    proto = h.factory.buildProtocol(None)
    transport = _FillingTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40001))
    proto.makeConnection(transport)
    conn = Conn(h, proto, transport, 5)
    conn.send(Connect(client_id="late", protocol_level=5, clean_start=False,
                      properties=Properties(session_expiry_interval=600)))
    received = conn.parser.feed(transport.drained())
    for _ in range(10):
        h.tick()
        received += conn.parser.feed(transport.drained())
    assert sum(1 for p in received if isinstance(p, Publish)) == 100
    assert h.broker.stats.messages_expired - before == 5


def test_connection_lines_off_make_no_log_record(tmp_path):
    """With connection lines off ([log] connection_messages = false) connect and disconnect make no log record
    at all (not one made and filtered); other lines of the registry still come."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("twistmq.mqtt.broker")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    quiet = Harness(tmp_path, log_connections=False)
    try:
        first = quiet.connect("quiet", level=5)
        first.received()
        second = quiet.connect("quiet", level=5)  # a takeover is still logged
        second.received()
        second.send(Disconnect())
        events = [str(r.msg).split(" ", 1)[0] for r in records]
        assert "client_connected" not in events and "client_disconnected" not in events
        assert "session_taken_over" in events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        quiet.close()
