"""Every malformed or forbidden input raises ProtocolError with the right reason code;
misuse of the encoder raises ValueError/TypeError."""

import pytest

from mqtt_proxy.codec import (
    Auth, ConnAck, Connect, MalformedPacket, MQTTParser, PacketTooLarge, PingReq, Properties, ProtocolError,
    PubAck, Publish, ReasonCode, SubAck, Subscribe, Subscription, SubscriptionOptions, UnsubAck, Unsubscribe,
    UnsupportedProtocolVersion, Will, encode, encode_publish, is_valid_topic_filter, is_valid_topic_name,
    patch_publish,
)

R = ReasonCode
MALFORMED, PROTOCOL = R.MALFORMED_PACKET, R.PROTOCOL_ERROR
V5_CONNECT_HEAD = "00 04 4D 51 54 54 05"


def _error(hex_bytes, level=4, server_side=True, **kw):
    """Feed the bytes to a parser (already past CONNECT at ``level``, unless level is None); return the error."""
    parser = MQTTParser(server_side=server_side, protocol_level=level, **kw)
    with pytest.raises(ProtocolError) as info:
        parser.feed(bytes.fromhex(hex_bytes))
    return info.value


CASES = [
    # (id, hex bytes, level, server side, reason)
    ("remaining-length-five-bytes", "30 FF FF FF FF 01", 4, True, MALFORMED),  # MQTT 1.5.5: at most 4 bytes
    ("remaining-length-not-minimal", "C0 80 00", 4, True, MALFORMED),  # MQTT-1.5.5-1
    ("reserved-packet-type-0", "00 00", 4, True, MALFORMED),
    ("auth-in-v311", "F0 00", 4, True, MALFORMED),  # type 15 is reserved in 3.1.1
    ("puback-reserved-flags", "41 02 00 01", 4, True, MALFORMED),  # MQTT-2.1.3-1
    ("pubrel-flags-not-0010", "60 02 00 01", 4, True, MALFORMED),  # MQTT-3.6.1-1
    ("subscribe-flags-not-0010", "80 08 00 01 00 03 61 2F 62 01", 4, True, MALFORMED),  # MQTT-3.8.1-1
    ("unsubscribe-flags-not-0010", "A0 05 00 01 00 01 61", 4, True, MALFORMED),  # MQTT-3.10.1-1
    ("pingreq-flags", "C1 00", 4, True, MALFORMED),
    ("publish-qos3", "36 05 00 01 61 00 01", 4, True, MALFORMED),  # MQTT-3.3.1-4
    ("publish-dup-on-qos0", "38 03 00 01 61", 4, True, MALFORMED),  # MQTT-3.3.1-2
    ("publish-topic-bad-utf8", "30 04 00 02 C3 28", 4, True, MALFORMED),  # MQTT-1.5.4-1
    ("publish-topic-surrogate", "30 05 00 03 ED A0 80", 4, True, MALFORMED),  # MQTT-1.5.4-1
    ("publish-topic-overlong-utf8", "30 04 00 02 C0 AF", 4, True, MALFORMED),  # MQTT-1.5.4-1
    ("publish-topic-nul", "30 05 00 03 61 00 62", 4, True, MALFORMED),  # MQTT-1.5.4-2
    ("publish-topic-wildcard-plus", "30 05 00 03 61 2F 2B", 4, True, R.TOPIC_NAME_INVALID),  # MQTT-3.3.2-2
    ("publish-topic-wildcard-hash", "30 04 00 01 23 00", 5, True, R.TOPIC_NAME_INVALID),  # MQTT-3.3.2-2
    ("publish-topic-empty-v311", "30 02 00 00", 4, True, PROTOCOL),  # MQTT-4.7.3-1
    ("publish-topic-empty-no-alias-v5", "30 03 00 00 00", 5, True, PROTOCOL),  # MQTT 5.0 3.3.2.3.4
    ("publish-topic-truncated", "30 03 00 05 61", 4, True, MALFORMED),
    ("publish-packet-id-0", "32 05 00 01 61 00 00", 4, True, PROTOCOL),  # MQTT-2.2.1-3
    ("publish-packet-id-truncated", "32 04 00 01 61 00", 4, True, MALFORMED),
    ("publish-v5-missing-property-length", "30 03 00 01 61", 5, True, MALFORMED),
    ("property-length-past-end", "30 06 00 01 61 05 23 00", 5, True, MALFORMED),
    ("property-value-truncated", "30 06 00 01 61 02 23 00", 5, True, MALFORMED),
    ("property-string-truncated", "30 08 00 01 61 04 03 00 05 61", 5, True, MALFORMED),
    ("property-unknown-identifier", "30 06 00 01 61 02 7F 00", 5, True, MALFORMED),  # section 2.2.2.2
    ("property-not-allowed-in-publish", "30 09 00 01 61 05 11 00 00 00 01", 5, True, MALFORMED),  # 2.2.2.2
    ("property-duplicate-topic-alias", "30 0A 00 01 61 06 23 00 01 23 00 02", 5, True, PROTOCOL),  # 3.3.2.3.4
    ("property-topic-alias-0", "30 07 00 01 61 03 23 00 00", 5, True, PROTOCOL),  # MQTT-3.3.2-8
    ("property-payload-format-2", "30 06 00 01 61 02 01 02", 5, True, PROTOCOL),
    ("property-user-property-bad-utf8", "30 0B 00 01 61 07 26 00 01 FF 00 01 61", 5, True, MALFORMED),
    ("client-publish-with-subscription-id", "30 06 00 01 61 02 0B 01", 5, True, PROTOCOL),  # MQTT-3.3.4-6
    ("subscribe-two-subscription-ids", "82 0B 00 01 04 0B 01 0B 02 00 01 61 00", 5, True, PROTOCOL),  # 3.8.2.1.2
    ("subscribe-subscription-id-0", "82 08 00 01 02 0B 00 00 01 61 00", 5, True, PROTOCOL),
    ("puback-packet-id-0", "40 02 00 00", 4, True, PROTOCOL),  # MQTT-2.2.1-3
    ("subscribe-packet-id-0", "82 06 00 00 00 01 61 00", 4, True, PROTOCOL),  # MQTT-2.2.1-3
    ("subscribe-empty-payload-v311", "82 02 00 01", 4, True, PROTOCOL),  # MQTT-3.8.3-3
    ("subscribe-empty-payload-v5", "82 03 00 01 00", 5, True, PROTOCOL),  # MQTT-3.8.3-2
    ("subscribe-options-reserved-v311", "82 06 00 01 00 01 61 04", 4, True, MALFORMED),  # MQTT-3.8.3-4 (3.1.1)
    ("subscribe-qos3-v311", "82 06 00 01 00 01 61 03", 4, True, MALFORMED),  # MQTT-3.8.3-4 (3.1.1)
    ("subscribe-options-reserved-v5", "82 07 00 01 00 00 01 61 40", 5, True, MALFORMED),  # MQTT-3.8.3-5
    ("subscribe-qos3-v5", "82 07 00 01 00 00 01 61 03", 5, True, PROTOCOL),  # 3.8.3.1
    ("subscribe-retain-handling-3-v5", "82 07 00 01 00 00 01 61 30", 5, True, PROTOCOL),  # 3.8.3.1
    ("subscribe-no-local-shared-v5",
     "82 10 00 01 00 00 0A 24 73 68 61 72 65 2F 67 2F 61 04", 5, True, PROTOCOL),  # MQTT-3.8.3-4
    ("subscribe-filter-truncated", "82 05 00 01 00 05 61", 4, True, MALFORMED),
    ("unsubscribe-empty-payload", "A2 02 00 01", 4, True, PROTOCOL),  # MQTT-3.10.3-2
    ("pingreq-with-body", "C0 01 00", 4, True, MALFORMED),
    ("puback-v311-trailing-bytes", "40 03 00 01 00", 4, True, MALFORMED),
    ("disconnect-v311-with-body", "E0 01 00", 4, True, MALFORMED),
    ("pubrel-reason-not-allowed", "62 03 00 01 10", 5, True, PROTOCOL),  # MQTT 5.0 3.6.2.1
    ("disconnect-unknown-reason", "E0 01 03", 5, True, PROTOCOL),  # MQTT-3.14.2-1
    ("auth-reason-not-allowed", "F0 01 80", 5, True, PROTOCOL),  # 3.15.2.1
    ("server-receives-connack", "20 02 00 00", 4, True, PROTOCOL),
    ("server-receives-suback", "90 03 00 01 00", 4, True, PROTOCOL),
    ("client-receives-subscribe", "82 06 00 01 00 01 61 00", 4, False, PROTOCOL),
    ("client-receives-pingreq", "C0 00", 5, False, PROTOCOL),
    ("connack-reserved-flags", "20 02 02 00", 4, False, MALFORMED),  # MQTT-3.2.2-1
    ("connack-v311-unknown-return-code", "20 02 00 06", 4, False, PROTOCOL),
    ("connack-v5-reason-not-allowed", "20 03 00 8E 00", 5, False, PROTOCOL),  # 3.2.2.2
    ("suback-v311-bad-code", "90 03 00 01 03", 4, False, PROTOCOL),  # MQTT-3.9.3-2
    ("connack-receive-maximum-0", "20 06 00 00 03 21 00 00", 5, False, PROTOCOL),  # 3.2.2.3.3
    ("connack-maximum-qos-2", "20 05 00 00 02 24 02", 5, False, PROTOCOL),  # 3.2.2.3.4
    ("second-connect", "10 0C " + V5_CONNECT_HEAD + " 02 00 00 00 00 00", 5, True, PROTOCOL),  # MQTT-3.1.0-2
]


