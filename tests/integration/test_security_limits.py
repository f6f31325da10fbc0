"""Every ``[limits]`` key (and ``max_inflight``) hit once on a real node, with raw codec clients for exact codes.

Each test hits its limit, checks the v5 reason code or the 3.1.1 close, then
checks the broker still serves a fresh pair of clients. Clients connect from
fresh 127.0.x.y source addresses (``SourceClient``) so that only the
connection-rate test, which uses one fixed address, trips the per-address rate.
"""

from __future__ import annotations

import time

import pytest

from mqtt_proxy.codec import ConnAck, Disconnect, PubAck, Publish, encode
from tests.integration.mqtt_raw import Closed
from tests.integration.node import NodeProcess
from tests.integration.security_support import (SourceClient, anon_rss_kib, assert_serving, http_get, publishes,
                                                raw, subscribe, subscribe_many, unique, write_config)
from tests.integration.waiting import CLOCK_MARGIN_S, open_connections, wait_until

LEVELS = pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])

MAX_CONNECTIONS = 8
MAX_RATE = 3
MAX_PACKET = 131072
MAX_PAYLOAD = 65536
MAX_TOPIC_LENGTH = 64
MAX_TOPIC_LEVELS = 4
MAX_SUBSCRIPTIONS = 3
MAX_INFLIGHT = 3
MAX_QUEUED = 65536
MAX_RETAINED = 3
MAX_RETAINED_BYTES = 3000

pytestmark = pytest.mark.slow  # ~20 s: it moves 30 MB through the store for the queued-bytes test


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("limits-conf"), f"""\
[mqtt]
max_inflight = {MAX_INFLIGHT}
sys_interval = 0
[limits]
max_connections = {MAX_CONNECTIONS}
max_connection_rate = {MAX_RATE}
max_packet_size = {MAX_PACKET}
max_payload = {MAX_PAYLOAD}
max_topic_length = {MAX_TOPIC_LENGTH}
max_topic_levels = {MAX_TOPIC_LEVELS}
max_subscriptions = {MAX_SUBSCRIPTIONS}
max_queued_bytes = {MAX_QUEUED}
max_retained_messages = {MAX_RETAINED}
max_retained_bytes = {MAX_RETAINED_BYTES}
""")
    n = NodeProcess(str(tmp_path_factory.mktemp("limits") / "data"), extra_args=["--config", config]).start()
    yield n
    n.stop()


def closed_with(c, level: int, reason: int) -> None:
    """v5: the server sends DISCONNECT with *reason* and closes; 3.1.1: it just closes."""
    got = c.expect_closed()
    if level == 5:
        assert got and isinstance(got[-1], Disconnect), got
        assert got[-1].reason_code == reason, got
    else:
        assert not any(isinstance(p, Disconnect) for p in got), got


def refused(c, ack, level: int, reason: int) -> None:
    """v5: CONNACK with *reason*; 3.1.1: no successful CONNACK; closed either way."""
    if level == 5:
        assert isinstance(ack, ConnAck) and ack.reason_code == reason, ack
    else:
        assert ack is None or (isinstance(ack, ConnAck) and ack.reason_code != 0), ack
    c.expect_closed()


def try_connect(port: int, level: int, source: str | None = None):
    """Connect; return (client, CONNACK or None when closed without one)."""
    c = SourceClient(port, level, source=source)
    try:
        return c, c.connect(unique("lim"))
    except Closed:
        return c, None


# -- connections -----------------------------------------------------------------------------------

