"""The one error the codec raises when the peer misbehaves.

"The peer sent bad bytes" is a :class:`ProtocolError` carrying the v5 reason code
to close the connection with (CONNACK or DISCONNECT). "The caller misused the
API" (encoding a packet that cannot exist) is a plain ``ValueError``/``TypeError``.
"""

from __future__ import annotations

from mqtt_proxy.codec.reason import ReasonCode


class ProtocolError(Exception):
    """The peer broke the protocol; close the connection with ``reason_code``.

    ``protocol_level`` is the version in force when the error was found (None
    before the CONNECT was understood): it tells the server whether it may answer
    with a v5 reason code. ``parsed`` holds the packets that the same
    ``feed()`` call decoded before the bad one, in order: handle them, then close.
    """

    def __init__(self, reason_code: ReasonCode, message: str) -> None:
        super().__init__(f"{reason_code.name} (0x{int(reason_code):02X}): {message}")
        self.reason_code = reason_code
        self.message = message
        self.protocol_level: int | None = None
        self.parsed: tuple = ()


class MalformedPacket(ProtocolError):
    """The bytes cannot be parsed as the spec defines them (reason 0x81)."""

    def __init__(self, message: str) -> None:
        super().__init__(ReasonCode.MALFORMED_PACKET, message)


class PacketTooLarge(ProtocolError):
    """The packet is larger than the receiver's Maximum Packet Size (reason 0x95)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(ReasonCode.PACKET_TOO_LARGE, f"packet of {size} bytes exceeds the limit of {limit}")
        self.size = size
        self.limit = limit


class UnsupportedProtocolVersion(ProtocolError):
    """CONNECT named a protocol or level this codec does not speak (reason 0x84).

    Answer with CONNACK 0x84 if ``requested_level`` is 5, otherwise with the
    3.1.1 return code 0x01 (MQTT-3.1.2-2), then close.
    """

    def __init__(self, protocol_name: str, requested_level: int) -> None:
        super().__init__(
            ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"protocol {protocol_name!r} level {requested_level} is not supported (MQTT-3.1.2-1, MQTT-3.1.2-2)",
        )
        self.protocol_name = protocol_name
        self.requested_level = requested_level