@pytest.mark.parametrize("hex_bytes, level, server_side, reason", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_bad_packet_raises_protocol_error_with_reason(hex_bytes, level, server_side, reason):
    """Each malformed or forbidden packet raises ProtocolError carrying the reason code the spec asks for."""
    error = _error(hex_bytes, level, server_side)
    assert error.reason_code == reason, error
    assert error.protocol_level == level


CONNECT_CASES = [
    ("reserved-flag", "10 0C 00 04 4D 51 54 54 04 03 00 3C 00 00", MALFORMED),  # MQTT-3.1.2-3
    ("will-qos-without-will", "10 0C 00 04 4D 51 54 54 04 0A 00 3C 00 00", MALFORMED),  # MQTT-3.1.2-11 (3.1.1: -13)
    ("will-retain-without-will", "10 0C 00 04 4D 51 54 54 04 22 00 3C 00 00", MALFORMED),  # MQTT-3.1.2-13
    ("will-qos-3", "10 11 00 04 4D 51 54 54 04 1E 00 3C 00 00 00 01 61 00 00", MALFORMED),  # MQTT-3.1.2-12
    ("password-without-username-v311", "10 0F 00 04 4D 51 54 54 04 42 00 3C 00 00 00 01 70", PROTOCOL),
    ("client-id-nul", "10 0D 00 04 4D 51 54 54 04 02 00 3C 00 01 00", MALFORMED),  # MQTT-1.5.4-2
    ("truncated", "10 09 00 04 4D 51 54 54 04 02 00", MALFORMED),
    ("trailing-bytes", "10 0D 00 04 4D 51 54 54 04 02 00 3C 00 00 FF", MALFORMED),
    ("will-topic-wildcard", "10 11 00 04 4D 51 54 54 04 06 00 3C 00 00 00 01 23 00 00", R.TOPIC_NAME_INVALID),
    ("v5-receive-maximum-0", "10 10 " + V5_CONNECT_HEAD + " 02 00 3C 03 21 00 00 00 00", PROTOCOL),
    ("v5-duplicate-session-expiry",
     "10 17 " + V5_CONNECT_HEAD + " 02 00 3C 0A 11 00 00 00 01 11 00 00 00 02 00 00", PROTOCOL),
    ("v5-auth-data-without-method", "10 10 " + V5_CONNECT_HEAD + " 02 00 3C 03 16 00 00 00 00", PROTOCOL),
    ("v5-will-property-not-allowed-in-connect",
     "10 12 " + V5_CONNECT_HEAD + " 02 00 3C 05 18 00 00 00 01 00 00", MALFORMED),
    ("first-packet-not-connect", "C0 00", PROTOCOL),  # MQTT-3.1.0-1
]


@pytest.mark.parametrize("hex_bytes, reason", [pytest.param(*c[1:], id=c[0]) for c in CONNECT_CASES])
def test_bad_connect_raises_protocol_error_with_reason(hex_bytes, reason):
    """A server-side parser refuses each bad CONNECT with the reason code the spec asks for."""
    assert _error(hex_bytes, level=None).reason_code == reason


@pytest.mark.parametrize("hex_bytes, name, level", [
    ("10 0E 00 06 4D 51 49 73 64 70 03 02 00 3C 00 00", "MQIsdp", 3),  # MQTT 3.1
    ("10 0C 00 04 4D 51 54 54 06 02 00 3C 00 00", "MQTT", 6),
    ("10 0C 00 04 4D 51 54 58 04 02 00 3C 00 00", "MQTX", 4),  # MQTT-3.1.2-1
])
def test_wrong_protocol_name_or_level_is_unsupported_version(hex_bytes, name, level):
    """A CONNECT with another protocol name or level asks for CONNACK 0x84 / 0x01 (MQTT-3.1.2-1, MQTT-3.1.2-2)."""
    error = _error(hex_bytes, level=None)
    assert isinstance(error, UnsupportedProtocolVersion)
    assert error.reason_code == R.UNSUPPORTED_PROTOCOL_VERSION
    assert (error.protocol_name, error.requested_level) == (name, level)


def test_packet_too_large_is_refused_from_the_fixed_header():
    """A packet over max_packet_size raises PACKET_TOO_LARGE once its length is known, before its body arrives."""
    parser = MQTTParser(max_packet_size=100, protocol_level=5)
    with pytest.raises(PacketTooLarge) as info:
        parser.feed(bytes.fromhex("30 FF 01"))  # remaining length 255, no body yet
    assert info.value.reason_code == R.PACKET_TOO_LARGE
    assert (info.value.size, info.value.limit) == (258, 100)
    assert parser.buffered == 0


def test_huge_declared_length_is_refused_without_buffering():
    """A 256 MiB declared length is refused with the default limit lowered, byte by byte as well."""
    parser = MQTTParser(max_packet_size=1024, protocol_level=4)
    for byte in bytes.fromhex("30 FF FF FF"):
        assert parser.feed(bytes((byte,))) == []
    with pytest.raises(PacketTooLarge):
        parser.feed(b"\x7f")


def test_parser_is_dead_after_an_error_and_keeps_earlier_packets():
    """After an error every feed raises again; packets decoded before the bad one ride on the error."""
    parser = MQTTParser(protocol_level=4)
    good = encode(Publish("a", b"1"), 4) + encode(PingReq(), 4)
    with pytest.raises(ProtocolError) as info:
        parser.feed(good + bytes.fromhex("36 05 00 01 61 00 01"))
    assert info.value.parsed == (Publish("a", b"1"), PingReq())
    with pytest.raises(ProtocolError) as again:
        parser.feed(encode(PingReq(), 4))
    assert again.value is info.value


def test_error_before_connect_has_no_protocol_level():
    """An error found before CONNECT was understood reports protocol_level None (answer in 3.1.1 terms)."""
    assert _error("C0 00", level=None).protocol_level is None


def test_malformed_packet_is_a_protocol_error():
    """MalformedPacket is the 0x81 flavour of the one ProtocolError type."""
    error = _error("C1 00")
    assert isinstance(error, MalformedPacket) and isinstance(error, ProtocolError)


def test_empty_topic_with_alias_is_accepted_in_v5():
    """A v5 PUBLISH may have an empty topic when a Topic Alias names it (MQTT 5.0 3.3.2.3.4)."""
    data = bytes.fromhex("30 06 00 00 03 23 00 01")
    packet = MQTTParser(protocol_level=5).feed(data)[0]
    assert (packet.topic, packet.properties.topic_alias) == ("", 1)


def test_server_to_client_publish_may_repeat_subscription_ids():
    """A PUBLISH to a client may carry several Subscription Identifiers (MQTT 5.0 3.3.2.3.8)."""
    data = bytes.fromhex("30 08 00 01 61 04 0B 01 0B 02")
    packet = MQTTParser(server_side=False, protocol_level=5).feed(data)[0]
    assert packet.properties.subscription_identifiers == (1, 2)


# --- "we misused the API": ValueError / TypeError, never ProtocolError ---

ENCODE_MISUSE = [
    (Publish("a", b"", 3, packet_id=1), 4, ValueError),
    (Publish("a", b"", 1, packet_id=0), 4, ValueError),
    (Publish("a", b"", 1), 4, ValueError),
    (Publish("a", b"", 0, packet_id=5), 4, ValueError),
    (Publish("a/+", b""), 4, ValueError),
    (Publish("", b""), 5, ValueError),
    (Publish("a", "text payload"), 4, TypeError),
    (Publish("a", b"", properties=Properties(session_expiry_interval=1)), 5, ValueError),
    (Publish("a", b"", properties=Properties(topic_alias=0)), 5, ValueError),
    (Publish("a", b"", properties=Properties(message_expiry_interval=-1)), 5, ValueError),
    (Connect("a\x00b"), 4, ValueError),
    (Connect("\ud800"), 4, ValueError),
    (Connect("a", 4, password=b"p"), 4, ValueError),
    (Connect("a", 5), 4, ValueError),
    (Connect("a", 5, properties=Properties(receive_maximum=0)), 5, ValueError),
    (Connect("a", 4, will=Will("w/#")), 4, ValueError),
    (ConnAck(True, R.NOT_AUTHORIZED), 5, ValueError),
    (ConnAck(False, R.SESSION_TAKEN_OVER), 5, ValueError),
    (PubAck(0), 4, ValueError),
    (PubAck(1, R.PACKET_IDENTIFIER_NOT_FOUND), 5, ValueError),
    (Subscribe(1, ()), 4, ValueError),
    (Subscribe(1, (Subscription("a", SubscriptionOptions(3)),)), 4, ValueError),
    (Subscribe(1, (Subscription("a", SubscriptionOptions(0, retain_handling=3)),)), 5, ValueError),
    (Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))), 5, ValueError),
    (SubAck(1, ()), 4, ValueError),
    (Unsubscribe(1, ()), 4, ValueError),
    (UnsubAck(1), 5, ValueError),
    (Auth(), 4, ValueError),
    (PingReq(), 3, ValueError),
    ("not a packet", 4, TypeError),
]


