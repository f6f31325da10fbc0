"""Wire-exact MQTT behaviour of a real node: reason codes, packet ids, flow control, bad input."""

from __future__ import annotations

import itertools
import time

import pytest

from mqtt_proxy.codec import (
    ConnAck, Disconnect, Properties, PubAck, PubComp, Publish, PubRec, PubRel, ReasonCode, SubAck, Subscribe,
    Subscription, SubscriptionOptions, UnsubAck, Unsubscribe,
)
from mqtt_proxy.codec.packets import PingReq, PingResp
from tests.integration.mqtt_raw import RawClient
from tests.integration.node import NodeProcess
from tests.integration.waiting import CLOCK_MARGIN_S, QUIET_PERIOD

_ids = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = tmp_path_factory.mktemp("conf") / "twistmq.toml"
    config.write_text("[mqtt]\nreceive_maximum = 5\ntopic_alias_maximum = 4\nmax_keep_alive = 30\n"
                      "[limits]\nmax_packet_size = 4096\n")
    n = NodeProcess(str(tmp_path_factory.mktemp("wire") / "data"), extra_args=["--config", str(config)]).start()
    yield n
    n.stop()


def client(node, level=5, **connect):
    c = RawClient(node.port(), level)
    ack = c.connect(f"wire-{next(_ids)}", **connect)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return c


def subscribe(c, topic_filter, qos=1, pid=1, **opts):
    c.send(Subscribe(pid, (Subscription(topic_filter, SubscriptionOptions(qos=qos, **opts)),)))
    ack, _ = c.recv_until(SubAck)
    return ack


def test_connack_announces_server_limits(node):
    """A v5 CONNACK carries receive maximum, topic alias maximum, maximum packet size and server keep alive."""
    c = RawClient(node.port(), 5)
    ack = c.connect("wire-limits", keep_alive=0)
    p = ack.properties
    assert (p.receive_maximum, p.topic_alias_maximum, p.maximum_packet_size, p.server_keep_alive) == (5, 4, 4096, 30)
    c.close()


def test_assigned_client_identifier(node):
    """An empty client id gets an assigned one in v5, and is refused with 0x02 in 3.1.1 without clean session."""
    c = RawClient(node.port(), 5)
    ack = c.connect("")
    assert ack.reason_code == 0 and ack.properties.assigned_client_identifier
    c.close()
    c = RawClient(node.port(), 4)
    ack = c.connect("", clean_start=False)
    assert ack.reason_code == 0x02
    c.expect_closed()


def test_qos2_outbound_flow_and_dup(node):
    """QoS 2 to a subscriber: PUBLISH, PUBREC, PUBREL, PUBCOMP; a reconnect resends unacked with DUP and same id."""
    sub = RawClient(node.port(), 5)
    assert sub.connect("wire-q2sub", clean_start=True,
                       properties=Properties(session_expiry_interval=60)).reason_code == 0
    subscribe(sub, "wire/q2/#", qos=2)
    pub = client(node)
    pub.send(Publish("wire/q2/a", b"one", qos=2, packet_id=10))
    assert pub.recv() == PubRec(10)
    pub.send(PubRel(10))
    assert pub.recv() == PubComp(10)
    msg, _ = sub.recv_until(Publish)
    assert (msg.payload, msg.qos, msg.dup) == (b"one", 2, False)
    sub.close()  # no PUBREC: the message stays in flight
    sub = RawClient(node.port(), 5)
    ack = sub.connect("wire-q2sub", clean_start=False, properties=Properties(session_expiry_interval=60))
    assert ack.session_present
    again, _ = sub.recv_until(Publish)
    assert (again.payload, again.packet_id, again.dup) == (b"one", msg.packet_id, True)
    sub.send(PubRec(again.packet_id))
    assert sub.recv() == PubRel(again.packet_id)
    sub.send(PubComp(again.packet_id))
    assert sub.recv_all() == []
    sub.close()
    pub.close()


def test_qos2_inbound_duplicate_not_stored_twice(node):
    """A QoS 2 PUBLISH resent with DUP before PUBREL is acknowledged but delivered once."""
    sub = client(node)
    subscribe(sub, "wire/once", qos=0)
    pub = client(node)
    pub.send(Publish("wire/once", b"x", qos=2, packet_id=3))
    assert pub.recv() == PubRec(3)
    pub.send(Publish("wire/once", b"x", qos=2, packet_id=3, dup=True))
    assert pub.recv() == PubRec(3)
    pub.send(PubRel(3))
    assert pub.recv() == PubComp(3)
    got = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"x"]


def test_pubrel_unknown_packet_id(node):
    """PUBREL for an unknown packet id answers PUBCOMP 0x92 (v5)."""
    c = client(node)
    c.send(PubRel(999))
    assert c.recv() == PubComp(999, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)


