"""Golden bytes: packets checked by hand against the MQTT 3.1.1 and 5.0 byte layouts."""

import pytest

from mqtt_proxy.codec import (
    ConnAck, Connect, ConnectReturnCode, Disconnect, MQTTParser, PingReq, PingResp, Properties, PubAck, Publish,
    PubRel, ReasonCode, SubAck, Subscribe, Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
    encode, encode_pubacks, v311_return_code,
)
from mqtt_proxy.codec.wire import Reader, encode_varint

# (packet, protocol level, bytes, parsed on the server side?)
GOLDEN = [
    pytest.param(
        Connect("test", 4, clean_start=True, keep_alive=60), 4,
        "10 10 00 04 4D 51 54 54 04 02 00 3C 00 04 74 65 73 74", True,
        id="v311-minimal-connect"),
    pytest.param(
        Connect("id", 4, clean_start=False, keep_alive=10, will=Will("w", b"bye", 1, True), username="u",
                password=b"p"), 4,
        # flags: user 0x80 | password 0x40 | will retain 0x20 | will qos 1 0x08 | will 0x04 = 0xEC
        "10 1C 00 04 4D 51 54 54 04 EC 00 0A 00 02 69 64 00 01 77 00 03 62 79 65 00 01 75 00 01 70", True,
        id="v311-connect-will-credentials"),
    pytest.param(
        Connect("", 5, keep_alive=0, properties=Properties(session_expiry_interval=0xFFFFFFFF)), 5,
        "10 12 00 04 4D 51 54 54 05 02 00 00 05 11 FF FF FF FF 00 00", True,
        id="v5-connect-session-expiry"),
    pytest.param(ConnAck(False, ConnectReturnCode.ACCEPTED), 4, "20 02 00 00", False, id="v311-connack"),
    pytest.param(ConnAck(True, 0), 4, "20 02 01 00", False, id="v311-connack-session-present"),
    pytest.param(ConnAck(False, ConnectReturnCode.NOT_AUTHORIZED), 4, "20 02 00 05", False, id="v311-connack-refused"),
    pytest.param(
        ConnAck(False, ReasonCode.SUCCESS, Properties(topic_alias_maximum=10, maximum_qos=1)), 5,
        "20 08 00 00 05 22 00 0A 24 01", False, id="v5-connack-properties"),
    pytest.param(
        ConnAck(False, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION), 5, "20 03 00 84 00", False,
        id="v5-connack-unsupported-version"),
    pytest.param(Publish("a/b", b"hi", 1, packet_id=10), 4, "32 09 00 03 61 2F 62 00 0A 68 69", True,
                 id="v311-publish-qos1"),
    pytest.param(Publish("a", b"x", 0, retain=True), 5, "31 05 00 01 61 00 78", True, id="v5-publish-retain"),
    pytest.param(
        Publish("", b"", 2, dup=True, packet_id=1, properties=Properties(topic_alias=7)), 5,
        "3C 08 00 00 00 01 03 23 00 07", True, id="v5-publish-alias-only"),
    pytest.param(PubAck(1), 5, "40 02 00 01", True, id="v5-puback-short-form"),
    pytest.param(PubAck(1, ReasonCode.NO_MATCHING_SUBSCRIBERS), 5, "40 03 00 01 10", True, id="v5-puback-reason"),
    pytest.param(PubRel(0x1234), 4, "62 02 12 34", True, id="v311-pubrel-flags-0010"),
    pytest.param(Subscribe(1, (Subscription("a/b", SubscriptionOptions(1)),)), 4,
                 "82 08 00 01 00 03 61 2F 62 01", True, id="v311-subscribe"),
    pytest.param(Subscribe(1, (Subscription("a/b", SubscriptionOptions(2, True, True, 2)),)), 5,
                 "82 09 00 01 00 00 03 61 2F 62 2E", True, id="v5-subscribe-options"),
    pytest.param(SubAck(1, (ReasonCode.GRANTED_QOS_1, ReasonCode.UNSPECIFIED_ERROR)), 4, "90 04 00 01 01 80", False,
                 id="v311-suback-failure"),
    pytest.param(SubAck(2, (ReasonCode.TOPIC_FILTER_INVALID,)), 5, "90 04 00 02 00 8F", False, id="v5-suback"),
    pytest.param(Unsubscribe(3, ("a",)), 4, "A2 05 00 03 00 01 61", True, id="v311-unsubscribe"),
    pytest.param(UnsubAck(5), 4, "B0 02 00 05", False, id="v311-unsuback"),
    pytest.param(UnsubAck(5, (ReasonCode.NO_SUBSCRIPTION_EXISTED,)), 5, "B0 04 00 05 00 11", False,
                 id="v5-unsuback"),
    pytest.param(PingReq(), 4, "C0 00", True, id="pingreq"),
    pytest.param(PingResp(), 5, "D0 00", False, id="pingresp"),
    pytest.param(Disconnect(), 4, "E0 00", True, id="v311-disconnect"),
    pytest.param(Disconnect(ReasonCode.SESSION_TAKEN_OVER), 5, "E0 01 8E", False, id="v5-disconnect-taken-over"),
    pytest.param(Disconnect(ReasonCode.NORMAL_DISCONNECTION, Properties(reason_string="ok")), 5,
                 "E0 07 00 05 1F 00 02 6F 6B", False, id="v5-disconnect-reason-string"),
]


