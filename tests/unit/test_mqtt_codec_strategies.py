"""Hypothesis strategies for MQTT packets, shared by the codec test modules.

Named test_mqtt_codec_* to sit with the codec tests; it holds no tests itself.
Every strategy draws only packets that the given protocol level can represent,
so that decode(encode(packet)) == packet.
"""

import functools

from hypothesis import strategies as st

from mqtt_proxy.codec import (
    NO_PROPERTIES, WILL, Auth, ConnAck, Connect, Disconnect, MQTTParser, PacketType, PingReq, PingResp,
    Properties, PubAck, PubComp, Publish, PubRec, PubRel, SubAck, Subscribe, Subscription,
    SubscriptionOptions, UnsubAck, Unsubscribe, Will,
)
from mqtt_proxy.codec.properties import SPECS, VALUE_RULES, DataType
from mqtt_proxy.codec.reason import REASON_CODES_BY_PACKET

T = PacketType
mqtt_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
topic_names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
                      min_size=1, max_size=12)
topic_filters = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                        min_size=1, max_size=12).filter(lambda f: not f.startswith("$share/"))
packet_ids = st.integers(1, 0xFFFF)
payloads = st.binary(max_size=64)


def _value(spec, where):
    non_zero = spec.field in VALUE_RULES and VALUE_RULES[spec.field][1] != "must be 0 or 1"
    low = 1 if non_zero else 0
    if spec.type is DataType.BYTE:
        return st.integers(0, 1)
    if spec.type is DataType.TWO_BYTE_INT:
        return st.integers(low, 0xFFFF)
    if spec.type is DataType.FOUR_BYTE_INT:
        return st.integers(low, 0xFFFFFFFF)
    if spec.type is DataType.VARIABLE_BYTE_INT:
        many = 3 if where == T.PUBLISH else 1
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=many).map(tuple)
    if spec.type is DataType.UTF8_STRING:
        return mqtt_text
    if spec.type is DataType.BINARY:
        return st.binary(max_size=16)
    return st.lists(st.tuples(mqtt_text, mqtt_text), min_size=1, max_size=3).map(tuple)


def _fix(values: dict) -> Properties:
    if "authentication_data" in values and "authentication_method" not in values:
        values["authentication_method"] = "SCRAM"
    return Properties(**values) if values else NO_PROPERTIES


@functools.lru_cache(maxsize=None)
def properties(where, level: int = 5):
    """Properties valid in packet type ``where`` (or WILL); always empty at level 4."""
    if level == 4:
        return st.just(NO_PROPERTIES)
    specs = [s for s in SPECS.values() if where in s.allowed_in]

    @st.composite
    def draw_properties(draw):
        chosen = draw(st.lists(st.sampled_from(specs), max_size=4, unique=True)) if specs else []
        return _fix({spec.field: draw(_value(spec, where)) for spec in chosen})
    return draw_properties()


@functools.lru_cache(maxsize=None)
def reason_codes(ptype):
    """A reason code valid in a v5 packet of type ``ptype``."""
    return st.sampled_from(sorted(REASON_CODES_BY_PACKET[ptype]))


@st.composite
def connects(draw, level):
    """A CONNECT at ``level``."""
    will = None
    if draw(st.booleans()):
        will = Will(draw(topic_names), draw(payloads), draw(st.integers(0, 2)), draw(st.booleans()),
                    draw(properties(WILL, level)))
    username = draw(st.none() | mqtt_text)
    password = draw(st.none() | st.binary(max_size=16))
    if level == 4 and username is None:
        password = None
    return Connect(draw(mqtt_text), level, draw(st.booleans()), draw(st.integers(0, 0xFFFF)), will,
                   username, password, draw(properties(T.CONNECT, level)))


@st.composite
def connacks(draw, level):
    """A CONNACK at ``level``."""
    code = draw(st.integers(0, 5) if level == 4 else reason_codes(T.CONNACK))
    present = draw(st.booleans()) if code == 0 else False
    return ConnAck(present, code, draw(properties(T.CONNACK, level)))


