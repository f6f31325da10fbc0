"""Resource bounds of issue 26 on a real node: nothing a client does grows the broker without a bound.

- retained messages on SUBSCRIBE obey the client's queue (``[limits] max_queued_bytes``);
- topic matching work per publish is bounded whatever filters clients hold (``[store] max_filter_shapes``);
- before CONNACK a peer may not make the broker buffer more than ``[limits] max_connect_bytes``;
- topic consume queues are capped (``[store] max_topic_queues``) and collected when idle.

One node for the module, clients from fresh 127.0.x.y source addresses (``SourceClient``).
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from mqtt_proxy.codec import (Properties, Publish, PubAck, Subscribe, Subscription, SubscriptionOptions, SubAck,
                              encode)
from tests.integration.admin_support import call
from tests.integration.mqtt_raw import Closed
from tests.integration.node import NodeProcess
from tests.integration.security_support import (SourceClient, anon_rss_kib, assert_serving, http_get, raw,
                                                unique, write_config)
from tests.integration.waiting import wait_until

MAX_QUEUED = 65536
MAX_TOPIC_QUEUES = 100
RETENTION_HOURS = 0.002  # 7.2 s: idle topic queues go within a test's patience
QUOTA_EXCEEDED = 0x97

pytestmark = pytest.mark.slow  # ~35 s: megabytes of retained traffic, 10,000 filters, trickled bytes, an idle-queue collection


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("bounds-conf"), f"""\
[mqtt]
sys_interval = 0
[limits]
max_queued_bytes = {MAX_QUEUED}
[store]
max_topic_queues = {MAX_TOPIC_QUEUES}
retention_hours = {RETENTION_HOURS}
retention_check_s = 1.0
""")
    n = NodeProcess(str(tmp_path_factory.mktemp("bounds") / "data"), extra_args=["--config", config]).start()
    yield n
    n.stop()


def metric(node, name: str) -> float:
    """One counter of /metrics (0 when the node does not export it)."""
    _, text = http_get(node)
    m = re.search(rf"^{name}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def node_cpu_s(pid: int) -> float:
    """utime + stime of the node process, in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def topic_queue_names(node) -> list[str]:
    """First levels that have a topic consume queue (admin API, every page)."""
    names, cursor = [], None
    for _ in range(100):
        path = "/api/v1/topics?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        status, _, body = call(node.port("http"), "GET", path)
        assert status == 200, body
        names.extend(item["topic"] for item in body["items"])
        cursor = body["next"]
        if cursor is None:
            return names
    raise AssertionError("topics listing did not end")


def wait_for(condition, timeout: float, what: str) -> None:
    wait_until(condition, timeout, interval=0.1, what=what)


# -- retained messages on SUBSCRIBE ---------------------------------------------------------------

RETAINED = 100
RETAINED_BYTES = 8192
RESUBSCRIBES = 60


