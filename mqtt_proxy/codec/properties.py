"""MQTT 5.0 properties (section 2.2.2): the table of every property identifier,
its data type and the packets it may appear in; the :class:`Properties` value;
and their encoding and decoding.

A packet without properties shares the :data:`NO_PROPERTIES` singleton, so the
common case (every 3.1.1 packet, most v5 PUBLISHes) builds no object at all.
Errors follow the spec: an identifier unknown or not valid for the packet is a
Malformed Packet (section 2.2.2.2); a non-repeatable property given twice, or a
value the spec forbids (e.g. Receive Maximum 0), is a Protocol Error.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Callable, NamedTuple

from mqtt_proxy.codec.errors import MalformedPacket, ProtocolError
from mqtt_proxy.codec.reason import ReasonCode
from mqtt_proxy.codec.wire import (
    PacketType as T,
    Reader,
    encode_binary,
    encode_string,
    encode_u16,
    encode_u32,
    encode_varint,
)

WILL = "will"  # the context of the will properties inside CONNECT


class PropertyId(enum.IntEnum):
    """Property identifiers (MQTT 5.0 section 2.2.2.2, table 2-4)."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class DataType(enum.Enum):
    """The data types a property value can have (section 1.5)."""

    BYTE = "byte"
    TWO_BYTE_INT = "two-byte int"
    FOUR_BYTE_INT = "four-byte int"
    VARIABLE_BYTE_INT = "variable byte int"
    UTF8_STRING = "UTF-8 string"
    BINARY = "binary data"
    UTF8_STRING_PAIR = "UTF-8 string pair"


class PropertySpec(NamedTuple):
    """One row of table 2-4."""

    id: PropertyId
    field: str  # attribute of Properties
    type: DataType
    allowed_in: frozenset  # PacketType members and/or WILL


P, D = PropertyId, DataType
_PUB_WILL = frozenset({T.PUBLISH, WILL})
_ACKS = frozenset({T.CONNACK, T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP, T.SUBACK, T.UNSUBACK,
                   T.DISCONNECT, T.AUTH})
