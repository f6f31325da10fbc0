"""What a bridged message becomes in MongoDB: one document per record, its ``_id`` from its place in the log.

Pure: a record in, a dict out (``bytes`` values are BSON binary). The ``_id``
is ``GROUP:OFFSET``, the broker group and the record's commit-log offset:
the same message read again (a replay after a crash, an outage, a restart)
gets the same ``_id``, so the unordered insert's duplicate-key errors are what
keeps it once.
"""

from __future__ import annotations

from typing import Any

import json

from store import record as rec

INTERNAL_PROPERTIES = frozenset((rec.QUEUES_PROPERTY,))
"""Record properties the broker uses for itself: not the message's, not copied."""


def document_id(group: str, offset: int) -> str:
    """The ``_id`` of the record at commit-log ``offset`` of broker group ``group``."""
    return f"{group}:{offset}"


def parse_document_id(doc_id: str) -> tuple[str, int]:
    """(group, offset) of an ``_id`` made by ``document_id``."""
    group, _, offset = doc_id.rpartition(":")
    return group, int(offset)


def payload_value(body: bytes, mode: str) -> Any:
    """The payload as stored: ``auto`` a JSON object as a sub-document, else bytes; ``json`` any JSON value,
    else bytes; ``bytes`` always bytes."""
    if mode == "bytes" or not body:
        return bytes(body)
    if mode == "auto" and body.lstrip()[:1] != b"{":
        return bytes(body)  # cheap: only what may be an object is parsed
    try:
        value = json.loads(body, parse_int=_int64, parse_constant=_no_constant)
    except ValueError:  # not JSON, not UTF-8, or a number BSON cannot hold exactly
        return bytes(body)
    except RecursionError:  # nested deeper than the parser goes: BSON would refuse it too
        return bytes(body)
    if mode == "auto" and not isinstance(value, dict):
        return bytes(body)
    return value


def _int64(text: str) -> int:
    """An integer BSON can hold; a larger one keeps the payload binary rather than rounding it to a double."""
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"integer {text} does not fit in 64 bits")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def document(record: rec.Record, group: str, mode: str) -> dict:
    """The document of one MQTT publish read from a light queue."""
    props = record.properties
    return {
        "_id": document_id(group, record.offset),
        "topic": record.topic,
        "payload": payload_value(record.body, mode),
        "client_id": record.client_id,
        "qos": record.qos,
        "retain": record.retain,
        "store_ts": record.store_ts,
        "born_ts": record.born_ts,
        "properties": {k: v for k, v in props.items() if k not in INTERNAL_PROPERTIES} if props else {},
    }


def with_binary_payload(doc: dict, body: bytes) -> dict:
    """``doc`` with its payload as bytes and no properties beyond string pairs: the form any server accepts
    (a JSON object whose keys MongoDB refuses, or nested past BSON's depth, is kept this way)."""
    out = dict(doc)
    out["payload"] = bytes(body)
    out["properties"] = [[k, v] for k, v in doc["properties"].items()]
    return out
