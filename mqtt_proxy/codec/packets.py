"""The MQTT control packets as small frozen values, one class per packet type.

The same classes serve MQTT 3.1.1 (protocol level 4) and 5.0 (level 5). Fields
that 3.1.1 lacks (properties, most reason codes) keep their defaults there:
``NO_PROPERTIES`` and SUCCESS. Reason codes decoded from the wire are
:class:`ReasonCode` members (or :class:`ConnectReturnCode` in a 3.1.1 CONNACK).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Union

from mqtt_proxy.codec.properties import NO_PROPERTIES, Properties
from mqtt_proxy.codec.reason import ReasonCode
from mqtt_proxy.codec.wire import PacketType

MQTT_3_1_1 = 4
MQTT_5 = 5
PROTOCOL_LEVELS = (MQTT_3_1_1, MQTT_5)


class RetainHandling(enum.IntEnum):
    """When the server sends retained messages for a new subscription (v5, section 3.8.3.1)."""

    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


@dataclass(frozen=True, slots=True)
class Will:
    """The will message of a CONNECT: published if the connection ends without DISCONNECT."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES  # v5 will properties (will delay, expiry, ...)


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (section 3.1): the client's first packet."""

    packet_type: ClassVar[PacketType] = PacketType.CONNECT
    client_id: str = ""
    protocol_level: int = MQTT_3_1_1  # 4 = 3.1.1, 5 = 5.0
    clean_start: bool = True  # "clean session" in 3.1.1
    keep_alive: int = 60  # seconds, 0 disables
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK (section 3.2): the server's answer to CONNECT."""

    packet_type: ClassVar[PacketType] = PacketType.CONNACK
    session_present: bool = False
    reason_code: int = ReasonCode.SUCCESS  # a 3.1.1 return code (0-5) at level 4
    properties: Properties = NO_PROPERTIES


# Not frozen: one is made per message on the hot path, and a frozen dataclass's __init__
# costs about 7x a plain one. Treat it as immutable all the same.
@dataclass(slots=True)
class Publish:
    """PUBLISH (section 3.3): an application message, either direction."""

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None  # 1-65535 when qos > 0, None for qos 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubAck:
    """PUBACK (section 3.4): QoS 1 acknowledgement."""

    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRec:
    """PUBREC (section 3.5): QoS 2 delivery, part 1."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubRel:
    """PUBREL (section 3.6): QoS 2 delivery, part 2."""

    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PubComp:
    """PUBCOMP (section 3.7): QoS 2 delivery, part 3."""

    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """Options byte of one SUBSCRIBE entry (section 3.8.3.1); only ``qos`` exists in 3.1.1."""

    qos: int = 0  # maximum QoS
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RetainHandling.SEND_ON_SUBSCRIBE


class Subscription(NamedTuple):
    """One (topic filter, options) entry of a SUBSCRIBE."""

    topic_filter: str
    options: SubscriptionOptions = SubscriptionOptions()


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (section 3.8): at least one subscription."""

    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK (section 3.9): one reason code per subscription, in order."""

    packet_type: ClassVar[PacketType] = PacketType.SUBACK
    packet_id: int
    reason_codes: tuple[int, ...]  # 3.1.1 only has 0x00, 0x01, 0x02 and 0x80
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (section 3.10): at least one topic filter."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK (section 3.11): one reason code per topic filter in v5, none in 3.1.1."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK
    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ (section 3.12): keep-alive probe from the client."""

    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP (section 3.13): the server's answer to PINGREQ."""

    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (section 3.14): orderly close; the server may send it too in v5."""

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT
    reason_code: int = ReasonCode.NORMAL_DISCONNECTION
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (section 3.15, v5 only): extended authentication exchange."""

    packet_type: ClassVar[PacketType] = PacketType.AUTH
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = NO_PROPERTIES


Packet = Union[Connect, ConnAck, Publish, PubAck, PubRec, PubRel, PubComp, Subscribe, SubAck,
               Unsubscribe, UnsubAck, PingReq, PingResp, Disconnect, Auth]
PING_REQ = PingReq()
PING_RESP = PingResp()