def test_client_receive_maximum_is_respected(node):
    """With client Receive Maximum 2 the broker has at most 2 QoS 1 messages in flight, and sends more on PUBACK."""
    sub = RawClient(node.port(), 5)
    sub.connect("wire-rm", properties=Properties(receive_maximum=2))
    subscribe(sub, "wire/rm", qos=1)
    pub = client(node)
    for i in range(6):
        pub.send(Publish("wire/rm", b"%d" % i, qos=1, packet_id=i + 1))
    assert [type(p) for p in [pub.recv() for _ in range(6)]] == [PubAck] * 6
    first = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert len(first) == 2
    sub.send(PubAck(first[0].packet_id))
    more = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert len(more) == 1
    sub.close()
    pub.close()


def test_server_receive_maximum_exceeded(node):
    """More unacknowledged QoS 2 PUBLISHes than our Receive Maximum (5) gets DISCONNECT 0x93."""
    c = client(node)
    for i in range(1, 7):
        c.send(Publish("wire/flood", b"x", qos=2, packet_id=i))
    packets = c.expect_closed()
    assert packets[-1] == Disconnect(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED, packets[-1].properties)


def test_topic_alias_inbound_and_invalid(node):
    """A topic alias set by the client is reused with an empty topic; an alias above the maximum gets 0x94."""
    sub = client(node)
    subscribe(sub, "wire/alias", qos=0)
    pub = client(node)
    pub.send(Publish("wire/alias", b"a", properties=Properties(topic_alias=1)))
    pub.send(Publish("", b"b", properties=Properties(topic_alias=1)))
    got = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert [(p.topic, p.payload) for p in got] == [("wire/alias", b"a"), ("wire/alias", b"b")]
    pub.send(Publish("wire/alias", b"c", properties=Properties(topic_alias=9)))
    assert pub.expect_closed()[-1].reason_code == ReasonCode.TOPIC_ALIAS_INVALID


def test_topic_alias_outbound(node):
    """A client that accepts aliases gets the topic once, then the alias with an empty topic."""
    sub = RawClient(node.port(), 5)
    sub.connect("wire-alias-out", properties=Properties(topic_alias_maximum=2))
    subscribe(sub, "wire/aout", qos=0)
    pub = client(node)
    pub.send(Publish("wire/aout", b"1"))
    pub.send(Publish("wire/aout", b"2"))
    got = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert [(p.topic, p.properties.topic_alias) for p in got] == [("wire/aout", 1), ("", 1)]


def test_maximum_packet_size_both_ways(node):
    """A packet over our 4096-byte maximum gets DISCONNECT 0x95; a message over the client's maximum is not sent."""
    sub = RawClient(node.port(), 5)
    sub.connect("wire-mps", properties=Properties(maximum_packet_size=200))
    subscribe(sub, "wire/mps", qos=1)
    pub = client(node)
    pub.send(Publish("wire/mps", b"x" * 500, qos=1, packet_id=1))
    pub.send(Publish("wire/mps", b"small", qos=1, packet_id=2))
    got = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"small"]
    pub.send(Publish("wire/mps", b"x" * 5000, qos=0))
    assert pub.expect_closed()[-1].reason_code == ReasonCode.PACKET_TOO_LARGE


