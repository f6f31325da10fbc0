"""Packet -> bytes, for MQTT 3.1.1 (level 4) and 5.0 (level 5).

``encode(packet, protocol_level)`` serialises any packet; at level 4 it omits
what 3.1.1 does not have (properties, reason codes of acks and DISCONNECT) and
maps SUBACK/CONNACK codes to their 3.1.1 values. Arguments that cannot make a
valid packet raise ``ValueError``/``TypeError`` (our bug, not the peer's).

The hot path is :func:`encode_publish` (fields in, one ``join`` out) and
:func:`patch_publish`, which re-stamps packet id, DUP and RETAIN on bytes
encoded once for many subscribers.
"""

from __future__ import annotations

import struct

from mqtt_proxy.codec.packets import (
    Auth, ConnAck, Connect, Disconnect, PingReq, PingResp, PubAck, PubComp, Publish, PubRec, PubRel,
    SubAck, Subscribe, UnsubAck, Unsubscribe,
)
from mqtt_proxy.codec.properties import NO_PROPERTIES, WILL, encode_properties
from mqtt_proxy.codec.reason import REASON_CODES_BY_PACKET, v311_return_code
from mqtt_proxy.codec.wire import (
    MAX_VARINT, PacketType as T, encode_binary, encode_string, encode_varint,
)

_HEAD2 = struct.Struct(">BB").pack  # fixed header with a 1-byte remaining length
_U16 = struct.Struct(">H").pack
_NO_PROPS = b"\x00"


_TOPIC_FIELDS: dict[str, bytes] = {}  # topic name -> its length-prefixed UTF-8 field, checked once
_TOPIC_FIELDS_MAX = 65536


def _topic_field(topic: str) -> bytes:
    """``topic``'s Topic Name field (2-byte length, UTF-8), checked and cached: deliveries repeat topics."""
    if "\x00" in topic or "+" in topic or "#" in topic:
        raise ValueError(f"{topic!r} is not a topic name (MQTT-3.3.2-2, MQTT-1.5.4-2)")
    raw = topic.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"topic of {len(raw)} bytes exceeds 65,535")
    if len(_TOPIC_FIELDS) >= _TOPIC_FIELDS_MAX:
        _TOPIC_FIELDS.clear()
    field = _TOPIC_FIELDS[topic] = _U16(len(raw)) + raw
    return field


def encode_publish(topic: str | bytes, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False,
                   packet_id: int | None = None, properties: bytes | None = None,
                   protocol_level: int = 4) -> bytes:
    """Encode a PUBLISH from its fields with one join.

    ``topic`` may be pre-encoded UTF-8. ``properties`` is a ready property block
    (``encode_properties(props, PacketType.PUBLISH)``, length prefix included)
    or None; it is ignored at level 4.
    """
    if qos == 1 and protocol_level == 4 and not dup and type(topic) is str and type(packet_id) is int \
            and 0 < packet_id <= 0xFFFF:
        # A subscriber's delivery at 3.1.1, the most common PUBLISH sent: the same bytes, fewer checks.
        field = _TOPIC_FIELDS.get(topic)
        if field is not None:
            length = len(field) + 2 + len(payload)
            if length < 128:
                return b"".join((_HEAD2(0x33 if retain else 0x32, length), field, _U16(packet_id), payload))
    if type(topic) is str:
        field = _TOPIC_FIELDS.get(topic)
        if field is None:
            field = _topic_field(topic)
    else:
        if len(topic) > 0xFFFF:
            raise ValueError(f"topic of {len(topic)} bytes exceeds 65,535")
        field = _U16(len(topic)) + topic
    if qos:
        if qos not in (1, 2):
            raise ValueError(f"QoS must be 0, 1 or 2, not {qos!r}")
        if not packet_id or not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"QoS {qos} needs a packet id in 1..65535, not {packet_id!r}")
        pid = _U16(packet_id)
    elif dup:
        raise ValueError("DUP must be 0 on QoS 0 (MQTT-3.3.1-2)")
    else:
        pid = b""
    if protocol_level == 5:
        props = _NO_PROPS if properties is None else properties
    elif protocol_level == 4:
        props = b""
    else:
        raise ValueError(f"protocol_level must be 4 or 5, not {protocol_level!r}")
    length = len(field) + len(pid) + len(props) + len(payload)
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    if length < 128:
        return b"".join((_HEAD2(b0, length), field, pid, props, payload))
    if length > MAX_VARINT:
        raise ValueError(f"PUBLISH of {length} bytes exceeds the MQTT maximum")
    return b"".join((bytes((b0,)), encode_varint(length), field, pid, props, payload))