def test_retained_on_subscribe_obeys_the_queue_limit(node):
    """A client that never reads and SUBSCRIBEs again and again holds a bounded queue; the rest is counted."""
    prefix = unique("ret")
    pub = raw(node.port())
    for i in range(RETAINED):
        pub.send(Publish(f"{prefix}/{i}", bytes([i]) * RETAINED_BYTES, qos=1, retain=True, packet_id=i + 1))
        pub.recv_until(PubAck)
    pub.close()
    victim = SourceClient(node.port(), 5, rcvbuf=4096)
    assert victim.connect(unique("never-reads")).reason_code == 0
    before = anon_rss_kib(node.proc.pid)
    dropped_before = metric(node, "twistmq_retained_queue_dropped_messages")
    subscribe = encode(Subscribe(1, (Subscription(prefix + "/#", SubscriptionOptions(qos=0)),)), 5)
    for _ in range(RESUBSCRIBES):
        victim.send_raw(subscribe)  # 13 + len(prefix) bytes each, never a read
    # Each SUBSCRIBE finds 800 KiB of retained messages: unbounded, that is ~48 MiB of buffers.
    expected_drops = (RESUBSCRIBES - 2) * RETAINED
    grown = [0]

    def settled() -> bool:
        grown[0] = anon_rss_kib(node.proc.pid) - before
        return grown[0] > 24 * 1024 or \
            metric(node, "twistmq_retained_queue_dropped_messages") - dropped_before >= expected_drops

    wait_for(settled, 30, "the SUBSCRIBEs to be answered")
    time.sleep(0.5)
    grown_mib = (anon_rss_kib(node.proc.pid) - before) / 1024
    assert grown_mib < 8, f"broker grew {grown_mib:.1f} MiB for {RESUBSCRIBES} SUBSCRIBEs of a client that never reads"
    assert metric(node, "twistmq_retained_queue_dropped_messages") - dropped_before >= expected_drops
    # What was kept is delivered as the client reads, retain flag set.
    victim.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    got = [p for p in victim.recv_all(quiet=1.0) if isinstance(p, Publish)]
    assert len(got) >= MAX_QUEUED // RETAINED_BYTES, len(got)
    assert all(p.retain and p.topic.startswith(prefix + "/") for p in got)
    victim.close()
    assert_serving(node.port())


def test_retained_are_all_delivered_to_a_client_that_reads(node):
    """Retained messages that fit the queue all arrive, in full, to a client that reads as they come."""
    prefix = unique("ret-ok")
    pub = raw(node.port())
    for i in range(5):
        pub.send(Publish(f"{prefix}/{i}", bytes([i]) * 1000, qos=1, retain=True, packet_id=i + 1))
        pub.recv_until(PubAck)
    pub.close()
    c = raw(node.port())
    c.send(Subscribe(1, (Subscription(prefix + "/#", SubscriptionOptions(qos=1)),)))
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        p = c.recv()
        if isinstance(p, Publish):
            got.append(p)
            c.send(PubAck(p.packet_id))
    assert sorted(p.topic for p in got) == sorted(f"{prefix}/{i}" for i in range(5))
    assert all(p.retain for p in got)
    c.close()


# -- topic matching cost -------------------------------------------------------------------------

SESSIONS = 10
FILTERS = 1000
LEVELS = 32
PUBLISHES = 100


def adversarial_filters(session: int) -> list[str]:
    """1,000 filters of 32 levels, ``+`` or ``a`` by the bits of a counter, ending in a level no topic has."""
    out = []
    for i in range(FILTERS):
        n = session * FILTERS + i
        levels = ["+" if (n * 2654435761 >> bit) & 1 else "a" for bit in range(LEVELS - 1)]
        out.append("/".join(levels + [f"z{n}"]))
    return out


def test_topic_matching_work_per_publish_is_bounded(node):
    """10 persistent sessions x 1,000 mixed +/literal 32-level filters: publishes stay cheap, others served."""
    holders = []
    refused = 0
    for s in range(SESSIONS):
        c = SourceClient(node.port(), 4)
        assert c.connect(unique("filters"), clean_start=False).reason_code == 0
        c.send(Subscribe(1, tuple(Subscription(f, SubscriptionOptions(qos=0)) for f in adversarial_filters(s))))
        ack, _ = c.recv_until(SubAck, timeout=30)
        assert len(ack.reason_codes) == FILTERS
        refused += sum(1 for code in ack.reason_codes if code >= 0x80)
        holders.append(c)
    pub = raw(node.port())
    topic = "/".join(["a"] * (LEVELS - 1))
    cpu0 = node_cpu_s(node.proc.pid)
    t0 = time.monotonic()
    for i in range(PUBLISHES):  # each level "a", the last varies: a per-topic cache cannot help
        pub.send(Publish(f"{topic}/v{i}", b"x", qos=1, packet_id=i + 1))
        pub.recv_until(PubAck, timeout=30)
    cpu_ms = (node_cpu_s(node.proc.pid) - cpu0) * 1000 / PUBLISHES
    wall_ms = (time.monotonic() - t0) * 1000 / PUBLISHES
    pub.close()
    # Uncapped, each of these publishes walks ~200,000 trie nodes: ~50 ms of CPU.
    assert cpu_ms < 5, f"{cpu_ms:.1f} ms of node CPU per publish ({wall_ms:.1f} ms wall)"
    assert refused > 0, "the filter-shape cap refused none of the adversarial filters"
    assert metric(node, "twistmq_filters_refused") >= refused
    assert_serving(node.port())
    for c in holders:
        c.close()


