"""The MQTT protocol's write path: a delivery batch reaches the transport as one write, in order."""

from __future__ import annotations

from mqtt_proxy.codec import Publish, Subscribe, Subscription, encode
from mqtt_proxy.protocol import CORK_FLUSH_BYTES
from tests.unit.test_mqtt_broker import Harness, published


class CountingWrites:
    """Wraps a StringTransport's write to count the calls (the bytes still go through)."""

    def __init__(self, transport) -> None:
        self.calls = 0
        self._write = transport.write
        transport.write = self

    def __call__(self, data) -> None:
        self.calls += 1
        self._write(data)


def test_a_batch_of_publishes_is_one_transport_write(tmp_path):
    """Fifty messages stored in one tick reach a subscriber in one write, in publish order."""
    h = Harness(tmp_path)
    try:
        sub = h.connect("sub")
        sub.send(Subscribe(1, (Subscription("t/#"),)))
        sub.received()
        writes = CountingWrites(sub.transport)
        pub = h.connect("pub")
        pub.received()
        pub.proto.dataReceived(b"".join(encode(Publish("t/x", b"%d" % i), 5) for i in range(50)))
        h.tick()
        assert [p.payload for p in published(sub)] == [b"%d" % i for i in range(50)]
        assert writes.calls == 1
    finally:
        h.close()


def test_a_large_batch_is_written_in_pieces_so_back_pressure_still_stops_it(tmp_path):
    """Held writes go to the transport every CORK_FLUSH_BYTES; a full transport stops the batch there."""
    h = Harness(tmp_path)
    try:
        sub = h.connect("sub")
        sub.send(Subscribe(1, (Subscription("t/#"),)))
        sub.received()
        sub.transport.bufferSize = 1  # any write fills it: the transport pauses its producer
        sub.transport.producerState = "producing"
        writes = CountingWrites(sub.transport)
        original_write = sub.transport.write

        def write_and_pause(data):
            original_write(data)
            sub.proto.pauseProducing()  # what a full TCP transport does
        sub.transport.write = write_and_pause
        pub = h.connect("pub")
        pub.received()
        body = b"x" * 4096
        count = 3 * CORK_FLUSH_BYTES // len(body)
        pub.proto.dataReceived(b"".join(encode(Publish("t/x", body), 5) for _ in range(count)))
        h.tick()
        got = published(sub)
        assert writes.calls == 1 and 0 < len(got) < count  # stopped after the first piece
        assert sum(len(encode(p, 5)) for p in got) >= CORK_FLUSH_BYTES
    finally:
        h.close()
