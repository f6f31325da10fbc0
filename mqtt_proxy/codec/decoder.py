"""The incremental MQTT parser: bytes in, packets out, for 3.1.1 and 5.0.

``MQTTParser.feed(data)`` accepts any split of the byte stream (one byte at a
time or many packets per chunk) and returns the packets completed so far. It
raises only :class:`ProtocolError`; once it has raised, it is dead and every
later ``feed`` raises the same error. PUBLISH, the hot path, is decoded inline
in the framing loop with slicing, never a per-byte Python loop.

Packet direction (server side receives CONNECT, SUBSCRIBE, ...; client side
CONNACK, SUBACK, ...) and the CONNECT rules (first packet, only once) are
enforced here because the version the rest of the stream is parsed with comes
from that CONNECT.
"""

from __future__ import annotations

from mqtt_proxy.codec.errors import MalformedPacket, PacketTooLarge, ProtocolError, UnsupportedProtocolVersion
from mqtt_proxy.codec.packets import (
    PING_REQ, PING_RESP, Auth, ConnAck, Connect, Disconnect, PubAck, PubComp, Publish, PubRec, PubRel,
    SubAck, Subscribe, Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
)
from mqtt_proxy.codec.properties import NO_PROPERTIES, WILL, Properties, decode_properties
from mqtt_proxy.codec.reason import REASON_BY_VALUE, REASON_CODES_BY_PACKET, ConnectReturnCode, ReasonCode
from mqtt_proxy.codec.topic import SHARE_PREFIX
from mqtt_proxy.codec.wire import MAX_PACKET_SIZE, PacketType as T, Reader

SERVER_RECEIVES = frozenset({T.CONNECT, T.PUBLISH, T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP, T.SUBSCRIBE,
                             T.UNSUBSCRIBE, T.PINGREQ, T.DISCONNECT, T.AUTH})
CLIENT_RECEIVES = frozenset({T.CONNACK, T.PUBLISH, T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP, T.SUBACK,
                             T.UNSUBACK, T.PINGRESP, T.DISCONNECT, T.AUTH})
_FLAGS_0010 = frozenset({T.PUBREL, T.SUBSCRIBE, T.UNSUBSCRIBE})
_V311_SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80})

# PUBLISH fixed-header flags -> (qos, retain, dup); None where the flags are malformed.
_PUBLISH_FLAGS: list = [None] * 16
for _f in range(16):
    _q = (_f >> 1) & 3
    if _q != 3 and not (_q == 0 and _f & 8):
        _PUBLISH_FLAGS[_f] = (_q, bool(_f & 1), bool(_f & 8))


_PUBACKS: list = [None] * 65536  # packet id -> PubAck(packet_id), filled as ids are seen (immutable values)


def _protocol_error(message: str) -> ProtocolError:
    return ProtocolError(ReasonCode.PROTOCOL_ERROR, message)