SPECS: dict[int, PropertySpec] = {s.id: s for s in (
    PropertySpec(P.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", D.BYTE, _PUB_WILL),
    PropertySpec(P.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", D.FOUR_BYTE_INT, _PUB_WILL),
    PropertySpec(P.CONTENT_TYPE, "content_type", D.UTF8_STRING, _PUB_WILL),
    PropertySpec(P.RESPONSE_TOPIC, "response_topic", D.UTF8_STRING, _PUB_WILL),
    PropertySpec(P.CORRELATION_DATA, "correlation_data", D.BINARY, _PUB_WILL),
    PropertySpec(P.SUBSCRIPTION_IDENTIFIER, "subscription_identifiers", D.VARIABLE_BYTE_INT,
                 frozenset({T.PUBLISH, T.SUBSCRIBE})),
    PropertySpec(P.SESSION_EXPIRY_INTERVAL, "session_expiry_interval", D.FOUR_BYTE_INT,
                 frozenset({T.CONNECT, T.CONNACK, T.DISCONNECT})),
    PropertySpec(P.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", D.UTF8_STRING, frozenset({T.CONNACK})),
    PropertySpec(P.SERVER_KEEP_ALIVE, "server_keep_alive", D.TWO_BYTE_INT, frozenset({T.CONNACK})),
    PropertySpec(P.AUTHENTICATION_METHOD, "authentication_method", D.UTF8_STRING,
                 frozenset({T.CONNECT, T.CONNACK, T.AUTH})),
    PropertySpec(P.AUTHENTICATION_DATA, "authentication_data", D.BINARY, frozenset({T.CONNECT, T.CONNACK, T.AUTH})),
    PropertySpec(P.REQUEST_PROBLEM_INFORMATION, "request_problem_information", D.BYTE, frozenset({T.CONNECT})),
    PropertySpec(P.WILL_DELAY_INTERVAL, "will_delay_interval", D.FOUR_BYTE_INT, frozenset({WILL})),
    PropertySpec(P.REQUEST_RESPONSE_INFORMATION, "request_response_information", D.BYTE, frozenset({T.CONNECT})),
    PropertySpec(P.RESPONSE_INFORMATION, "response_information", D.UTF8_STRING, frozenset({T.CONNACK})),
    PropertySpec(P.SERVER_REFERENCE, "server_reference", D.UTF8_STRING, frozenset({T.CONNACK, T.DISCONNECT})),
    PropertySpec(P.REASON_STRING, "reason_string", D.UTF8_STRING, _ACKS),
    PropertySpec(P.RECEIVE_MAXIMUM, "receive_maximum", D.TWO_BYTE_INT, frozenset({T.CONNECT, T.CONNACK})),
    PropertySpec(P.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", D.TWO_BYTE_INT, frozenset({T.CONNECT, T.CONNACK})),
    PropertySpec(P.TOPIC_ALIAS, "topic_alias", D.TWO_BYTE_INT, frozenset({T.PUBLISH})),
    PropertySpec(P.MAXIMUM_QOS, "maximum_qos", D.BYTE, frozenset({T.CONNACK})),
    PropertySpec(P.RETAIN_AVAILABLE, "retain_available", D.BYTE, frozenset({T.CONNACK})),
    PropertySpec(P.USER_PROPERTY, "user_properties", D.UTF8_STRING_PAIR,
                 _ACKS | {T.CONNECT, T.PUBLISH, WILL, T.SUBSCRIBE, T.UNSUBSCRIBE}),
    PropertySpec(P.MAXIMUM_PACKET_SIZE, "maximum_packet_size", D.FOUR_BYTE_INT, frozenset({T.CONNECT, T.CONNACK})),
    PropertySpec(P.WILDCARD_SUBSCRIPTION_AVAILABLE, "wildcard_subscription_available", D.BYTE,
                 frozenset({T.CONNACK})),
    PropertySpec(P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, "subscription_identifier_available", D.BYTE,
                 frozenset({T.CONNACK})),
    PropertySpec(P.SHARED_SUBSCRIPTION_AVAILABLE, "shared_subscription_available", D.BYTE, frozenset({T.CONNACK})),
)}

_is_flag: Callable[[int], bool] = (0, 1).__contains__
_non_zero: Callable[[int], bool] = bool
# Values the spec calls a Protocol Error (each property's clause in sections 3.1-3.15).
VALUE_RULES: dict[str, tuple[Callable[[int], bool], str]] = {
    "payload_format_indicator": (_is_flag, "must be 0 or 1"),
    "request_problem_information": (_is_flag, "must be 0 or 1"),
    "request_response_information": (_is_flag, "must be 0 or 1"),
    "maximum_qos": (_is_flag, "must be 0 or 1"),
    "retain_available": (_is_flag, "must be 0 or 1"),
    "wildcard_subscription_available": (_is_flag, "must be 0 or 1"),
    "subscription_identifier_available": (_is_flag, "must be 0 or 1"),
    "shared_subscription_available": (_is_flag, "must be 0 or 1"),
    "receive_maximum": (_non_zero, "must not be 0"),
    "maximum_packet_size": (_non_zero, "must not be 0"),
    "topic_alias": (_non_zero, "must not be 0 (MQTT-3.3.2-8)"),
    "subscription_identifiers": (_non_zero, "must not be 0"),
}


@dataclass(frozen=True, slots=True, repr=False)
class Properties:
    """The v5 properties of one packet (or of a will). None / empty means absent.

    Byte-valued flags stay ints (0/1) as on the wire. ``user_properties`` keeps
    the pairs in the order received; ``subscription_identifiers`` may hold
    several values only in a server-to-client PUBLISH.
    """

    payload_format_indicator: int | None = None  # 0 bytes, 1 UTF-8 payload
    message_expiry_interval: int | None = None  # seconds
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None  # seconds; 0xFFFFFFFF never expires
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None  # seconds
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None  # seconds
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __bool__(self) -> bool:
        """True if any property is present."""
        if self is NO_PROPERTIES:
            return False
        return any(getattr(self, f) not in (None, ()) for f in _FIELDS)

    def __repr__(self) -> str:
        """Only the properties present, e.g. ``Properties(topic_alias=3)``."""
        present = ((f, getattr(self, f)) for f in _FIELDS)
        return "Properties(" + ", ".join(f"{f}={v!r}" for f, v in present if v is not None and v != ()) + ")"

    def replace(self, **changes) -> "Properties":
        """A copy with some properties changed."""
        return dataclasses.replace(self, **changes)


_FIELDS = tuple(f.name for f in dataclasses.fields(Properties))
NO_PROPERTIES = Properties()
_EMPTY_BLOCK = b"\x00"


def _where_name(where) -> str:
    return "will properties" if where == WILL else T(where).name


def encode_properties(props: Properties | None, where) -> bytes:
    """The property block for packet type ``where`` (or WILL): length varint, then properties.

    Raises ValueError for a property not allowed there or a value out of range.
    """
    if props is None or props is NO_PROPERTIES:
        return _EMPTY_BLOCK
    if not isinstance(props, Properties):
        raise TypeError(f"expected Properties, got {type(props).__name__}")
    parts: list[bytes] = []
    for spec in SPECS.values():
        value = getattr(props, spec.field)
        if value is None or value == ():
            continue
        if where not in spec.allowed_in:
            raise ValueError(f"{spec.field} is not allowed in {_where_name(where)}")
        ident = bytes((spec.id,))
        if spec.type is D.UTF8_STRING_PAIR:
            for name, val in value:
                parts += (ident, encode_string(name), encode_string(val))
            continue
        if spec.type is D.VARIABLE_BYTE_INT:
            if len(value) > 1 and where != T.PUBLISH:
                raise ValueError(f"only a PUBLISH may carry several {spec.field}")
            for v in value:
                _check_value(spec.field, v, ValueError)
                if v > 268_435_455:
                    raise ValueError(f"{spec.field} {v} exceeds 268,435,455")
                parts += (ident, encode_varint(v))
            continue
        _check_value(spec.field, value, ValueError)
        parts += (ident, _ENCODERS[spec.type](value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def _encode_byte(value: int) -> bytes:
    if not 0 <= value <= 255:
        raise ValueError(f"{value} does not fit a byte")
    return bytes((value,))


_ENCODERS = {
    D.BYTE: _encode_byte,
    D.TWO_BYTE_INT: encode_u16,
    D.FOUR_BYTE_INT: encode_u32,
    D.UTF8_STRING: encode_string,
    D.BINARY: encode_binary,
}


def _check_value(field: str, value, error) -> None:
    rule = VALUE_RULES.get(field)
    if rule is not None and not rule[0](value):
        if error is ValueError:
            raise ValueError(f"{field} {value!r} {rule[1]}")
        raise ProtocolError(ReasonCode.PROTOCOL_ERROR, f"{field} {value!r} {rule[1]}")


def decode_properties(data: bytes, pos: int, end: int, where) -> tuple[Properties, int]:
    """Decode the property block at ``data[pos:end]``; return the properties and the position after them."""
    reader = Reader(data, pos, end)
    length = reader.varint("property length")
    if length == 0:
        return NO_PROPERTIES, reader.pos
    stop = reader.pos + length
    if stop > end:
        raise MalformedPacket(f"property length {length} runs past the end of the packet")
    reader.end = stop
    values: dict = {}
    users: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    while reader.pos < stop:
        ident = reader.varint("property identifier")
        spec = SPECS.get(ident)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{ident:02X}")
        if where not in spec.allowed_in:
            raise MalformedPacket(f"property {spec.id.name} is not valid in {_where_name(where)}")
        kind = spec.type
        if kind is D.UTF8_STRING_PAIR:
            users.append((reader.string("user property name"), reader.string("user property value")))
            continue
        if kind is D.VARIABLE_BYTE_INT:
            value = reader.varint(spec.field)
            if sub_ids and where != T.PUBLISH:
                raise ProtocolError(ReasonCode.PROTOCOL_ERROR, f"{spec.id.name} included more than once")
            _check_value(spec.field, value, ProtocolError)
            sub_ids.append(value)
            continue
        if kind is D.BYTE:
            value = reader.u8(spec.field)
        elif kind is D.TWO_BYTE_INT:
            value = reader.u16(spec.field)
        elif kind is D.FOUR_BYTE_INT:
            value = reader.u32(spec.field)
        elif kind is D.UTF8_STRING:
            value = reader.string(spec.field)
        else:
            value = reader.binary(spec.field)
        if spec.field in values:
            raise ProtocolError(ReasonCode.PROTOCOL_ERROR, f"{spec.id.name} included more than once")
        _check_value(spec.field, value, ProtocolError)
        values[spec.field] = value
    if users:
        values["user_properties"] = tuple(users)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values), stop
