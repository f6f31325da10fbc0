"""Sans-I/O MQTT 3.1.1 and 5.0 codec: ``MQTTParser.feed(bytes) -> [packet]`` and
``encode(packet, protocol_level) -> bytes``. No I/O, no Twisted, no clock.

Modules: ``packets`` (the packet values), ``properties`` (v5 properties),
``reason`` (reason codes), ``decoder`` (the parser), ``encoder``, ``topic``
(topic name / filter checks), ``wire`` (data representations), ``errors``.
"""

from mqtt_proxy.codec.decoder import MQTTParser
from mqtt_proxy.codec.encoder import encode, encode_publish, encode_pubacks, patch_publish
from mqtt_proxy.codec.errors import MalformedPacket, PacketTooLarge, ProtocolError, UnsupportedProtocolVersion
from mqtt_proxy.codec.packets import (
    MQTT_3_1_1, MQTT_5, Auth, ConnAck, Connect, Disconnect, Packet, PingReq, PingResp, PubAck, PubComp,
    Publish, PubRec, PubRel, RetainHandling, SubAck, Subscribe, Subscription, SubscriptionOptions,
    UnsubAck, Unsubscribe, Will,
)
from mqtt_proxy.codec.properties import NO_PROPERTIES, WILL, Properties, PropertyId, encode_properties
from mqtt_proxy.codec.reason import ConnectReturnCode, ReasonCode, v311_return_code
from mqtt_proxy.codec.topic import is_shared_filter, is_valid_topic_filter, is_valid_topic_name, split_shared_filter
from mqtt_proxy.codec.wire import MAX_PACKET_SIZE, PacketType

__all__ = [
    "MQTTParser", "encode", "encode_publish", "encode_pubacks", "patch_publish", "encode_properties",
    "ProtocolError", "MalformedPacket", "PacketTooLarge", "UnsupportedProtocolVersion",
    "Connect", "ConnAck", "Publish", "PubAck", "PubRec", "PubRel", "PubComp", "Subscribe", "SubAck",
    "Unsubscribe", "UnsubAck", "PingReq", "PingResp", "Disconnect", "Auth", "Packet", "Will",
    "Subscription", "SubscriptionOptions", "RetainHandling", "Properties", "PropertyId", "NO_PROPERTIES", "WILL",
    "ReasonCode", "ConnectReturnCode", "v311_return_code", "PacketType", "MAX_PACKET_SIZE", "MQTT_3_1_1", "MQTT_5",
    "is_valid_topic_name", "is_valid_topic_filter", "is_shared_filter", "split_shared_filter",
]