class MQTTParser:
    """Incremental parser for one connection.

    ``max_packet_size`` counts the whole packet (fixed header included), as the
    v5 Maximum Packet Size does; a larger packet is refused as soon as its fixed
    header arrives, before its body is buffered. ``server_side`` selects the
    packets the peer may send. ``protocol_level`` (4 or 5) is the version already
    agreed: required on the client side; on the server side leave it None and
    the first CONNECT sets it.
    """

    # One per connection: slots, and no buffer list until a packet arrives in pieces.
    __slots__ = ("max_packet_size", "protocol_level", "_receives", "_pending", "_need", "_error")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, server_side: bool = True,
                 protocol_level: int | None = None) -> None:
        if protocol_level not in (None, 4, 5):
            raise ValueError(f"protocol_level must be 4 or 5, not {protocol_level!r}")
        if not server_side and protocol_level is None:
            raise ValueError("a client-side parser needs the protocol_level its CONNECT used")
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be within 2..{MAX_PACKET_SIZE}")
        self.max_packet_size = max_packet_size
        self.protocol_level = protocol_level
        self._receives = SERVER_RECEIVES if server_side else CLIENT_RECEIVES
        self._pending: bytearray | None = None  # the bytes of an incomplete packet, once there are any
        self._need = 0  # buffered bytes needed before parsing is worth trying again
        self._error: ProtocolError | None = None

    @property
    def server_side(self) -> bool:
        """Whether this parser reads what a client sends (a slot less per connection than a flag of its own)."""
        return self._receives is SERVER_RECEIVES

    @property
    def buffered(self) -> int:
        """Bytes held for a packet that is not complete yet."""
        pending = self._pending
        return 0 if pending is None else len(pending)

    def feed(self, data: bytes) -> list:
        """Consume ``data``; return the packets it completed, in order."""
        if self._error is not None:
            raise self._error
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"feed() takes bytes, not {type(data).__name__}")
        pending = self._pending
        if pending is not None:
            pending += data
            if len(pending) < self._need:
                return []
            buf = bytes(pending)
        else:
            buf = data if type(data) is bytes else bytes(data)
        out: list = []
        try:
            pos = self._parse(buf, out)
        except ProtocolError as exc:
            exc.parsed = tuple(out)
            exc.protocol_level = self.protocol_level
            self._error = exc
            self._pending = None
            raise
        if pos < len(buf):
            # One growing buffer for an incomplete packet, whatever the split: a peer sending a byte per read
            # costs a byte per byte, not an object per read (issue 26).
            self._pending = bytearray(memoryview(buf)[pos:])
        elif pending is not None:
            self._pending = None
        return out

    def _parse(self, buf: bytes, out: list) -> int:
        """Decode every complete packet in ``buf``; return where the incomplete tail starts."""
        n = len(buf)
        pos = 0
        limit = self.max_packet_size
        level = self.protocol_level
        append = out.append
        publish_flags = _PUBLISH_FLAGS
        while True:
            if n - pos < 2:
                self._need = 2
                return pos
            b0 = buf[pos]
            length = buf[pos + 1]
            if length < 0x80:
                start = pos + 2
            else:  # remaining length spans 2-4 bytes (section 2.1.4)
                length &= 0x7F
                i = pos + 2
                shift = 7
                while True:
                    if i >= n:
                        self._need = i - pos + 1
                        return pos
                    byte = buf[i]
                    i += 1
                    length |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        if byte == 0:
                            raise MalformedPacket("remaining length is not minimally encoded (MQTT-1.5.5-1)")
                        break
                    shift += 7
                    if shift > 21:
                        raise MalformedPacket("remaining length is longer than four bytes")
                start = i
            end = start + length
            if end - pos > limit:
                raise PacketTooLarge(end - pos, limit)
            if end > n:
                self._need = end - pos
                return pos
            if b0 >> 4 == 3 and level is not None:
                # PUBLISH, inline (section 3.3)
                fl = publish_flags[b0 & 0x0F]
                if fl is None:
                    raise MalformedPacket("PUBLISH with QoS 3 (MQTT-3.3.1-4)" if b0 & 0x06 == 0x06
                                          else "PUBLISH with DUP set on QoS 0 (MQTT-3.3.1-2)")
                qos = fl[0]
                if start + 2 > end:
                    raise MalformedPacket("PUBLISH ends inside the topic length")
                p = start + 2 + ((buf[start] << 8) | buf[start + 1])
                if p > end:
                    raise MalformedPacket("PUBLISH ends inside the topic name")
                try:
                    topic = buf[start + 2:p].decode()
                except UnicodeDecodeError:
                    raise MalformedPacket("PUBLISH topic is not well-formed UTF-8 (MQTT-1.5.4-1)") from None
                if qos:
                    if p + 2 > end:
                        raise MalformedPacket("PUBLISH ends inside the packet identifier")
                    packet_id = (buf[p] << 8) | buf[p + 1]
                    if not packet_id:
                        raise _protocol_error("PUBLISH with QoS > 0 has packet identifier 0 (MQTT-2.2.1-3)")
                    p += 2
                else:
                    packet_id = None
                props = NO_PROPERTIES
                if level == 5:
                    if p >= end:
                        raise MalformedPacket("PUBLISH ends before its property length")
                    if buf[p]:
                        props, p = decode_properties(buf, p, end, T.PUBLISH)
                        self._check_publish_properties(props)
                    else:
                        p += 1
                if "\x00" in topic or "+" in topic or "#" in topic or not topic:
                    _check_topic_name(topic, props)
                append(Publish(topic, buf[p:end], qos, fl[1], fl[2], packet_id, props))
            elif b0 == 0x40 and end - start == 2 and level is not None and (buf[start] or buf[start + 1]):
                # PUBACK with just a packet id (3.1.1, and v5's short SUCCESS form, section 3.4.2.1): one
                # per QoS 1 delivery. A frozen dataclass is costly to build, so each id's is built once.
                packet_id = (buf[start] << 8) | buf[start + 1]
                ack = _PUBACKS[packet_id]
                if ack is None:
                    ack = _PUBACKS[packet_id] = PubAck(packet_id)
                append(ack)
            else:
                append(self._decode_other(b0, buf[start:end]))
                level = self.protocol_level
            pos = end

    def _check_publish_properties(self, props: Properties) -> None:
        if self.server_side and props.subscription_identifiers:
            raise _protocol_error("a client PUBLISH must not carry a Subscription Identifier (MQTT-3.3.4-6)")

    def _decode_other(self, b0: int, body: bytes):
        """Decode any packet but an inline PUBLISH, enforcing direction, flags and CONNECT order."""
        ptype = b0 >> 4
        flags = b0 & 0x0F
        level = self.protocol_level
        if ptype == 0:
            raise MalformedPacket("packet type 0 is reserved")
        if level is None and ptype != T.CONNECT:
            raise _protocol_error(f"first packet is {T(ptype).name}, not CONNECT (MQTT-3.1.0-1)")
        if ptype == T.AUTH and level == 4:
            raise MalformedPacket("packet type 15 is reserved in MQTT 3.1.1")
        if ptype not in self._receives:
            side = "client" if self.server_side else "server"
            raise _protocol_error(f"{T(ptype).name} cannot be sent by a {side}")
        if flags != (2 if ptype in _FLAGS_0010 else 0):
            raise MalformedPacket(f"{T(ptype).name} with reserved flag bits 0b{flags:04b} (MQTT-2.1.3-1)")
        if ptype == T.CONNECT:
            if level is not None:
                raise _protocol_error("second CONNECT on one connection (MQTT-3.1.0-2)")
            packet = decode_connect(body)
            self.protocol_level = packet.protocol_level
            return packet
        return _DECODERS[ptype](Reader(body), level)