def encode_pubacks(packet_ids: list[int]) -> bytes:
    """Successful PUBACKs for ``packet_ids``, in order, as one byte string (3.1.1 and 5.0 alike).

    Each is the shortest form: 0x40, remaining length 2, the packet id (a v5
    PUBACK may leave out reason code 0 and empty properties, section 3.4.2.1).
    """
    if packet_ids and (min(packet_ids) < 1 or max(packet_ids) > 0xFFFF):
        raise ValueError(f"a packet id of {packet_ids!r} is not 1-65535")
    return struct.pack(f">{len(packet_ids)}I", *[0x40020000 | pid for pid in packet_ids])


def patch_publish(data: bytes, packet_id: int | None = None, dup: bool | None = None,
                  retain: bool | None = None) -> bytes:
    """Copy of an encoded PUBLISH with a new packet id and/or DUP / RETAIN flag.

    Lets a broker encode a message once and stamp each subscriber's packet id.
    """
    if dup is None and retain is None and packet_id is not None and data[0] >> 4 == T.PUBLISH and data[0] & 6 \
            and 0 < packet_id <= 0xFFFF:
        # The delivery path: only a new packet id on a QoS 1/2 PUBLISH, spliced in without a bytearray.
        i = 1
        while data[i] & 0x80:
            i += 1
        at = i + 3 + ((data[i + 1] << 8) | data[i + 2])
        return b"".join((data[:at], _U16(packet_id), data[at + 2:]))
    out = bytearray(data)
    b0 = out[0]
    if b0 >> 4 != T.PUBLISH:
        raise ValueError("not an encoded PUBLISH")
    qos = (b0 >> 1) & 3
    if dup is not None:
        if dup and not qos:
            raise ValueError("DUP must be 0 on QoS 0 (MQTT-3.3.1-2)")
        b0 = (b0 | 8) if dup else (b0 & ~8)
    if retain is not None:
        b0 = (b0 | 1) if retain else (b0 & ~1)
    out[0] = b0
    if packet_id is not None:
        if not qos:
            raise ValueError("a QoS 0 PUBLISH has no packet id")
        if not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"packet id must be in 1..65535, not {packet_id!r}")
        i = 1
        while out[i] & 0x80:
            i += 1
        i += 1
        at = i + 2 + ((out[i] << 8) | out[i + 1])
        out[at:at + 2] = _U16(packet_id)
    return bytes(out)


def encode(packet, protocol_level: int) -> bytes:
    """Serialise ``packet`` for a connection speaking ``protocol_level`` (4 or 5)."""
    if protocol_level not in (4, 5):
        raise ValueError(f"protocol_level must be 4 or 5, not {protocol_level!r}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"cannot encode {type(packet).__name__}")
    return encoder(packet, protocol_level)


def _frame(b0: int, body: bytes) -> bytes:
    if len(body) > MAX_VARINT:
        raise ValueError(f"packet body of {len(body)} bytes exceeds the MQTT maximum")
    return bytes((b0,)) + encode_varint(len(body)) + body


def _check_packet_id(packet_id, ptype: T) -> bytes:
    if not isinstance(packet_id, int) or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"{ptype.name} packet id must be in 1..65535, not {packet_id!r}")
    return _U16(packet_id)


def _check_reason(code: int, ptype: T) -> int:
    if code not in REASON_CODES_BY_PACKET[ptype]:
        raise ValueError(f"0x{int(code):02X} is not a {ptype.name} reason code")
    return int(code)


def _check_qos(qos: int, what: str) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"{what} QoS must be 0, 1 or 2, not {qos!r}")


