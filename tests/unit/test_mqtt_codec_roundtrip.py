"""Round trips of the MQTT codec: every packet type, both versions, any byte split."""

import pytest
from hypothesis import given, settings, strategies as st

from mqtt_proxy.codec import (
    NO_PROPERTIES, WILL, Connect, MQTTParser, PacketType, Properties, Publish, encode, encode_properties,
    encode_publish, patch_publish,
)
from mqtt_proxy.codec.properties import SPECS, decode_properties
from tests.unit.test_mqtt_codec_strategies import (
    client_packets, connects, parser_for, properties, publishes, server_packets,
)

LEVELS = pytest.mark.parametrize("level", [4, 5])
T = PacketType


def _decode_one(packet, level):
    data = encode(packet, level)
    out = parser_for(packet, level).feed(data)
    assert len(out) == 1
    return out[0]


@LEVELS
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_client_packets_round_trip(level, data):
    """Every packet a client sends decodes, on the server side, to the packet encoded."""
    packet = data.draw(st.one_of(connects(level), client_packets(level)))
    assert _decode_one(packet, level) == packet


@LEVELS
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_server_packets_round_trip(level, data):
    """Every packet a server sends decodes, on the client side, to the packet encoded."""
    packet = data.draw(server_packets(level))
    assert _decode_one(packet, level) == packet


@settings(max_examples=200, deadline=None)
@given(where=st.sampled_from([*T.__members__.values(), WILL]).filter(lambda w: w not in (T.PINGREQ, T.PINGRESP)),
       data=st.data())
def test_properties_round_trip_in_every_context(where, data):
    """A property block valid for a packet type decodes to the same Properties."""
    props = data.draw(properties(where))
    block = encode_properties(props, where)
    decoded, end = decode_properties(block, 0, len(block), where)
    assert (decoded, end) == (props, len(block))


def test_every_property_identifier_has_a_context():
    """The property table covers all 27 identifiers of MQTT 5.0 section 2.2.2.2."""
    assert len(SPECS) == 27
    assert all(spec.allowed_in for spec in SPECS.values())


def test_user_properties_keep_order_and_repeat():
    """User properties may repeat, even with the same name, and keep their order (section 3.3.2.3.7)."""
    pairs = (("b", "1"), ("a", "2"), ("b", "3"), ("b", "1"))
    props = Properties(user_properties=pairs)
    packet = Publish("t", b"", properties=props)
    assert _decode_one(packet, 5).properties.user_properties == pairs


def test_v311_drops_what_it_cannot_carry():
    """Encoding at level 4 omits properties and reason codes that 3.1.1 lacks."""
    from mqtt_proxy.codec import PubAck, ReasonCode, SubAck
    assert encode(PubAck(3, ReasonCode.NO_MATCHING_SUBSCRIBERS, Properties(reason_string="x")), 4) == b"\x40\x02\x00\x03"
    assert encode(SubAck(1, (ReasonCode.GRANTED_QOS_1, ReasonCode.NOT_AUTHORIZED)), 4) == b"\x90\x04\x00\x01\x01\x80"
    assert encode(Publish("t", b"x", properties=Properties(topic_alias=3)), 4) == b"\x30\x04\x00\x01tx"


def _stream(level, packets):
    connect = Connect("c", level)
    return [connect, *packets], b"".join(encode(p, level) for p in [connect, *packets])


@LEVELS
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_one_byte_at_a_time_equals_all_at_once(level, data):
    """Feeding a stream byte by byte yields the same packets as feeding it whole (framing is split-proof)."""
    packets, stream = _stream(level, data.draw(st.lists(client_packets(level), max_size=6)))
    whole = MQTTParser().feed(stream)
    parser = MQTTParser()
    single = [p for i in range(len(stream)) for p in parser.feed(stream[i:i + 1])]
    assert whole == single == packets
    assert parser.buffered == 0


@LEVELS
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_chunking_equals_all_at_once(level, data):
    """Any split of a stream into chunks (bytes, bytearray or memoryview) yields the same packets."""
    packets, stream = _stream(level, data.draw(st.lists(client_packets(level), max_size=8)))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    parser = MQTTParser()
    out = []
    for lo, hi in zip([0, *cuts], [*cuts, len(stream)]):
        chunk = data.draw(st.sampled_from([bytes, bytearray, memoryview]))(stream[lo:hi])
        out += parser.feed(chunk)
    assert out == packets


def test_version_is_learned_from_connect_in_the_same_chunk():
    """Packets after CONNECT in the same chunk are parsed with the version that CONNECT set."""
    props = Properties(topic_alias=1)
    stream = encode(Connect("c", 5), 5) + encode(Publish("a/b", b"x", properties=props), 5)
    parser = MQTTParser()
    assert parser.feed(stream)[1].properties == props
    assert parser.protocol_level == 5


