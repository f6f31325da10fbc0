"""MQTT data representations (section 1.5): packet types, integers, variable byte
integers, UTF-8 strings, binary data, and a bounded reader over one packet body."""

from __future__ import annotations

import enum
import struct

from mqtt_proxy.codec.errors import MalformedPacket


class PacketType(enum.IntEnum):
    """Control packet type: the high nibble of the fixed header's first byte (section 2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


MAX_VARINT = 268_435_455  # largest Variable Byte Integer (four bytes)
MAX_PACKET_SIZE = 1 + 4 + MAX_VARINT  # fixed header byte + 4-byte remaining length + body

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
_U16_PACK = U16.pack
_U32_PACK = U32.pack

# Single-byte varints are by far the most common: precompute them.
_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def encode_varint(value: int) -> bytes:
    """Variable Byte Integer encoding of ``value`` (0 .. 268,435,455), minimal length."""
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"{value} does not fit a Variable Byte Integer")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_u16(value: int) -> bytes:
    """Two Byte Integer, big-endian."""
    if not 0 <= value <= 0xFFFF:
        raise ValueError(f"{value} does not fit a Two Byte Integer")
    return _U16_PACK(value)


def encode_u32(value: int) -> bytes:
    """Four Byte Integer, big-endian."""
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"{value} does not fit a Four Byte Integer")
    return _U32_PACK(value)


def encode_string(value: str) -> bytes:
    """UTF-8 Encoded String: two-byte length then the bytes (MQTT-1.5.4-1, -2)."""
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError("MQTT strings must not contain U+0000 (MQTT-1.5.4-2)")
    data = value.encode("utf-8")  # raises UnicodeEncodeError (a ValueError) on surrogates
    if len(data) > 0xFFFF:
        raise ValueError(f"string of {len(data)} bytes exceeds 65,535")
    return _U16_PACK(len(data)) + data


def encode_binary(value: bytes) -> bytes:
    """Binary Data: two-byte length then the bytes."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    if len(value) > 0xFFFF:
        raise ValueError(f"binary data of {len(value)} bytes exceeds 65,535")
    return _U16_PACK(len(value)) + bytes(value)


def decode_utf8(data: bytes, what: str) -> str:
    """Decode and validate an MQTT string's bytes: well-formed UTF-8, no surrogates, no U+0000."""
    try:
        text = data.decode("utf-8")  # Python's strict codec refuses encoded surrogates
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"{what} is not well-formed UTF-8 (MQTT-1.5.4-1): {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket(f"{what} contains U+0000 (MQTT-1.5.4-2)")
    return text


class Reader:
    """Cursor over one packet body; every read checks the packet's bounds."""

    __slots__ = ("data", "pos", "end")

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def remaining(self) -> int:
        """Bytes left before the end of the packet."""
        return self.end - self.pos

    def _take(self, n: int, what: str) -> int:
        start = self.pos
        if start + n > self.end:
            raise MalformedPacket(f"packet ends inside {what}")
        self.pos = start + n
        return start

    def u8(self, what: str) -> int:
        """One byte."""
        return self.data[self._take(1, what)]

    def u16(self, what: str) -> int:
        """Two Byte Integer."""
        return U16.unpack_from(self.data, self._take(2, what))[0]

    def u32(self, what: str) -> int:
        """Four Byte Integer."""
        return U32.unpack_from(self.data, self._take(4, what))[0]

    def varint(self, what: str) -> int:
        """Variable Byte Integer: at most four bytes, minimal encoding (MQTT-1.5.5-1)."""
        value = 0
        for shift in (0, 7, 14, 21):
            byte = self.u8(what)
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if byte == 0 and shift:
                    raise MalformedPacket(f"{what} is not minimally encoded (MQTT-1.5.5-1)")
                return value
        raise MalformedPacket(f"{what} is longer than four bytes")

    def raw(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes."""
        start = self._take(n, what)
        return bytes(self.data[start:start + n])

    def binary(self, what: str) -> bytes:
        """Binary Data: two-byte length then bytes."""
        return self.raw(self.u16(what), what)

    def string(self, what: str) -> str:
        """UTF-8 Encoded String, validated."""
        n = self.u16(what)
        start = self._take(n, what)
        return decode_utf8(bytes(self.data[start:start + n]), what)

    def rest(self) -> bytes:
        """Every byte left in the packet."""
        start, self.pos = self.pos, self.end
        return bytes(self.data[start:self.end])