def _encode_connect(p: Connect, level: int) -> bytes:
    if p.protocol_level != level:
        raise ValueError(f"Connect.protocol_level {p.protocol_level} differs from protocol_level {level}")
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise ValueError(f"keep alive {p.keep_alive} does not fit two bytes")
    if level == 4 and p.password is not None and p.username is None:
        raise ValueError("3.1.1 needs a user name to send a password (MQTT-3.1.2-22)")
    flags = (0x02 if p.clean_start else 0) | (0x80 if p.username is not None else 0) \
        | (0x40 if p.password is not None else 0)
    will = p.will
    if will is not None:
        _check_qos(will.qos, "will")
        if not will.topic or "+" in will.topic or "#" in will.topic:
            raise ValueError(f"will topic {will.topic!r} is not a topic name")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    parts = [b"\x00\x04MQTT", bytes((level, flags)), _U16(p.keep_alive)]
    if level == 5:
        parts.append(encode_properties(p.properties, T.CONNECT))
    parts.append(encode_string(p.client_id))
    if will is not None:
        if level == 5:
            parts.append(encode_properties(will.properties, WILL))
        parts += (encode_string(will.topic), encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_string(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(p: ConnAck, level: int) -> bytes:
    if p.session_present and p.reason_code:
        raise ValueError("session present must be 0 on a refused CONNACK (MQTT-3.2.2-6)")
    flags = 1 if p.session_present else 0
    if level == 4:
        return bytes((0x20, 2, flags, v311_return_code(p.reason_code)))
    code = _check_reason(p.reason_code, T.CONNACK)
    return _frame(0x20, bytes((flags, code)) + encode_properties(p.properties, T.CONNACK))


def _ack_encoder(ptype: T, b0: int):
    def encode_ack(p, level: int) -> bytes:
        pid = _check_packet_id(p.packet_id, ptype)
        if level == 4:
            return bytes((b0, 2)) + pid
        code = _check_reason(p.reason_code, ptype)
        if p.properties is NO_PROPERTIES or not p.properties:
            if not code:
                return bytes((b0, 2)) + pid
            return bytes((b0, 3)) + pid + bytes((code,))
        return _frame(b0, pid + bytes((code,)) + encode_properties(p.properties, ptype))
    encode_ack.__doc__ = f"Encode a {ptype.name}, in its shortest form."
    return encode_ack


def _encode_publish(p: Publish, level: int) -> bytes:
    _check_qos(p.qos, "PUBLISH")
    props = None
    if level == 5 and p.properties is not NO_PROPERTIES:
        props = encode_properties(p.properties, T.PUBLISH)
    if not p.topic and (level == 4 or p.properties.topic_alias is None):
        raise ValueError("an empty topic needs a Topic Alias (MQTT-4.7.3-1)")
    if not p.qos and p.packet_id is not None:
        raise ValueError("a QoS 0 PUBLISH has no packet id")
    return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, props, level)


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    parts = [_check_packet_id(p.packet_id, T.SUBSCRIBE)]
    if not p.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one subscription (MQTT-3.8.3-2)")
    if level == 5:
        parts.append(encode_properties(p.properties, T.SUBSCRIBE))
    for topic_filter, o in p.subscriptions:
        _check_qos(o.qos, "subscription")
        opts = o.qos
        if level == 5:
            if o.retain_handling not in (0, 1, 2):
                raise ValueError(f"retain handling must be 0, 1 or 2, not {o.retain_handling!r}")
            opts |= (0x04 if o.no_local else 0) | (0x08 if o.retain_as_published else 0) | (o.retain_handling << 4)
        parts += (encode_string(topic_filter), bytes((opts,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(p: SubAck, level: int) -> bytes:
    pid = _check_packet_id(p.packet_id, T.SUBACK)
    if not p.reason_codes:
        raise ValueError("SUBACK needs one reason code per subscription")
    codes = [_check_reason(c, T.SUBACK) for c in p.reason_codes]
    if level == 4:
        return _frame(0x90, pid + bytes(c if c < 0x80 else 0x80 for c in codes))
    return _frame(0x90, pid + encode_properties(p.properties, T.SUBACK) + bytes(codes))


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    parts = [_check_packet_id(p.packet_id, T.UNSUBSCRIBE)]
    if not p.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")
    if level == 5:
        parts.append(encode_properties(p.properties, T.UNSUBSCRIBE))
    parts += (encode_string(f) for f in p.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(p: UnsubAck, level: int) -> bytes:
    pid = _check_packet_id(p.packet_id, T.UNSUBACK)
    if level == 4:
        return b"\xb0\x02" + pid
    if not p.reason_codes:
        raise ValueError("a v5 UNSUBACK needs one reason code per topic filter")
    codes = bytes(_check_reason(c, T.UNSUBACK) for c in p.reason_codes)
    return _frame(0xB0, pid + encode_properties(p.properties, T.UNSUBACK) + codes)


def _short_reason_encoder(ptype: T, b0: int):
    def encode_short(p, level: int) -> bytes:
        if level == 4:
            if ptype == T.AUTH:
                raise ValueError("AUTH does not exist in MQTT 3.1.1")
            return bytes((b0, 0))
        code = _check_reason(p.reason_code, ptype)
        if p.properties is NO_PROPERTIES or not p.properties:
            return bytes((b0, 1, code)) if code else bytes((b0, 0))
        return _frame(b0, bytes((code,)) + encode_properties(p.properties, ptype))
    encode_short.__doc__ = f"Encode a {ptype.name}, in its shortest form."
    return encode_short


_ENCODERS = {
    Connect: _encode_connect,
    ConnAck: _encode_connack,
    Publish: _encode_publish,
    PubAck: _ack_encoder(T.PUBACK, 0x40),
    PubRec: _ack_encoder(T.PUBREC, 0x50),
    PubRel: _ack_encoder(T.PUBREL, 0x62),
    PubComp: _ack_encoder(T.PUBCOMP, 0x70),
    Subscribe: _encode_subscribe,
    SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    UnsubAck: _encode_unsuback,
    PingReq: lambda p, level: b"\xc0\x00",
    PingResp: lambda p, level: b"\xd0\x00",
    Disconnect: _short_reason_encoder(T.DISCONNECT, 0xE0),
    Auth: _short_reason_encoder(T.AUTH, 0xF0),
}