@pytest.mark.parametrize("packet, level, error", ENCODE_MISUSE, ids=[f"{i}-{type(c[0]).__name__}"
                                                                      for i, c in enumerate(ENCODE_MISUSE)])
def test_encoder_misuse_raises_value_or_type_error(packet, level, error):
    """Encoding a packet that cannot exist is our bug: ValueError/TypeError, not ProtocolError."""
    with pytest.raises(error):
        encode(packet, level)


def test_fast_path_and_patch_misuse_raise_value_error():
    """encode_publish and patch_publish refuse arguments that make no valid PUBLISH."""
    with pytest.raises(ValueError):
        encode_publish("a", b"", 1)
    with pytest.raises(ValueError):
        encode_publish("a", b"", 0, dup=True)
    with pytest.raises(ValueError):
        encode_publish("a", b"", protocol_level=3)
    qos0 = encode_publish("a", b"x")
    with pytest.raises(ValueError):
        patch_publish(qos0, packet_id=3)
    with pytest.raises(ValueError):
        patch_publish(encode(PingReq(), 4), retain=True)


def test_parser_constructor_misuse():
    """A client-side parser needs its protocol level; levels and limits are checked."""
    with pytest.raises(ValueError):
        MQTTParser(server_side=False)
    with pytest.raises(ValueError):
        MQTTParser(protocol_level=3)
    with pytest.raises(ValueError):
        MQTTParser(max_packet_size=1)
    with pytest.raises(TypeError):
        MQTTParser(protocol_level=4).feed("text")