@pytest.mark.parametrize("packet, level, hex_bytes, server_side", GOLDEN)
def test_golden_bytes(packet, level, hex_bytes, server_side):
    """encode() produces the hand-checked bytes, and the parser turns them back into the packet."""
    data = bytes.fromhex(hex_bytes)
    assert encode(packet, level) == data
    if isinstance(packet, Connect):
        parser = MQTTParser()
    else:
        parser = MQTTParser(server_side=server_side, protocol_level=level)
    assert parser.feed(data) == [packet]


@pytest.mark.parametrize("value, hex_bytes", [
    (0, "00"), (127, "7F"), (128, "80 01"), (16_383, "FF 7F"), (16_384, "80 80 01"), (2_097_151, "FF FF 7F"),
    (2_097_152, "80 80 80 01"), (268_435_455, "FF FF FF 7F"),
])
def test_variable_byte_integer_table(value, hex_bytes):
    """Variable Byte Integers match the boundary table of MQTT 5.0 section 1.5.5 both ways."""
    data = bytes.fromhex(hex_bytes)
    assert encode_varint(value) == data
    assert Reader(data).varint("test") == value


def test_v5_connack_codes_map_to_v311_return_codes():
    """A 3.1.1 client is answered with the closest return code (MQTT-3.2.2-4 lists 0-5 only)."""
    assert v311_return_code(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION) == ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
    assert v311_return_code(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID) == ConnectReturnCode.IDENTIFIER_REJECTED
    assert v311_return_code(ReasonCode.BAD_USER_NAME_OR_PASSWORD) == ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD
    assert v311_return_code(ReasonCode.SERVER_BUSY) == ConnectReturnCode.SERVER_UNAVAILABLE
    assert encode(ConnAck(False, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION), 4) == bytes.fromhex("20 02 00 01")


def test_reason_code_names_and_values_follow_the_spec():
    """A sample of reason codes carries the value MQTT 5.0 section 2.4 gives it."""
    assert ReasonCode.MALFORMED_PACKET == 0x81 and ReasonCode.PROTOCOL_ERROR == 0x82
    assert ReasonCode.SESSION_TAKEN_OVER == 0x8E and ReasonCode.RECEIVE_MAXIMUM_EXCEEDED == 0x93
    assert ReasonCode.TOPIC_ALIAS_INVALID == 0x94 and ReasonCode.PACKET_TOO_LARGE == 0x95
    assert ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED == 0xA2
    assert ReasonCode.NORMAL_DISCONNECTION is ReasonCode.SUCCESS is ReasonCode.GRANTED_QOS_0
    assert len({int(c) for c in ReasonCode}) == 43


def test_encode_pubacks_is_each_short_puback_in_order():
    """encode_pubacks equals the short PUBACKs one by one at both levels, and refuses an id outside 1-65535."""
    ids = [1, 0x1234, 65535, 2]
    assert encode_pubacks(ids) == bytes.fromhex("40 02 00 01 40 02 12 34 40 02 FF FF 40 02 00 02")
    for level in (4, 5):
        assert encode_pubacks(ids) == b"".join(encode(PubAck(i), level) for i in ids)
    assert encode_pubacks([]) == b""
    for bad in ([0], [1, 65536]):
        with pytest.raises(ValueError):
            encode_pubacks(bad)
