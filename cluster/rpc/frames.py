"""RPC frames between nodes: varint-length framing and the frame vocabulary, sans-IO.

On the wire a frame is ``varint(length) + msgpack array`` (Turms' RPC framing,
msgpack instead of hand-packed fields). Every array starts with the frame type
and a request id (0 where none applies)::

    HELLO      [0, 0, cluster_id, node_id, role, version, healthy]   client -> server, first frame
    HELLO_OK   [1, 0, cluster_id, node_id, role, version, healthy]   server -> client, handshake done
    CALL       [2, id, request_type, body]                           either way, once open
    RESULT     [3, id, body]                                         the answer to CALL id
    ERROR      [4, id, code, message]                                the failure of CALL id (id 0: the connection)
    EVENT      [5, 0, topic, body]                                   unsolicited (notify: topic "queue")
    HEARTBEAT  [6, 0, healthy]                                       every heartbeat interval, both ways
    GOODBYE    [7, 0, reason]                                        clean stop or refusal, then close

``body`` is opaque bytes (the store codec's frames, a native request): this
layer never looks inside. ``FrameDecoder`` turns bytes into frames and raises
``FrameError`` (the peer misbehaved) for a frame over the size cap, as soon as
its length prefix is read, and for anything that is not one of the arrays
above; ``encode`` raises ``ValueError`` for a frame we built wrong.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import msgpack

__all__ = ["Call", "Error", "Event", "FrameDecoder", "FrameError", "FrameType", "Goodbye", "Heartbeat", "Hello",
           "HelloOk", "MAX_VARINT_BYTES", "Result", "encode", "encode_varint"]

MAX_VARINT_BYTES = 5  # 35 bits: any length a sane cap allows

RPC_VERSION = 3
"""The RPC protocol version (frames and the store codec's schema): peers must speak the same. 2: ``add_filter``
takes ``restoring``; a native request is the store operation ``native_request`` (no ``native.request`` type).
3: the store operations ``put_will`` and ``delete_will``."""


class FrameError(Exception):
    """The peer sent bytes that are not a frame of this protocol (or one over the size cap)."""


class FrameType(enum.IntEnum):
    HELLO = 0
    HELLO_OK = 1
    CALL = 2
    RESULT = 3
    ERROR = 4
    EVENT = 5
    HEARTBEAT = 6
    GOODBYE = 7


@dataclass(frozen=True, slots=True)
class Hello:
    """The client's introduction (``HELLO``); the server answers with the same fields as ``HelloOk``."""

    cluster_id: str
    node_id: str
    role: str
    version: int
    """The RPC protocol version: both ends must speak the same (the store codec has no type tags)."""
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class HelloOk(Hello):
    """The server accepted the handshake; its own identity."""


@dataclass(frozen=True, slots=True)
class Call:
    """A request of ``request_type`` (a name in the receiver's dispatch table), answered by id."""

    request_id: int
    request_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Result:
    """The successful answer to call ``request_id``."""

    request_id: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Error:
    """The failed answer to call ``request_id`` (0: about the connection itself): a code and one line."""

    request_id: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Event:
    """Unsolicited news: ``topic`` says what kind, ``body`` what (a queue name for ``queue``)."""

    topic: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The sender is alive; ``healthy`` is its load flag (Turms' isHealthy): False = send elsewhere."""

    healthy: bool


@dataclass(frozen=True, slots=True)
class Goodbye:
    """The sender closes the connection, with why (a clean stop, or a refusal)."""

    reason: str


Frame = Hello | HelloOk | Call | Result | Error | Event | Heartbeat | Goodbye


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128, as protobuf and Turms write lengths."""
    if n < 0:
        raise ValueError("a varint is unsigned")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _array(frame: Frame) -> list:
    if isinstance(frame, HelloOk):  # before Hello: it is a subclass
        return [FrameType.HELLO_OK, 0, frame.cluster_id, frame.node_id, frame.role, frame.version, frame.healthy]
    if isinstance(frame, Hello):
        return [FrameType.HELLO, 0, frame.cluster_id, frame.node_id, frame.role, frame.version, frame.healthy]
    if isinstance(frame, Call):
        return [FrameType.CALL, frame.request_id, frame.request_type, frame.body]
    if isinstance(frame, Result):
        return [FrameType.RESULT, frame.request_id, frame.body]
    if isinstance(frame, Error):
        return [FrameType.ERROR, frame.request_id, frame.code, frame.message]
    if isinstance(frame, Event):
        return [FrameType.EVENT, 0, frame.topic, frame.body]
    if isinstance(frame, Heartbeat):
        return [FrameType.HEARTBEAT, 0, frame.healthy]
    if isinstance(frame, Goodbye):
        return [FrameType.GOODBYE, 0, frame.reason]
    raise ValueError(f"not a frame: {frame!r}")


def encode(frame: Frame) -> bytes:
    """The frame's bytes, length prefix included."""
    payload = msgpack.packb([int(x) if isinstance(x, FrameType) else x for x in _array(frame)], use_bin_type=True)
    return encode_varint(len(payload)) + payload


# (frame type) -> the Python types of the fields after [type, request id], and how to build the frame
_SHAPES = {
    FrameType.HELLO: ((str, str, str, int, bool), lambda rid, a: Hello(*a)),
    FrameType.HELLO_OK: ((str, str, str, int, bool), lambda rid, a: HelloOk(*a)),
    FrameType.CALL: ((str, bytes), lambda rid, a: Call(rid, *a)),
    FrameType.RESULT: ((bytes,), lambda rid, a: Result(rid, *a)),
    FrameType.ERROR: ((str, str), lambda rid, a: Error(rid, *a)),
    FrameType.EVENT: ((str, bytes), lambda rid, a: Event(*a)),
    FrameType.HEARTBEAT: ((bool,), lambda rid, a: Heartbeat(*a)),
    FrameType.GOODBYE: ((str,), lambda rid, a: Goodbye(*a)),
}


def _frame(payload: bytes) -> Frame:
    try:
        array = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many kinds for garbage: all mean the same here
        raise FrameError(f"not a msgpack frame ({type(exc).__name__})") from None
    if type(array) is not list or len(array) < 2 or type(array[0]) is not int or type(array[1]) is not int:
        raise FrameError("a frame is an array [type, request id, ...]")
    try:
        kind = FrameType(array[0])
    except ValueError:
        raise FrameError(f"unknown frame type {array[0]}") from None
    types, build = _SHAPES[kind]
    fields = array[2:]
    if len(fields) != len(types) or any(type(v) is not t for v, t in zip(fields, types)):
        raise FrameError(f"malformed {kind.name} frame")
    if not 0 <= array[1] < 1 << 63:
        raise FrameError("request id out of range")
    return build(array[1], fields)


_ARRAY_MIN, _ARRAY_MAX = 0x92, 0x97  # msgpack fixarray markers of 2..7 elements: every frame's first byte


class FrameDecoder:
    """Bytes in, frames out. ``max_frame`` caps one frame's payload: a longer one is refused unread."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Every frame completed by ``data``; FrameError if the stream is not this protocol."""
        self._buf += data
        frames = []
        while True:
            length, start = self._length()
            if length is not None and len(self._buf) > start and not _ARRAY_MIN <= self._buf[start] <= _ARRAY_MAX:
                # every frame is a short msgpack array: refuse garbage (an HTTP request, a TLS hello) at its
                # first byte instead of waiting for the many bytes its "length" promises
                raise FrameError("not a frame (a frame is a msgpack array)")
            if length is None or len(self._buf) < start + length:
                return frames
            payload = bytes(self._buf[start:start + length])
            del self._buf[:start + length]
            frames.append(_frame(payload))

    def _length(self) -> tuple[int | None, int]:
        n = shift = 0
        for i, byte in enumerate(self._buf):
            if i >= MAX_VARINT_BYTES:
                raise FrameError("frame length prefix too long")
            n |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                if n > self.max_frame:
                    raise FrameError(f"frame of {n} bytes over the limit of {self.max_frame}")
                return n, i + 1
        if len(self._buf) >= MAX_VARINT_BYTES:
            raise FrameError("frame length prefix too long")
        return None, 0
