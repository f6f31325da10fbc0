"""A read's PUBLISHes in one loop: the inbound batcher's many-at-once submit, and the order a mixed read keeps."""

from __future__ import annotations

from twisted.internet import defer, task

from mqtt_proxy import inbound
from mqtt_proxy.codec import Properties, PubAck, Publish, Subscribe, Subscription, SubscriptionOptions, encode
from mqtt_proxy.inbound import InboundBatcher
from store.api import AppendResult, AppendStatus
from store.record import Message
from tests.unit.test_mqtt_broker import Harness, h, published  # noqa: F401 (h: the broker harness fixture)


class RecordingLog:
    """The message log side of the batcher: records each append_batch and stores every message."""

    def __init__(self) -> None:
        self.batches: list[tuple[Message, ...]] = []

    def append_batch(self, messages):
        self.batches.append(messages)
        return defer.succeed(tuple(AppendResult(AppendStatus.PUT_OK, i) for i in range(len(messages))))


def test_submit_many_keeps_order_and_the_batch_bound():
    """Many messages at once go out in arrival order, in batches of at most MAX_BATCH, each origin answered once."""
    clock, log = task.Clock(), RecordingLog()
    batcher = InboundBatcher(log, clock)
    answered = []
    total = 2 * inbound.MAX_BATCH + 7
    batcher.submit(Message("t", b"first"), answered.append)
    messages = [Message("t", b"%d" % i) for i in range(total)]
    batcher.submit_many(messages, [answered.append] * total)
    batcher.submit(Message("t", b"last"), answered.append)
    assert [len(b) for b in log.batches] == [inbound.MAX_BATCH, inbound.MAX_BATCH], "full batches go at once"
    clock.advance(0)
    assert [len(b) for b in log.batches] == [inbound.MAX_BATCH, inbound.MAX_BATCH, 9]
    bodies = [m.body for b in log.batches for m in b]
    assert bodies == [b"first"] + [b"%d" % i for i in range(total)] + [b"last"]
    assert len(answered) == total + 2


def test_a_mixed_read_keeps_publish_order(h):
    """Plain, retained, v5-property and QoS 1 PUBLISHes in one read reach a subscriber in the order sent."""
    sub = h.connect("sub")
    sub.send(Subscribe(1, (Subscription("t/#", SubscriptionOptions(qos=1)),)))
    sub.received()
    pub = h.connect("pub")
    pub.received()
    pub.send(Publish("t/a", b"warm"))  # the topic is known from now on: its next PUBLISHes are plain
    sub.received()
    read = [Publish("t/a", b"0"), Publish("t/a", b"1", qos=1, packet_id=1), Publish("t/a", b"2", retain=True),
            Publish("t/a", b"3"), Publish("t/a", b"4", properties=Properties(content_type="x")),
            Publish("t/b", b"5"), Publish("t/a", b"6", qos=1, packet_id=2)]
    pub.proto.dataReceived(b"".join(encode(p, 5) for p in read))
    h.tick()
    assert [p.payload for p in published(sub)] == [b"0", b"1", b"2", b"3", b"4", b"5", b"6"]
    assert [p.packet_id for p in pub.received() if isinstance(p, PubAck)] == [1, 2]
    assert pub.proto.pending_puts == 0 and pub.proto.inbound_inflight == 0


def test_a_read_past_receive_maximum_is_refused_at_that_publish(tmp_path):
    """The QoS 1 PUBLISH that passes Receive Maximum in a read ends the connection; the ones before it are stored."""
    from mqtt_proxy.config import MQTTConfig
    h = Harness(tmp_path)
    try:
        h.broker.publisher.config = MQTTConfig(sys_interval=0, receive_maximum=2)
        sub = h.connect("sub")
        sub.send(Subscribe(1, (Subscription("t/#"),)))
        sub.received()
        pub = h.connect("pub")
        pub.received()
        pub.send(Publish("t/a", b"warm"))
        sub.received()
        read = [Publish("t/a", b"%d" % i, qos=1, packet_id=i + 1) for i in range(3)]
        pub.proto.dataReceived(b"".join(encode(p, 5) for p in read))
        h.tick()
        assert [p.payload for p in published(sub)] == [b"0", b"1"]
        assert pub.transport.disconnecting
    finally:
        h.close()
