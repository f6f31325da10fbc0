"""The commit-log record: one message, its byte layout, encode and decode.

Every record is self-describing so that readers (recovery, replication, Spark)
can walk a segment with no index and stop at the last complete record::

     0        1                 5                 9                 13
     +--------+-----------------+-----------------+-----------------+
     |version |  magic (u32)    | total_size (u32)| crc32c (u32)    |   header, 13 bytes
     +--------+--------+--------+-----------------+-----------------+
     | kind   | flags  | store_ts (u64, ms)       | born_ts (u64, ms)   ...
     +--------+--------+--------------------------+-----------------+
     | topic_len (u16) | topic (utf-8)                                 ...
     | client_id_len (u16) | client_id (utf-8)                         ...
     | props_len (u32) | props: count (u16), then count x              ...
     |                 |   key_len (u16) key (utf-8) val_len (u32) val (utf-8)
     | body_len (u32)  | body (bytes)                                  ...
     +-----------------+-----------------------------------------------+

- ``total_size`` counts the whole record, header included.
- ``crc32c`` covers every byte after the crc field (offset 13 to the end).
- ``flags``: bits 0-1 QoS, bit 2 retain.
- All integers are big-endian.
- The property ``QUEUES`` holds the names of the light queues the record was
  dispatched to, joined by NUL (MQTT forbids U+0000 in topic filters), so that
  replaying the log rebuilds exactly the same index.
- The property ``exp`` (``EXPIRES_AT``) is a message's absolute expiry in ms
  since the epoch, the same for MQTT message expiry and native ``ttl``: a
  message read after it is never delivered.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from crc32c import crc32c

VERSION = 1
MAGIC = 0x7D15_7A11
HEADER = struct.Struct(">BIII")  # version, magic, total_size, crc32c
HEADER_SIZE = HEADER.size  # 13
_FIXED = struct.Struct(">BBQQ")  # kind, flags, store_ts, born_ts
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
MIN_RECORD_SIZE = HEADER_SIZE + _FIXED.size + 2 + 2 + 4 + 2 + 4
MAX_RECORD_SIZE = 256 * 1024 * 1024

QUEUES_PROPERTY = "QUEUES"
QUEUE_SEPARATOR = "\x00"
EXPIRES_AT = "exp"  # absolute expiry, ms since the epoch (MQTT message expiry and native ttl alike)


class RecordKind(enum.IntEnum):
    """What a record holds; readers such as Spark select on it."""

    MQTT_PUBLISH = 1
    NATIVE_MESSAGE = 2
    TIMER = 3  # a message parked until its delivery time (timer topic)
    SYSTEM = 4  # broker-internal bookkeeping (e.g. POP revive, acks)
    SESSION = 5  # a change of durable session state (store.session_log): one key set or deleted


class RecordError(ValueError):
    """Bytes that are not a valid record (the input is bad, not the caller)."""


class TruncatedRecord(RecordError):
    """The buffer ends before the record does: a torn tail."""


class CorruptRecord(RecordError):
    """The bytes are complete but wrong: bad magic, version, size or CRC."""


# Not frozen: one is made per message on the hot path, and a frozen dataclass's __init__
# costs about 7x a plain one. Treat it as immutable all the same.
@dataclass(slots=True)
class Message:
    """A message as producers hand it to ``store.put()``.

    ``topic`` is the MQTT topic for publishes and the queue name for native
    messages; ``properties`` are free-form string pairs kept with the record.
    """

    topic: str
    body: bytes
    kind: RecordKind = RecordKind.MQTT_PUBLISH
    qos: int = 0
    retain: bool = False
    client_id: str = ""
    born_ts: int = 0
    properties: Mapping[str, str] = field(default_factory=dict)


def published_later(message: Message, now_ms: int) -> Message:
    """``message``, made at its ``born_ts`` (a will, at its client's CONNECT), as published at ``now_ms``: born
    then, its absolute expiry moved on by as much, since a Message Expiry Interval counts from the publish."""
    props = dict(message.properties)
    if EXPIRES_AT in props and message.born_ts:
        props[EXPIRES_AT] = str(int(props[EXPIRES_AT]) + max(0, now_ms - message.born_ts))
    return Message(message.topic, message.body, message.kind, message.qos, message.retain, message.client_id,
                   now_ms, props)


# Not frozen: one is made per message on the hot path, and a frozen dataclass's __init__
# costs about 7x a plain one. Treat it as immutable all the same.
@dataclass(slots=True)
class Record:
    """A decoded record as read back from the commit log."""

    offset: int  # physical commit-log offset of the first byte
    size: int  # total_size
    kind: RecordKind
    qos: int
    retain: bool
    store_ts: int
    born_ts: int
    topic: str
    client_id: str
    properties: Mapping[str, str]
    body: bytes

    @property
    def next_offset(self) -> int:
        """The offset of the record that follows this one."""
        return self.offset + self.size

    @property
    def queues(self) -> tuple[str, ...]:
        """Names of the light queues this record was dispatched to."""
        joined = self.properties.get(QUEUES_PROPERTY, "")
        return tuple(joined.split(QUEUE_SEPARATOR)) if joined else ()


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(f"{what} is not valid UTF-8: {exc}") from None


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode the property map (count, then length-prefixed key/value pairs)."""
    parts = [_U16.pack(len(properties))]
    for key, value in properties.items():
        k = _utf8(key, "property key")
        v = _utf8(value, f"property {key!r}")
        if len(k) > 0xFFFF:
            raise RecordError(f"property key too long: {len(k)} bytes")
        parts.append(_U16.pack(len(k)))
        parts.append(k)
        parts.append(_U32.pack(len(v)))
        parts.append(v)
    return b"".join(parts)


def decode_properties(data: bytes) -> dict[str, str]:
    """Decode what ``encode_properties`` wrote; raise CorruptRecord on bad bytes."""
    try:
        (count,) = _U16.unpack_from(data, 0)
        pos = 2
        props: dict[str, str] = {}
        for _ in range(count):
            (klen,) = _U16.unpack_from(data, pos)
            pos += 2
            key = data[pos:pos + klen].decode("utf-8")
            pos += klen
            (vlen,) = _U32.unpack_from(data, pos)
            pos += 4
            if pos + vlen > len(data):
                raise CorruptRecord("property value runs past the property block")
            props[key] = data[pos:pos + vlen].decode("utf-8")
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptRecord(f"bad property block: {exc}") from None
    if pos != len(data):
        raise CorruptRecord("trailing bytes after the property block")
    return props


_QUEUE_BLOBS: dict[tuple[str, ...], bytes] = {}
_QUEUE_BLOBS_MAX = 16384


def _queues_only_block(queues: tuple[str, ...]) -> bytes:
    """The property block of a message whose only property is QUEUES (the common case), cached."""
    blob = _QUEUE_BLOBS.get(queues)
    if blob is None:
        if len(_QUEUE_BLOBS) >= _QUEUE_BLOBS_MAX:
            _QUEUE_BLOBS.clear()
        blob = _QUEUE_BLOBS[queues] = encode_properties({QUEUES_PROPERTY: QUEUE_SEPARATOR.join(queues)})
    return blob


_ENCODED: dict[str, bytes] = {}  # topics and client ids repeat: encode each once


def _cached_utf8(text: str, what: str) -> bytes:
    data = _utf8(text, what)
    if len(_ENCODED) >= 65536:
        _ENCODED.clear()
    _ENCODED[text] = data
    return data


# The bytes between the fixed fields and the body (topic, client id, property block) for messages
# without properties of their own: a device publishes to the same topic, with the same client id, to
# the same queues, over and over, so the hot path packs them once.
_MIDDLES: dict[tuple, bytes] = {}
_MIDDLES_MAX = 65536
_BODY_HEAD = struct.Struct(">BBQQ")  # the fixed fields, packed straight before the cached middle


def _middle(topic: str, client_id: str, props_bytes: bytes) -> bytes:
    """topic_len | topic | client_id_len | client_id | props_len | props, checked."""
    t = _ENCODED.get(topic)
    if t is None:
        t = _cached_utf8(topic, "topic")
    c = _ENCODED.get(client_id)
    if c is None:
        c = _cached_utf8(client_id, "client_id")
    if len(t) > 0xFFFF or len(c) > 0xFFFF:
        raise RecordError("topic or client_id longer than 65535 bytes")
    return b"".join((_U16.pack(len(t)), t, _U16.pack(len(c)), c, _U32.pack(len(props_bytes)), props_bytes))


def encode(message: Message, store_ts: int, queues: tuple[str, ...] = ()) -> bytes:
    """Encode ``message`` as a complete record stamped with ``store_ts``."""
    qos = message.qos
    if not 0 <= qos <= 2:
        raise RecordError(f"qos must be 0, 1 or 2, not {qos}")
    props = message.properties
    if not props:
        key = (message.topic, message.client_id, queues)
        middle = _MIDDLES.get(key)
        if middle is None:
            if len(_MIDDLES) >= _MIDDLES_MAX:
                _MIDDLES.clear()
            middle = _MIDDLES[key] = _middle(
                message.topic, message.client_id, _queues_only_block(queues) if queues else b"\x00\x00")
    else:
        if queues:
            props = dict(props)
            props[QUEUES_PROPERTY] = QUEUE_SEPARATOR.join(queues)
        middle = _middle(message.topic, message.client_id, encode_properties(props))
    body = message.body
    payload = b"".join((
        _BODY_HEAD.pack(message.kind, qos | 4 if message.retain else qos, store_ts, message.born_ts or store_ts),
        middle, _U32.pack(len(body)), body,
    ))
    total = HEADER_SIZE + len(payload)
    if total > MAX_RECORD_SIZE:
        raise RecordError(f"record of {total} bytes exceeds {MAX_RECORD_SIZE}")
    return HEADER.pack(VERSION, MAGIC, total, crc32c(payload)) + payload


def encode_many(messages: Sequence[Message], store_ts: int, queue_sets: Sequence[tuple[str, ...]]) -> list[bytes]:
    """``encode`` of each message with its queues, all stamped with ``store_ts``, in one loop.

    A tick's appends are encoded together: the per-call overhead of ``encode``
    was a fifth of its cost. Raises as ``encode`` does at the first message it
    refuses (the caller then encodes one by one to tell which).
    """
    out: list[bytes] = []
    append = out.append
    middles = _MIDDLES
    body_head, u32, header = _BODY_HEAD.pack, _U32.pack, HEADER.pack
    key = middle = None  # a publisher's records come in runs with the same topic, client id and queues
    for message, queues in zip(messages, queue_sets):
        qos = message.qos
        if message.properties or not 0 <= qos <= 2:
            append(encode(message, store_ts, queues))
            continue
        topic, client_id = message.topic, message.client_id
        # By identity: the front end hands one string object per topic, and the resolver one tuple per topic.
        if key is None or topic is not key[0] or client_id is not key[1] or queues is not key[2]:
            key = (topic, client_id, queues)
            middle = middles.get(key)
            if middle is None:
                key = None
                append(encode(message, store_ts, queues))  # fills the cache
                continue
        body = message.body
        payload = b"".join((body_head(message.kind, qos | 4 if message.retain else qos, store_ts,
                                      message.born_ts or store_ts), middle, u32(len(body)), body))
        total = HEADER_SIZE + len(payload)
        if total > MAX_RECORD_SIZE:
            raise RecordError(f"record of {total} bytes exceeds {MAX_RECORD_SIZE}")
        append(header(VERSION, MAGIC, total, crc32c(payload)) + payload)
    return out


def check_header(buf, pos: int = 0) -> int:
    """Validate the header at ``pos`` and return the record's total size.

    Raises TruncatedRecord if fewer than a header's bytes remain, CorruptRecord
    if the version, magic or size is impossible.
    """
    if len(buf) - pos < HEADER_SIZE:
        raise TruncatedRecord(f"{len(buf) - pos} bytes left, header needs {HEADER_SIZE}")
    version, magic, total, _crc = HEADER.unpack_from(buf, pos)
    if version != VERSION:
        raise CorruptRecord(f"unknown record version {version}")
    if magic != MAGIC:
        raise CorruptRecord(f"bad magic 0x{magic:08x}")
    if not MIN_RECORD_SIZE <= total <= MAX_RECORD_SIZE:
        raise CorruptRecord(f"impossible record size {total}")
    return total


_KINDS = {int(k): k for k in RecordKind}
_DECODED: dict[bytes, str] = {}  # topics and client ids repeat: decode each once


def _cached_decode(raw: bytes) -> str:
    text = raw.decode("utf-8")
    if len(_DECODED) >= 65536:
        _DECODED.clear()
    _DECODED[raw] = text
    return text


_FIXED_TOPIC_LEN = struct.Struct(">BBQQH")  # the fixed fields and topic_len, read in one call
_FIXED_TOPIC_LEN_UNPACK, _FIXED_TOPIC_LEN_SIZE = _FIXED_TOPIC_LEN.unpack_from, _FIXED_TOPIC_LEN.size
_HEADER_UNPACK, _U16_UNPACK, _U32_UNPACK = HEADER.unpack_from, _U16.unpack_from, _U32.unpack_from
_PROPERTY_BLOCKS: dict[bytes, dict[str, str]] = {}  # records of one topic repeat their QUEUES block


def _decoded_properties(block: bytes) -> dict[str, str]:
    """``decode_properties(block)``, cached; each caller gets its own dict."""
    props = _PROPERTY_BLOCKS.get(block)
    if props is None:
        props = decode_properties(block)
        if len(block) > 512:  # rare and big: not worth the memory
            return props
        if len(_PROPERTY_BLOCKS) >= 16384:
            _PROPERTY_BLOCKS.clear()
        _PROPERTY_BLOCKS[block] = props
    return props.copy()


_DELIVERED_BLOCKS: dict[bytes, dict[str, str]] = {}  # the same blocks without QUEUES


def _delivered_properties(block: bytes) -> dict[str, str]:
    """``_decoded_properties(block)`` without QUEUES, cached; each caller gets its own dict."""
    props = _DELIVERED_BLOCKS.get(block)
    if props is None:
        props = _decoded_properties(block)
        props.pop(QUEUES_PROPERTY, None)
        if len(block) > 512:
            return props
        if len(_DELIVERED_BLOCKS) >= 16384:
            _DELIVERED_BLOCKS.clear()
        _DELIVERED_BLOCKS[block] = props
    return props.copy() if props else {}


def decode(buf, pos: int = 0, offset: int | None = None, queues: bool = True) -> Record:
    """Decode the record starting at ``buf[pos]``.

    ``offset`` is the record's physical commit-log offset (defaults to ``pos``).
    ``queues=False`` leaves the QUEUES property out of ``properties``: a reader
    that delivers messages, as the store's recent appends are kept (replay and
    recovery need it; ``Record.queues`` is empty then).
    Raises TruncatedRecord when the buffer ends inside the record and
    CorruptRecord when the bytes are wrong.
    """
    # check_header's checks, inline (this runs once per message read): one unpack gives the CRC too.
    if len(buf) - pos < HEADER_SIZE:
        raise TruncatedRecord(f"{len(buf) - pos} bytes left, header needs {HEADER_SIZE}")
    version, magic, total, crc = _HEADER_UNPACK(buf, pos)
    if version != VERSION or magic != MAGIC or not MIN_RECORD_SIZE <= total <= MAX_RECORD_SIZE:
        check_header(buf, pos)  # raises the precise error
    end = pos + total
    if len(buf) < end:
        raise TruncatedRecord(f"record of {total} bytes, only {len(buf) - pos} present")
    # One copy of the CRC-covered bytes (records are small), then plain bytes slices of it.
    data = buf[pos + HEADER_SIZE:end]
    if type(data) is not bytes:
        data = bytes(data)
    if crc32c(data) != crc:
        raise CorruptRecord("CRC32C mismatch")
    try:
        kind, flags, store_ts, born_ts, tlen = _FIXED_TOPIC_LEN_UNPACK(data, 0)
        p = _FIXED_TOPIC_LEN_SIZE + tlen
        raw = data[_FIXED_TOPIC_LEN_SIZE:p]
        topic = _DECODED.get(raw)
        if topic is None:
            topic = _cached_decode(raw)
        (clen,) = _U16_UNPACK(data, p)
        p += 2
        raw = data[p:p + clen]
        client_id = _DECODED.get(raw)
        if client_id is None:
            client_id = _cached_decode(raw)
        p += clen
        (plen,) = _U32_UNPACK(data, p)
        p += 4
        block = data[p:p + plen]
        properties = {} if block == b"\x00\x00" else _decoded_properties(block) if queues \
            else _delivered_properties(block)
        p += plen
        (blen,) = _U32_UNPACK(data, p)
        p += 4
        body = data[p:p + blen]
        p += blen
        record_kind = _KINDS[kind]
    except KeyError:
        raise CorruptRecord(f"unknown record kind {kind}") from None
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, CorruptRecord):
            raise
        raise CorruptRecord(f"bad record fields: {exc}") from None
    if p != len(data):
        raise CorruptRecord("record fields do not fill total_size")
    return Record(
        pos if offset is None else offset, total, record_kind, flags & 3, bool(flags & 4), store_ts, born_ts,
        topic, client_id, properties, body,
    )