@settings(max_examples=200, deadline=None)
@given(packet=publishes(5) | publishes(4), level=st.sampled_from([4, 5]))
def test_fast_path_matches_encode(packet, level):
    """encode_publish from fields gives the same bytes as encode(Publish)."""
    if level == 4:
        packet = Publish(packet.topic or "t", packet.payload, packet.qos, packet.retain, packet.dup,
                         packet.packet_id)
    props = None if packet.properties is NO_PROPERTIES else encode_properties(packet.properties, T.PUBLISH)
    fast = encode_publish(packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id,
                          props, level)
    assert fast == encode(packet, level)
    assert encode_publish(packet.topic.encode(), packet.payload, packet.qos, packet.retain, packet.dup,
                          packet.packet_id, props, level) == fast


@settings(max_examples=200, deadline=None)
@given(topic=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), min_size=1),
       payload=st.binary(max_size=300), packet_id=st.integers(1, 0xFFFF), dup=st.booleans(), retain=st.booleans(),
       level=st.sampled_from([4, 5]))
def test_patch_publish_restamps_packet_id_and_flags(topic, payload, packet_id, dup, retain, level):
    """patch_publish gives the bytes a fresh encode would give with the new id, DUP and RETAIN."""
    template = encode_publish(topic, payload, 1, packet_id=1, protocol_level=level)
    patched = patch_publish(template, packet_id, dup=dup, retain=retain)
    assert patched == encode_publish(topic, payload, 1, retain, dup, packet_id, protocol_level=level)


def test_large_remaining_length_round_trips():
    """A PUBLISH whose remaining length needs three bytes survives a round trip."""
    packet = Publish("big", b"\xab" * 20_000, 2, packet_id=9)
    data = encode(packet, 4)
    assert data[1:4] == bytes((0xA7, 0x9C, 0x01))  # 20007 = 39 + 28*128 + 1*16384
    assert MQTTParser(server_side=False, protocol_level=4).feed(data) == [packet]


def test_packet_exactly_at_the_size_limit_is_accepted():
    """A packet of exactly max_packet_size bytes is not too large."""
    data = encode(Publish("t", b"x" * 10), 4)
    assert MQTTParser(max_packet_size=len(data), protocol_level=4).feed(data) == [Publish("t", b"x" * 10)]


@pytest.mark.parametrize("side", [True, False])
@pytest.mark.parametrize("level", [4, 5])
def test_short_puback_fast_path_equals_the_general_decoder(side, level):
    """A 2-byte PUBACK decodes to PubAck(id) on both sides and levels; id 0 is still a protocol error (MQTT-2.2.1-3)."""
    from mqtt_proxy.codec import ProtocolError, PubAck

    def parser():
        return MQTTParser(server_side=side, protocol_level=level)

    stream = b"".join(encode(PubAck(i), level) for i in (1, 2, 0xFFFF, 1))
    assert parser().feed(stream) == [PubAck(1), PubAck(2), PubAck(0xFFFF), PubAck(1)]
    one_by_one = parser()
    assert [p for b in stream for p in one_by_one.feed(bytes([b]))] == [PubAck(1), PubAck(2), PubAck(0xFFFF),
                                                                          PubAck(1)]
    with pytest.raises(ProtocolError, match="MQTT-2.2.1-3"):
        parser().feed(b"\x40\x02\x00\x00")
    with pytest.raises(ProtocolError, match="CONNECT"):
        MQTTParser(server_side=True).feed(b"\x40\x02\x00\x01")  # before CONNECT: not the fast path's to accept


@settings(max_examples=100, deadline=None)
@given(topic=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), min_size=1),
       payload=st.binary(max_size=400), packet_id=st.integers(1, 0xFFFF), qos=st.sampled_from([1, 2]),
       level=st.sampled_from([4, 5]))
def test_patch_publish_packet_id_only_equals_a_fresh_encode(topic, payload, packet_id, qos, level):
    """Re-stamping only the packet id (the delivery path) gives the bytes of a fresh encode with that id."""
    template = encode_publish(topic, payload, qos, packet_id=1, protocol_level=level)
    assert patch_publish(template, packet_id) == encode_publish(topic, payload, qos, packet_id=packet_id,
                                                                protocol_level=level)


def test_patch_publish_refuses_a_packet_id_on_qos_0():
    """A QoS 0 PUBLISH has no packet id to re-stamp: the caller's mistake is a ValueError."""
    with pytest.raises(ValueError):
        patch_publish(encode_publish("t", b"x"), 5)