@st.composite
def publishes(draw, level, from_client=False):
    """A PUBLISH at ``level``; a client's carries no Subscription Identifier (MQTT-3.3.4-6)."""
    qos = draw(st.integers(0, 2))
    props = draw(properties(T.PUBLISH, level))
    if from_client and props.subscription_identifiers:
        props = props.replace(subscription_identifiers=())
    topic = draw(topic_names)
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(topic, draw(payloads), qos, draw(st.booleans()), draw(st.booleans()) if qos else False,
                   draw(packet_ids) if qos else None, props)


def acks(cls, ptype, level):
    """PUBACK / PUBREC / PUBREL / PUBCOMP at ``level``."""
    if level == 4:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, reason_codes(ptype), properties(ptype))


@st.composite
def subscribes(draw, level):
    """A SUBSCRIBE with 1-4 entries at ``level``."""
    subs = []
    for topic_filter in draw(st.lists(topic_filters, min_size=1, max_size=4)):
        if level == 4:
            options = SubscriptionOptions(draw(st.integers(0, 2)))
        else:
            options = SubscriptionOptions(draw(st.integers(0, 2)), draw(st.booleans()), draw(st.booleans()),
                                          draw(st.integers(0, 2)))
        subs.append(Subscription(topic_filter, options))
    return Subscribe(draw(packet_ids), tuple(subs), draw(properties(T.SUBSCRIBE, level)))


def subacks(level):
    """A SUBACK at ``level`` (3.1.1 codes 0x00, 0x01, 0x02, 0x80)."""
    codes = st.sampled_from([0, 1, 2, 0x80]) if level == 4 else reason_codes(T.SUBACK)
    return st.builds(SubAck, packet_ids, st.lists(codes, min_size=1, max_size=4).map(tuple),
                     properties(T.SUBACK, level))


def unsubscribes(level):
    """An UNSUBSCRIBE at ``level``."""
    return st.builds(Unsubscribe, packet_ids, st.lists(topic_filters, min_size=1, max_size=4).map(tuple),
                     properties(T.UNSUBSCRIBE, level))


def unsubacks(level):
    """An UNSUBACK at ``level`` (no reason codes in 3.1.1)."""
    if level == 4:
        return st.builds(UnsubAck, packet_ids)
    return st.builds(UnsubAck, packet_ids, st.lists(reason_codes(T.UNSUBACK), min_size=1, max_size=4).map(tuple),
                     properties(T.UNSUBACK))


def disconnects(level):
    """A DISCONNECT at ``level``."""
    if level == 4:
        return st.just(Disconnect())
    return st.builds(Disconnect, reason_codes(T.DISCONNECT), properties(T.DISCONNECT))


def auths():
    """An AUTH (v5 only)."""
    return st.builds(Auth, reason_codes(T.AUTH), properties(T.AUTH))


@functools.lru_cache(maxsize=None)
def client_packets(level):
    """Any packet a client sends after CONNECT."""
    options = [publishes(level, from_client=True), acks(PubAck, T.PUBACK, level), acks(PubRec, T.PUBREC, level),
               acks(PubRel, T.PUBREL, level), acks(PubComp, T.PUBCOMP, level), subscribes(level),
               unsubscribes(level), st.just(PingReq()), disconnects(level)]
    if level == 5:
        options.append(auths())
    return st.one_of(options)


@functools.lru_cache(maxsize=None)
def server_packets(level):
    """Any packet a server sends."""
    options = [connacks(level), publishes(level), acks(PubAck, T.PUBACK, level), acks(PubRec, T.PUBREC, level),
               acks(PubRel, T.PUBREL, level), acks(PubComp, T.PUBCOMP, level), subacks(level),
               unsubacks(level), st.just(PingResp()), disconnects(level)]
    if level == 5:
        options.append(auths())
    return st.one_of(options)


def parser_for(packet, level: int) -> MQTTParser:
    """A parser on the side that receives ``packet`` (server side for CONNECT and client packets)."""
    if isinstance(packet, Connect):
        return MQTTParser()
    server_side = type(packet).packet_type in (T.SUBSCRIBE, T.UNSUBSCRIBE, T.PINGREQ)
    return MQTTParser(server_side=server_side, protocol_level=level)