# -- buffering before CONNACK ---------------------------------------------------------------------

PEERS = 100
ANNOUNCED = 900_000  # under max_packet_size (1 MiB), far over max_connect_bytes (64 KiB)
SENT = 832 * 1024


def test_unauthenticated_peer_cannot_make_the_broker_buffer_a_large_packet(node):
    """A peer announcing a 900 KB CONNECT is closed at its header: 100 such peers cost the broker ~80 MiB no more."""
    before = anon_rss_kib(node.proc.pid)
    header = bytes([0x10]) + _varint(ANNOUNCED)
    chunk = b"\x00" * 65536
    peers = []
    for _ in range(PEERS):
        c = SourceClient(node.port(), 4)
        peers.append(c)
        c.sock.settimeout(5)
        try:
            c.send_raw(header)
            for _ in range(SENT // len(chunk)):
                c.send_raw(chunk)
        except OSError:
            pass  # closed by the broker while we wrote: what the bound is for
    time.sleep(0.5)
    grown_mib = (anon_rss_kib(node.proc.pid) - before) / 1024
    # Unbounded that is ~80 MiB; bounded, what is left is the allocator's high-water mark of one read per peer.
    assert grown_mib < 30, f"broker grew {grown_mib:.1f} MiB holding {PEERS} unauthenticated partial packets"
    for c in peers:
        with pytest.raises((Closed, ConnectionError)):
            c.recv(timeout=5)
        c.close()
    assert_serving(node.port())


TRICKLERS = 200
TRICKLE_BYTES = 1500


def test_a_peer_writing_a_byte_at_a_time_costs_a_byte_per_byte(node):
    """200 unauthenticated peers each sending a CONNECT one byte per write: the broker holds ~the bytes only."""
    socks = []
    for _ in range(TRICKLERS):
        c = SourceClient(node.port(), 4)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.send_raw(bytes([0x10]) + _varint(60_000))  # a CONNECT within max_connect_bytes, sent slowly
        socks.append(c)
    before = anon_rss_kib(node.proc.pid)
    for _ in range(TRICKLE_BYTES):  # rounds of one byte per peer, each read by the broker alone
        for c in socks:
            c.sock.send(b"\x00")
        time.sleep(0.002)
    grown_mib = (anon_rss_kib(node.proc.pid) - before) / 1024
    for c in socks:
        c.close()
    # An object per read: ~28 MiB here (~100 B per byte sent); one bytearray per peer: ~0.2 MiB.
    assert grown_mib < 8, f"broker grew {grown_mib:.1f} MiB for {TRICKLERS * TRICKLE_BYTES:,} bytes trickled"
    assert_serving(node.port())


def test_a_normal_connect_and_a_large_publish_after_connack_still_work(node):
    """The bound is lifted at CONNACK: a 500 KB PUBLISH after connecting is accepted."""
    c = raw(node.port())
    c.send(Publish(unique("big"), b"p" * 500_000, qos=1, packet_id=1))
    ack, _ = c.recv_until(PubAck, timeout=10)
    assert ack.reason_code == 0
    c.close()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# -- topic consume queues ------------------------------------------------------------------------

FIRST_LEVELS = 300


def test_topic_queues_are_capped_counted_and_collected_when_idle(node):
    """Past max_topic_queues new first levels are counted (MQTT delivery goes on); idle ones are collected."""
    tag = unique("tq")
    sub = raw(node.port())
    sub.send(Subscribe(1, (Subscription(f"+/{tag}", SubscriptionOptions(qos=0)),)))
    sub.recv_until(SubAck)
    refused_before = metric(node, "twistmq_topic_queue_refused_messages")
    pub = raw(node.port())
    for i in range(FIRST_LEVELS):
        pub.send(Publish(f"fl{i}-{tag}/{tag}", b"x", qos=1, packet_id=i % 60000 + 1))
        ack, _ = pub.recv_until(PubAck)
        assert ack.reason_code == 0
    got = [p for p in sub.recv_all(quiet=1.0) if isinstance(p, Publish)]
    assert len(got) == FIRST_LEVELS, "every publish reaches the MQTT subscriber, indexed in a topic queue or not"
    names = topic_queue_names(node)
    assert len(names) <= MAX_TOPIC_QUEUES, len(names)
    refused = metric(node, "twistmq_topic_queue_refused_messages") - refused_before
    assert refused >= FIRST_LEVELS - MAX_TOPIC_QUEUES, refused
    # Idle for a retention period (7.2 s here) and read by nobody: collected.
    wait_for(lambda: not any(n.endswith(tag) for n in topic_queue_names(node)), 30, "idle topic queues to go")
    pub.send(Publish(f"fresh-{tag}/{tag}", b"x", qos=1, packet_id=1))
    pub.recv_until(PubAck)
    assert f"fresh-{tag}" in topic_queue_names(node)  # room again for a new first level
    pub.close()
    sub.close()


def test_stored_subscriptions_survive_a_lowered_shape_cap(tmp_path):
    """A restart with a max_filter_shapes below what stored sessions hold restores them all, and they deliver."""
    data = str(tmp_path / "data")
    filters = ["caps/+/a", "caps/x/+/b", "+/y/+/+/c"]  # several shapes each
    (tmp_path / "wide").mkdir()
    wide = NodeProcess(data, extra_args=["--config", write_config(tmp_path / "wide", "[mqtt]\nsys_interval = 0\n")])
    wide.start()
    try:
        for i, topic_filter in enumerate(filters):
            c = raw(wide.port(), client_id=f"capped-{i}", clean_start=False,
                    properties=_expiry(3600))
            c.send(Subscribe(1, (Subscription(topic_filter, SubscriptionOptions(qos=1)),)))
            assert c.recv_until(SubAck)[0].reason_codes == (1,)
            c.close()
    finally:
        wide.stop()
    (tmp_path / "narrow").mkdir()
    narrow = NodeProcess(data, extra_args=["--config", write_config(
        tmp_path / "narrow", "[mqtt]\nsys_interval = 0\n[store]\nmax_filter_shapes = 2\n")]).start()
    try:
        topics = ["caps/1/a", "caps/x/2/b", "q/y/r/s/c"]
        got = []
        for i, topic in enumerate(topics):
            c = raw(narrow.port(), client_id=f"capped-{i}", clean_start=False, properties=_expiry(3600))
            pub = raw(narrow.port(), client_id=unique("capped-pub"))
            pub.send(Publish(topic, b"kept", qos=1, packet_id=1))
            pub.recv_until(PubAck)
            pub.close()
            packet, _ = c.recv_until(Publish)
            got.append(packet.topic)
            c.close()
        assert got == topics
        refused = raw(narrow.port(), client_id=unique("capped-new"))
        refused.send(Subscribe(1, (Subscription("new/+/+/+/shape", SubscriptionOptions(qos=1)),)))
        assert refused.recv_until(SubAck)[0].reason_codes == (QUOTA_EXCEEDED,)  # new SUBSCRIBEs meet the cap
        refused.close()
    finally:
        narrow.stop()


def _expiry(seconds: int) -> Properties:
    return Properties(session_expiry_interval=seconds)
