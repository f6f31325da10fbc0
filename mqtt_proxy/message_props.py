"""MQTT 5 PUBLISH properties <-> the string properties stored with a record.

The record keeps them readable (Spark shows them as a map): binary
correlation data is hex, user properties are a JSON list of pairs, and the
message expiry is stored as an absolute deadline so a message read later
carries only its remaining lifetime.
"""

from __future__ import annotations

import json

from mqtt_proxy.codec import NO_PROPERTIES, Properties
from store.record import EXPIRES_AT  # the store's property: native ttl uses it too

PAYLOAD_FORMAT = "pfi"
CONTENT_TYPE = "ct"
RESPONSE_TOPIC = "rt"
CORRELATION_DATA = "cd"
USER_PROPERTIES = "up"


def to_record(props: Properties, now_ms: int) -> dict[str, str]:
    """The record properties for an inbound PUBLISH's v5 properties (empty for none)."""
    if props is NO_PROPERTIES or not props:
        return {}
    out: dict[str, str] = {}
    if props.message_expiry_interval is not None:
        out[EXPIRES_AT] = str(now_ms + props.message_expiry_interval * 1000)
    if props.payload_format_indicator is not None:
        out[PAYLOAD_FORMAT] = str(props.payload_format_indicator)
    if props.content_type is not None:
        out[CONTENT_TYPE] = props.content_type
    if props.response_topic is not None:
        out[RESPONSE_TOPIC] = props.response_topic
    if props.correlation_data is not None:
        out[CORRELATION_DATA] = props.correlation_data.hex()
    if props.user_properties:
        out[USER_PROPERTIES] = json.dumps([list(p) for p in props.user_properties])
    return out


def expired(record_props, now_ms: int) -> bool:
    """Whether a stored message's expiry has passed (it must not be delivered)."""
    exp = record_props.get(EXPIRES_AT)
    return exp is not None and int(exp) <= now_ms


def from_record(record_props, now_ms: int, sub_ids: tuple[int, ...] = ()) -> Properties:
    """The v5 properties to send with a stored message (remaining expiry, passthrough fields)."""
    kw: dict = {}
    exp = record_props.get(EXPIRES_AT)
    if exp is not None:
        kw["message_expiry_interval"] = max(0, (int(exp) - now_ms + 999) // 1000)
    pfi = record_props.get(PAYLOAD_FORMAT)
    if pfi is not None:
        kw["payload_format_indicator"] = int(pfi)
    if CONTENT_TYPE in record_props:
        kw["content_type"] = record_props[CONTENT_TYPE]
    if RESPONSE_TOPIC in record_props:
        kw["response_topic"] = record_props[RESPONSE_TOPIC]
    cd = record_props.get(CORRELATION_DATA)
    if cd is not None:
        kw["correlation_data"] = bytes.fromhex(cd)
    up = record_props.get(USER_PROPERTIES)
    if up is not None:
        kw["user_properties"] = tuple((k, v) for k, v in json.loads(up))
    if sub_ids:
        kw["subscription_identifiers"] = sub_ids
    return Properties(**kw) if kw else NO_PROPERTIES


def has_v5_fields(record_props) -> bool:
    """True when a stored message carries anything a v5 PUBLISH must show."""
    return any(k in record_props for k in (EXPIRES_AT, PAYLOAD_FORMAT, CONTENT_TYPE, RESPONSE_TOPIC,
                                            CORRELATION_DATA, USER_PROPERTIES))