def _check_topic_name(topic: str, props: Properties) -> None:
    """Slow path of the PUBLISH topic checks (only reached when one of them fails or the topic is empty)."""
    if "\x00" in topic:
        raise MalformedPacket("PUBLISH topic contains U+0000 (MQTT-1.5.4-2)")
    if "+" in topic or "#" in topic:
        raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID,
                             f"PUBLISH topic {topic!r} contains a wildcard (MQTT-3.3.2-2)")
    if not topic and props.topic_alias is None:
        raise _protocol_error("PUBLISH topic is empty and there is no Topic Alias (MQTT-4.7.3-1)")


def _reason(code: int, ptype: T) -> ReasonCode:
    if code not in REASON_CODES_BY_PACKET[ptype]:
        raise _protocol_error(f"reason code 0x{code:02X} is not allowed in {ptype.name}")
    return REASON_BY_VALUE[code]


def _end(r: Reader, ptype: T) -> None:
    if r.remaining():
        raise MalformedPacket(f"{r.remaining()} unexpected bytes at the end of {ptype.name}")


def _packet_id(r: Reader, ptype: T) -> int:
    packet_id = r.u16("packet identifier")
    if not packet_id:
        raise _protocol_error(f"{ptype.name} has packet identifier 0 (MQTT-2.2.1-3)")
    return packet_id