def test_max_connections(node):
    """Past max_connections a v5 client gets CONNACK 0x97 and a 3.1.1 one is closed; one leaving makes room."""
    wait_until(lambda: open_connections(node) == 0, what="connections of earlier tests to finish closing")
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            c, ack = try_connect(node.port(), 5)
            held.append(c)
            assert ack is not None and ack.reason_code == 0, ack
        c, ack = try_connect(node.port(), 5)
        refused(c, ack, 5, 0x97)
        c.close()
        c, ack = try_connect(node.port(), 4)
        refused(c, ack, 4, 0x97)
        c.close()
        held.pop().close()
        deadline = time.monotonic() + 3
        while True:  # the server sees the close a moment later
            c, ack = try_connect(node.port(), 5)
            if ack is not None and ack.reason_code == 0:
                held.append(c)
                break
            c.close()
            assert time.monotonic() < deadline, "no room after a client left"
            time.sleep(0.05)
    finally:
        for c in held:
            c.close()
    wait_until(lambda: open_connections(node) == 0, what="the held connections to close")
    assert_serving(node.port())
    status, metrics = http_get(node)
    assert status == 200 and "twistmq_connections_refused_total" in metrics


def test_max_connection_rate(node):
    """More than max_connection_rate connections in a second from one address: 0x9F (v5), closed (3.1.1)."""
    source = "127.0.0.2"
    if time.time() % 1 > 0.4:
        time.sleep(1 - time.time() % 1 + 0.01)  # start early in a second: the rate window is per second
    for _ in range(MAX_RATE):
        c, ack = try_connect(node.port(), 5, source)
        c.close()
        assert ack is not None and ack.reason_code == 0, ack
    c, ack = try_connect(node.port(), 5, source)
    refused(c, ack, 5, 0x9F)
    c.close()
    c, ack = try_connect(node.port(), 4, source)
    refused(c, ack, 4, 0x9F)
    c.close()
    assert_serving(node.port())  # other addresses are not affected
    # The rate window is the node's wall-clock second: the address may come back in the next one.
    time.sleep(1 - time.time() % 1 + CLOCK_MARGIN_S)
    c, ack = try_connect(node.port(), 5, source)
    c.close()
    assert ack is not None and ack.reason_code == 0, ack


# -- packets, payloads, topics ---------------------------------------------------------------------

@LEVELS
def test_max_packet_size(node, level):
    """A packet larger than max_packet_size: DISCONNECT 0x95 (v5) or a close (3.1.1), judged from its header."""
    c = raw(node.port(), level)
    data = encode(Publish("big/packet", b"x" * (MAX_PACKET + 10), qos=0), level)
    c.send_raw(data[:200])  # the remaining length in the fixed header is enough to refuse it
    closed_with(c, level, 0x95)
    c.close()
    assert_serving(node.port(), level)


@LEVELS
def test_max_payload(node, level):
    """A PUBLISH whose payload exceeds max_payload (but fits max_packet_size): DISCONNECT 0x95 (v5) or a close."""
    c = raw(node.port(), level)
    c.send(Publish("big/payload", b"x" * (MAX_PAYLOAD + 1), qos=1, packet_id=1))
    closed_with(c, level, 0x95)
    c.close()
    assert_serving(node.port(), level)


@LEVELS
@pytest.mark.parametrize("topic", ["t/" + "x" * MAX_TOPIC_LENGTH, "a/b/c/d/e"], ids=["length", "levels"])
def test_publish_topic_limits(node, level, topic):
    """Publishing to a topic over max_topic_length or max_topic_levels: DISCONNECT 0x90 (v5) or a close (3.1.1)."""
    c = raw(node.port(), level)
    c.send(Publish(topic, b"x", qos=1, packet_id=1))
    closed_with(c, level, 0x90)
    c.close()
    assert_serving(node.port(), level)


@LEVELS
def test_subscribe_topic_limits(node, level):
    """Filters over max_topic_length or max_topic_levels get SUBACK 0x8F (v5) / 0x80 (3.1.1); the link stays up."""
    c = raw(node.port(), level)
    try:
        ack = subscribe_many(c, ["f/" + "x" * MAX_TOPIC_LENGTH, "a/b/c/d/e", "a/b/c/d", "a/+/c/#"])
        bad = 0x8F if level == 5 else 0x80
        assert ack.reason_codes == (bad, bad, 1, 1)
    finally:
        c.close()
    assert_serving(node.port(), level)