@pytest.mark.parametrize("name, valid", [
    ("a/b", True), ("/", True), ("a/+", False), ("#", False), ("", False), ("a\x00", False), ("$SYS/x", True),
])
def test_topic_name_helper(name, valid):
    """is_valid_topic_name refuses wildcards and empty names (MQTT-3.3.2-2, MQTT-4.7.3-1)."""
    assert is_valid_topic_name(name) is valid


@pytest.mark.parametrize("topic_filter, valid", [
    ("a/b", True), ("#", True), ("a/#", True), ("+", True), ("+/+/#", True), ("a/+/c", True), ("/", True),
    ("a#", False), ("a/#/b", False), ("a+", False), ("a/b+/c", False), ("", False), ("##", False),
    ("$share/g/a/#", True), ("$share/g/#", True), ("$share//a", False), ("$share/g", False),
    ("$share/g/", False), ("$share/g+/a", False),
])
def test_topic_filter_helper(topic_filter, valid):
    """is_valid_topic_filter enforces wildcard placement (MQTT-4.7.1-1, -2) and shared-filter shape (MQTT-4.8.2-1)."""
    assert is_valid_topic_filter(topic_filter) is valid


# -- buffering of an incomplete packet (issue 26) ---------------------------------------------------

def test_a_packet_fed_one_byte_at_a_time_is_buffered_in_one_growing_buffer():
    """A peer writing one byte per read costs the parser about a byte per byte, not an object per read."""
    import tracemalloc

    from mqtt_proxy.codec import Connect, MQTTParser, encode

    data = encode(Connect(client_id="c", password=b"p" * 60000, username="u"), 4)
    parser = MQTTParser()
    tracemalloc.start()
    try:
        for i in range(len(data) - 1):
            assert parser.feed(data[i:i + 1]) == []
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parser.buffered == len(data) - 1
    assert held < 2 * len(data), f"{held} bytes held for {len(data)} bytes buffered"  # a list of chunks: ~50x
    (packet,) = parser.feed(data[-1:])
    assert packet.password == b"p" * 60000 and parser.buffered == 0


def test_max_packet_size_can_be_raised_between_packets():
    """The server raises the limit at CONNACK: a packet refused before is accepted after."""
    from mqtt_proxy.codec import Connect, MQTTParser, PacketTooLarge, Publish, encode

    parser = MQTTParser(max_packet_size=64)
    assert len(parser.feed(encode(Connect(client_id="c"), 4))) == 1
    parser.max_packet_size = 1 << 20
    (p,) = parser.feed(encode(Publish("t", b"x" * 1000, qos=0), 4))
    assert len(p.payload) == 1000
    small = MQTTParser(max_packet_size=64)
    small.feed(encode(Connect(client_id="c"), 4))
    with pytest.raises(PacketTooLarge):
        small.feed(encode(Publish("t", b"x" * 1000, qos=0), 4)[:5])  # refused at the fixed header