def decode_connect(body: bytes) -> Connect:
    """Decode a CONNECT body; the protocol level comes from the packet itself."""
    r = Reader(body)
    name = r.raw(r.u16("protocol name"), "protocol name").decode("utf-8", "replace")
    level = r.u8("protocol level")
    if name != "MQTT" or level not in (4, 5):
        raise UnsupportedProtocolVersion(name, level)
    flags = r.u8("connect flags")
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set (MQTT-3.1.2-3)")
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 3
    will_retain = bool(flags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS or will retain set without the will flag (MQTT-3.1.2-11, -13)")
    if will_qos == 3:
        raise MalformedPacket("will QoS 3 (MQTT-3.1.2-12)")
    has_password = flags & 0x40
    has_username = flags & 0x80
    if level == 4 and has_password and not has_username:
        raise _protocol_error("password flag without user name flag (MQTT-3.1.2-22)")
    keep_alive = r.u16("keep alive")
    props = NO_PROPERTIES
    if level == 5:
        props, r.pos = decode_properties(body, r.pos, r.end, T.CONNECT)
        if props.authentication_data is not None and props.authentication_method is None:
            raise _protocol_error("Authentication Data without Authentication Method")
    client_id = r.string("client identifier")
    will = None
    if will_flag:
        will_props = NO_PROPERTIES
        if level == 5:
            will_props, r.pos = decode_properties(body, r.pos, r.end, WILL)
        will_topic = r.string("will topic")
        if not will_topic or "+" in will_topic or "#" in will_topic:
            raise ProtocolError(ReasonCode.TOPIC_NAME_INVALID, f"will topic {will_topic!r} is not a topic name")
        will = Will(will_topic, r.binary("will payload"), will_qos, will_retain, will_props)
    username = r.string("user name") if has_username else None
    password = r.binary("password") if has_password else None
    _end(r, T.CONNECT)
    return Connect(client_id, level, bool(flags & 0x02), keep_alive, will, username, password, props)


def _decode_connack(r: Reader, level: int) -> ConnAck:
    ack_flags = r.u8("connect acknowledge flags")
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flag bits are set (MQTT-3.2.2-1)")
    code = r.u8("connect reason code")
    props = NO_PROPERTIES
    if level == 4:
        if code > 5:
            raise _protocol_error(f"0x{code:02X} is not a 3.1.1 CONNACK return code")
        reason = ConnectReturnCode(code)
    else:
        reason = _reason(code, T.CONNACK)
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.CONNACK)
    _end(r, T.CONNACK)
    return ConnAck(bool(ack_flags), reason, props)


def _ack_decoder(cls, ptype: T):
    def decode(r: Reader, level: int):
        packet_id = _packet_id(r, ptype)
        if level == 4 or not r.remaining():
            _end(r, ptype)
            return cls(packet_id)
        reason = _reason(r.u8("reason code"), ptype)
        props = NO_PROPERTIES
        if r.remaining():
            props, r.pos = decode_properties(r.data, r.pos, r.end, ptype)
        _end(r, ptype)
        return cls(packet_id, reason, props)
    decode.__doc__ = f"Decode a {ptype.name} body (section 3.{int(ptype)}); the short v5 forms mean SUCCESS."
    return decode


def _decode_subscribe(r: Reader, level: int) -> Subscribe:
    packet_id = _packet_id(r, T.SUBSCRIBE)
    props = NO_PROPERTIES
    if level == 5:
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.SUBSCRIBE)
    subs = []
    while r.remaining():
        topic_filter = r.string("topic filter")
        opts = r.u8("subscription options")
        qos = opts & 3
        if level == 4:
            if opts & 0xFC or qos == 3:
                raise MalformedPacket("SUBSCRIBE options reserved bits set or QoS 3 (MQTT-3.8.3-4)")
            subs.append(Subscription(topic_filter, _V311_OPTIONS[qos]))
            continue
        if opts & 0xC0:
            raise MalformedPacket("SUBSCRIBE options reserved bits set (MQTT-3.8.3-5)")
        if qos == 3:
            raise _protocol_error("SUBSCRIBE with maximum QoS 3")
        retain_handling = (opts >> 4) & 3
        if retain_handling == 3:
            raise _protocol_error("SUBSCRIBE with retain handling 3")
        no_local = bool(opts & 0x04)
        if no_local and topic_filter.startswith(SHARE_PREFIX):
            raise _protocol_error("No Local on a shared subscription (MQTT-3.8.3-4)")
        subs.append(Subscription(topic_filter, SubscriptionOptions(qos, no_local, bool(opts & 0x08), retain_handling)))
    if not subs:
        raise _protocol_error("SUBSCRIBE without any topic filter (MQTT-3.8.3-2, 3.1.1: MQTT-3.8.3-3)")
    return Subscribe(packet_id, tuple(subs), props)