@LEVELS
def test_max_subscriptions(node, level):
    """The subscription past max_subscriptions gets SUBACK 0x97 (v5) / 0x80 (3.1.1); re-subscribing still works."""
    c = raw(node.port(), level)
    try:
        tag = unique("s")
        filters = [f"subs/{tag}/{i}" for i in range(MAX_SUBSCRIPTIONS + 1)]
        bad = 0x97 if level == 5 else 0x80
        ack = subscribe_many(c, filters)
        assert ack.reason_codes == (1,) * MAX_SUBSCRIPTIONS + (bad,)
        assert subscribe(c, filters[0], qos=0, pid=2).reason_codes == (0,)  # changing an existing one is fine
        assert subscribe(c, f"subs/{tag}/other", pid=3).reason_codes == (bad,)
    finally:
        c.close()
    assert_serving(node.port(), level)


# -- flow: in flight and queued bytes --------------------------------------------------------------

@LEVELS
def test_max_inflight(node, level):
    """A subscriber that does not acknowledge never has more than max_inflight QoS 1 messages in flight."""
    topic = "inflight/" + unique("t")
    sub = raw(node.port(), level)
    pub = raw(node.port(), level)
    try:
        assert subscribe(sub, topic, qos=1).reason_codes == (1,)
        total = 10
        for i in range(1, total + 1):
            pub.send(Publish(topic, b"m%d" % i, qos=1, packet_id=i))
        acked = 0
        while acked < total:
            ack, _ = pub.recv_until(PubAck)
            acked += 1
        first = publishes(sub.recv_all(0.5))
        assert len(first) == MAX_INFLIGHT, [p.payload for p in first]
        sub.send(PubAck(first[0].packet_id))
        more = publishes(sub.recv_all(0.5))
        assert len(more) == 1, [p.payload for p in more]
        received = first + more
        pending = [p.packet_id for p in received[1:]]
        deadline = time.monotonic() + 10
        while len(received) < total:  # acknowledge one at a time: never more than max_inflight outstanding
            assert time.monotonic() < deadline
            sub.send(PubAck(pending.pop(0)))
            new = publishes(sub.recv_all(0.2))
            assert len(pending) + len(new) <= MAX_INFLIGHT
            received += new
            pending += [p.packet_id for p in new]
        assert [p.payload for p in received] == [b"m%d" % i for i in range(1, total + 1)]
    finally:
        sub.close()
        pub.close()
    assert_serving(node.port(), level)


def _publish_volume(port: int, topic: str, count: int, payload: bytes) -> None:
    """Publish *count* QoS 1 messages in windows of 20, waiting for every PUBACK (the store is not flooded)."""
    pub = raw(port, 5)
    try:
        window = 20
        for start in range(0, count, window):
            for i in range(start, start + window):
                pub.send(Publish(topic, payload, qos=1, packet_id=i % 60000 + 1))
            for _ in range(window):
                ack, _ = pub.recv_until(PubAck, timeout=20)
                assert ack.reason_code == 0
    finally:
        pub.close()


def _growth_mib(node, action) -> float:
    """Anonymous memory the node gained while *action* ran (after a short settle), in MiB."""
    before = anon_rss_kib(node.proc.pid)
    action()
    time.sleep(0.5)
    return (anon_rss_kib(node.proc.pid) - before) / 1024


VOLUME_PAYLOAD = b"q" * 60000
VOLUME_COUNT = 500  # 30 MB