def test_malformed_packet_closes_only_that_connection(node):
    """A malformed packet gets DISCONNECT 0x81 and the other clients carry on."""
    other = client(node)
    subscribe(other, "wire/alive", qos=0)
    bad = client(node)
    bad.send_raw(b"\x30\x05\x00\x09abc")  # topic length past the end of the packet
    packets = bad.expect_closed()
    assert packets[-1].reason_code == ReasonCode.MALFORMED_PACKET
    pub = client(node)
    pub.send(Publish("wire/alive", b"still here"))
    got = [p for p in other.recv_all(0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"still here"]


def test_v311_bad_first_packet_closes(node):
    """A first packet that is not CONNECT closes the connection without an answer."""
    c = RawClient(node.port(), 4)
    c.send(PingReq())
    assert c.expect_closed() == []


def test_unsupported_protocol_level(node):
    """CONNECT with protocol level 3 gets CONNACK 0x01 (3.1.1) and a close."""
    c = RawClient(node.port(), 4)
    c.send_raw(b"\x10\x0e\x00\x04MQTT\x03\x02\x00\x3c\x00\x02ab")
    packets = c.expect_closed()
    assert packets and packets[0].reason_code == 1


def test_second_connect_is_a_protocol_error(node):
    """A second CONNECT on one connection is a protocol error (0x82)."""
    c = client(node)
    from mqtt_proxy.codec.packets import Connect
    c.send(Connect(client_id="again", protocol_level=5))
    assert c.expect_closed()[-1].reason_code == ReasonCode.PROTOCOL_ERROR


def test_subscribe_reason_codes(node):
    """Invalid filters get 0x8F in v5 and 0x80 in 3.1.1; UNSUBACK says whether a subscription existed."""
    c = client(node)
    c.send(Subscribe(1, (Subscription("a/#/b"), Subscription("ok/+", SubscriptionOptions(qos=2)))))
    ack, _ = c.recv_until(SubAck)
    assert ack.reason_codes == (ReasonCode.TOPIC_FILTER_INVALID, 2)
    c.send(Unsubscribe(2, ("ok/+", "never")))
    ack, _ = c.recv_until(UnsubAck)
    assert ack.reason_codes == (0, ReasonCode.NO_SUBSCRIPTION_EXISTED)
    c4 = client(node, level=4)
    c4.send(Subscribe(1, (Subscription("a/#/b"),)))
    ack, _ = c4.recv_until(SubAck)
    assert ack.reason_codes == (0x80,)


def test_no_local_and_subscription_identifier(node):
    """No-local hides our own publishes; the subscription identifier comes back on each message."""
    c = client(node)
    c.send(Subscribe(1, (Subscription("wire/nl", SubscriptionOptions(qos=0, no_local=True)),),
                     Properties(subscription_identifiers=(7,))))
    c.recv_until(SubAck)
    c.send(Subscribe(2, (Subscription("wire/sid/+", SubscriptionOptions(qos=0)),),
                     Properties(subscription_identifiers=(42,))))
    c.recv_until(SubAck)
    c.send(Publish("wire/nl", b"mine"))
    other = client(node)
    other.send(Publish("wire/sid/x", b"theirs"))
    got = [p for p in c.recv_all(0.5) if isinstance(p, Publish)]
    assert [(p.payload, p.properties.subscription_identifiers) for p in got] == [(b"theirs", (42,))]


def test_message_expiry_drops_stale_messages(node):
    """A message whose expiry passed while the subscriber was offline is not delivered; a live one is, with less time."""
    props = Properties(session_expiry_interval=60)
    sub = RawClient(node.port(), 5)
    sub.connect("wire-exp", properties=props)
    subscribe(sub, "wire/exp/+", qos=1)
    sub.close()
    pub = client(node)
    pub.send(Publish("wire/exp/short", b"gone", qos=1, packet_id=1, properties=Properties(message_expiry_interval=1)))
    pub.send(Publish("wire/exp/long", b"kept", qos=1, packet_id=2, properties=Properties(message_expiry_interval=100)))
    pub.recv(), pub.recv()  # PUBACKs: both are stored, so "short" expires at most 1 s from now
    time.sleep(1 + CLOCK_MARGIN_S)  # its expiry is the subject: the node must let that second pass
    sub = RawClient(node.port(), 5)
    sub.connect("wire-exp", clean_start=False, properties=props)
    got = [p for p in sub.recv_all(0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"kept"]
    assert got[0].properties.message_expiry_interval <= 100


def test_keep_alive_expiry_publishes_will(node):
    """A silent client is disconnected after 1.5x keep-alive (0x8D) and its will is published."""
    watcher = client(node)
    subscribe(watcher, "wire/will/ka", qos=0)
    from mqtt_proxy.codec.packets import Will
    silent = RawClient(node.port(), 5)
    silent.connect("wire-ka", keep_alive=1, will=Will("wire/will/ka", b"gone quiet"))
    t0 = time.monotonic()
    packets = silent.expect_closed(5)
    assert packets[-1].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert 1.4 <= time.monotonic() - t0 <= 3.5
    got = [p for p in watcher.recv_all(0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"gone quiet"]


def test_ping(node):
    """PINGREQ gets PINGRESP."""
    c = client(node)
    c.send(PingReq())
    assert c.recv() == PingResp()


def test_shared_subscription_redelivers_unacked(node):
    """A shared-group message a member never acknowledged goes to another member when it drops."""
    a = client(node)
    subscribe(a, "$share/g1/wire/sh", qos=1)
    b = client(node)
    subscribe(b, "$share/g1/wire/sh", qos=1)
    pub = client(node)
    for i in range(4):
        pub.send(Publish("wire/sh", b"%d" % i, qos=1, packet_id=i + 1))
    got_a = [p for p in a.recv_all(0.5) if isinstance(p, Publish)]
    got_b = [p for p in b.recv_all(0.2) if isinstance(p, Publish)]
    assert sorted(p.payload for p in got_a + got_b) == [b"0", b"1", b"2", b"3"]
    assert got_a and got_b  # members served in turn
    for p in got_b:
        b.send(PubAck(p.packet_id))
    a.close()  # never acknowledged: b gets a's messages
    again = []
    deadline = time.monotonic() + 5
    while len(again) < len(got_a) and time.monotonic() < deadline:
        p = b.recv(max(0.01, deadline - time.monotonic()))
        if isinstance(p, Publish):
            again.append(p)
    again += [p for p in b.recv_all(QUIET_PERIOD) if isinstance(p, Publish)]  # and nothing more
    assert sorted(p.payload for p in again) == sorted(p.payload for p in got_a)


def test_clients_cannot_publish_to_dollar_topics(node):
    """A client PUBLISH to $SYS/... is refused with 0x87 (v5) and never reaches subscribers."""
    watcher = client(node)
    subscribe(watcher, "$SYS/broker/fake", qos=0)
    c = client(node)
    c.send(Publish("$SYS/broker/fake", b"hacked", qos=1, packet_id=1))
    assert c.recv() == PubAck(1, ReasonCode.NOT_AUTHORIZED)
    assert [p for p in watcher.recv_all(0.5) if isinstance(p, Publish)] == []