_V311_OPTIONS = tuple(SubscriptionOptions(q) for q in range(3))


def _decode_suback(r: Reader, level: int) -> SubAck:
    packet_id = _packet_id(r, T.SUBACK)
    props = NO_PROPERTIES
    if level == 5:
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.SUBACK)
        codes = tuple(_reason(c, T.SUBACK) for c in r.rest())
    else:
        codes = tuple(r.rest())
        for c in codes:
            if c not in _V311_SUBACK_CODES:
                raise _protocol_error(f"0x{c:02X} is not a 3.1.1 SUBACK return code")
        codes = tuple(REASON_BY_VALUE[c] for c in codes)
    if not codes:
        raise _protocol_error("SUBACK without any reason code")
    return SubAck(packet_id, codes, props)


def _decode_unsubscribe(r: Reader, level: int) -> Unsubscribe:
    packet_id = _packet_id(r, T.UNSUBSCRIBE)
    props = NO_PROPERTIES
    if level == 5:
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.UNSUBSCRIBE)
    filters = []
    while r.remaining():
        filters.append(r.string("topic filter"))
    if not filters:
        raise _protocol_error("UNSUBSCRIBE without any topic filter (MQTT-3.10.3-2)")
    return Unsubscribe(packet_id, tuple(filters), props)


def _decode_unsuback(r: Reader, level: int) -> UnsubAck:
    packet_id = _packet_id(r, T.UNSUBACK)
    if level == 4:
        _end(r, T.UNSUBACK)
        return UnsubAck(packet_id)
    props, r.pos = decode_properties(r.data, r.pos, r.end, T.UNSUBACK)
    codes = tuple(_reason(c, T.UNSUBACK) for c in r.rest())
    if not codes:
        raise _protocol_error("UNSUBACK without any reason code")
    return UnsubAck(packet_id, codes, props)


def _decode_ping(packet):
    def decode(r: Reader, level: int):
        _end(r, packet.packet_type)
        return packet
    return decode


def _decode_disconnect(r: Reader, level: int) -> Disconnect:
    if level == 4 or not r.remaining():
        _end(r, T.DISCONNECT)
        return Disconnect()
    reason = _reason(r.u8("reason code"), T.DISCONNECT)
    props = NO_PROPERTIES
    if r.remaining():
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.DISCONNECT)
    _end(r, T.DISCONNECT)
    return Disconnect(reason, props)


def _decode_auth(r: Reader, level: int) -> Auth:
    if not r.remaining():
        return Auth()
    reason = _reason(r.u8("reason code"), T.AUTH)
    props = NO_PROPERTIES
    if r.remaining():
        props, r.pos = decode_properties(r.data, r.pos, r.end, T.AUTH)
    _end(r, T.AUTH)
    return Auth(reason, props)


# Body decoders by packet type; PUBLISH is decoded inline in MQTTParser._parse and
# CONNECT by decode_connect (it sets the protocol level).
_DECODERS = {
    T.CONNACK: _decode_connack,
    T.PUBACK: _ack_decoder(PubAck, T.PUBACK),
    T.PUBREC: _ack_decoder(PubRec, T.PUBREC),
    T.PUBREL: _ack_decoder(PubRel, T.PUBREL),
    T.PUBCOMP: _ack_decoder(PubComp, T.PUBCOMP),
    T.SUBSCRIBE: _decode_subscribe,
    T.SUBACK: _decode_suback,
    T.UNSUBSCRIBE: _decode_unsubscribe,
    T.UNSUBACK: _decode_unsuback,
    T.PINGREQ: _decode_ping(PING_REQ),
    T.PINGRESP: _decode_ping(PING_RESP),
    T.DISCONNECT: _decode_disconnect,
    T.AUTH: _decode_auth,
}