def test_max_queued_bytes_slow_subscriber(node):
    """A subscriber that never reads does not grow the broker's memory; others and /metrics keep being served.

    The store keeps recent records in memory whoever reads them, so the same
    volume is first published with no subscriber: the stalled subscriber may
    only add about max_queued_bytes (plus small change) on top of that.
    """
    tag = unique("slow")
    control = _growth_mib(node, lambda: _publish_volume(node.port(), f"control/{tag}", VOLUME_COUNT,
                                                        VOLUME_PAYLOAD))
    slow = SourceClient(node.port(), 5, rcvbuf=4096)
    try:
        assert slow.connect(unique("slow")).reason_code == 0
        assert subscribe(slow, f"slow/{tag}/#", qos=0).reason_codes == (0,)
        stalled = _growth_mib(node, lambda: _publish_volume(node.port(), f"slow/{tag}/m", VOLUME_COUNT,
                                                            VOLUME_PAYLOAD))
        # Unbounded buffering would add the whole 30 MB; a bounded queue adds max_queued_bytes (64 KiB).
        assert stalled - control < 10, \
            f"stalled subscriber cost {stalled - control:.1f} MiB ({stalled=:.1f}, {control=:.1f})"
        status, metrics = http_get(node)
        assert status == 200 and "twistmq_messages_received" in metrics
        assert_serving(node.port())
        # The stalled subscriber was paused, not dropped: once it reads, messages flow again.
        msg, _ = slow.recv_until(Publish, timeout=10)
        assert msg.topic == f"slow/{tag}/m" and len(msg.payload) == len(VOLUME_PAYLOAD)
    finally:
        slow.close()


def test_published_volume_does_not_grow_memory(node):
    """Publishing 90 MB that nobody reads leaves the broker's memory growth well under the volume published."""
    tag = unique("vol")
    grown = sum(_growth_mib(node, lambda i=i: _publish_volume(node.port(), f"volume/{tag}/{i}", VOLUME_COUNT,
                                                               VOLUME_PAYLOAD)) for i in range(3))
    assert grown < 45, f"broker memory grew by {grown:.1f} MiB for 90 MB published to no subscriber"


# -- retained --------------------------------------------------------------------------------------

def _retain(c, topic: str, payload: bytes, pid: int):
    c.send(Publish(topic, payload, qos=1, packet_id=pid, retain=True))
    ack, _ = c.recv_until(PubAck)
    return ack.reason_code


def test_max_retained_messages_and_bytes(node):
    """Retaining past max_retained_messages or max_retained_bytes: PUBACK 0x97 (v5), a close (3.1.1)."""
    tag = unique("ret")
    topics = [f"ret/{tag}/{i}" for i in range(MAX_RETAINED + 1)]
    c = raw(node.port(), 5)
    try:
        # bytes: one big retained message, then one that would go past max_retained_bytes
        assert _retain(c, topics[0], b"b" * (MAX_RETAINED_BYTES - 500), 1) == 0
        assert _retain(c, topics[1], b"b" * 1000, 2) == 0x97
        assert _retain(c, topics[0], b"", 3) == 0  # clear it
        # count: max_retained messages fit, one more does not; replacing one still does
        for i in range(MAX_RETAINED):
            assert _retain(c, topics[i], b"small", 10 + i) == 0, i
        assert _retain(c, topics[MAX_RETAINED], b"small", 20) == 0x97
        assert _retain(c, topics[0], b"replaced", 21) == 0
        # the refused ones were not retained
        probe = raw(node.port(), 5)
        try:
            assert subscribe(probe, f"ret/{tag}/#", qos=0).reason_codes == (0,)
            got = {p.topic: p.payload for p in publishes(probe.recv_all(0.5))}
            assert got == {topics[0]: b"replaced", topics[1]: b"small", topics[2]: b"small"}
        finally:
            probe.close()
    finally:
        c.close()
    old = raw(node.port(), 4)
    old.send(Publish(topics[MAX_RETAINED], b"small", qos=1, packet_id=1, retain=True))
    got = old.expect_closed()
    assert not any(isinstance(p, PubAck) and p.reason_code == 0 for p in got), got
    old.close()
    assert_serving(node.port())
    c = raw(node.port(), 5)
    try:
        for i in range(MAX_RETAINED):
            assert _retain(c, topics[i], b"", 30 + i) == 0  # clearing always works
    finally:
        c.close()
