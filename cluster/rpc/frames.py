"""RPC frames between nodes: varint-length framing and the frame vocabulary, sans-IO.

On the wire a frame is ``varint(length) + msgpack array`` (Turms' RPC framing,
msgpack instead of hand-packed fields). Every array starts with the frame type
and a request id (0 where none applies)::

    HELLO      [0, 0, cluster_id, node_id, role, version, healthy, nonce, boot] client -> server, first frame
    CHALLENGE  [8, 0, cluster_id, node_id, role, version, healthy, nonce, mac]  server -> client: its identity,
                                                                                 nonce and proof of the secret
    PROOF      [9, 0, mac]                                                      client -> server: its proof
    HELLO_OK   [1, 0]                                                           server -> client, handshake done
    CALL       [2, id, request_type, body]                           either way, once open
    RESULT     [3, id, body]                                         the answer to CALL id
    ERROR      [4, id, code, message]                                the failure of CALL id (id 0: the connection)
    EVENT      [5, 0, topic, body]                                   unsolicited (notify: topic "queue")
    HEARTBEAT  [6, 0, healthy]                                       every heartbeat interval, both ways
    GOODBYE    [7, 0, reason]                                        clean stop or refusal, then close

The handshake is a mutual challenge (``cluster.rpc.connection``): each side
sends a random nonce and answers the other's with ``mac`` (``handshake_mac``:
HMAC-SHA256 keyed by ``[cluster] secret`` over both nonces and both
identities), the server first, so a client never proves anything to a server
that has not proved the secret itself. A HELLO of version 8 or older (no
boot, or no nonce either) still decodes, so that the version check can name
the mismatch.

``body`` is opaque bytes (the store codec's frames, a native request): this
layer never looks inside. ``FrameDecoder`` turns bytes into frames and raises
``FrameError`` (the peer misbehaved) for a frame over the size cap, as soon as
its length prefix is read, and for anything that is not one of the arrays
above; ``encode`` raises ``ValueError`` for a frame we built wrong.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass, field

import msgpack

__all__ = ["Call", "Challenge", "Error", "Event", "FrameDecoder", "FrameError", "FrameType", "Goodbye", "Heartbeat",
           "Hello", "HelloOk", "MAX_VARINT_BYTES", "NONCE_SIZE", "Proof", "Result", "encode", "encode_varint",
           "handshake_mac"]

MAX_VARINT_BYTES = 5  # 35 bits: any length a sane cap allows

RPC_VERSION = 10
"""The RPC protocol version (frames and the store codec's schema): peers must speak the same. 2: ``add_filter``
takes ``restoring``; a native request is the store operation ``native_request`` (no ``native.request`` type).
3: ``read_queue``'s result is packed compactly (queue and group once). 4: the handshake proves ``[cluster] secret``
both ways (HELLO carries a nonce; CHALLENGE and PROOF). 5: the store operations ``put_will`` and
``delete_will`` (wills stored in their group). 6: ``append_batch``'s result is packed compactly (each distinct
tuple of queues once, then flat rows). 7: ``append_batch``'s result is packed by columns (offsets, queue set
indexes; statuses and reasons only when a message was not stored) and may end with where the records went in
the caller's watched queues; a queue's news event carries its end offset. 8: a queue's news event may carry its
entries (``[queue, end, read result]``). 9: HELLO carries the client's ``boot`` (its process life), so a broker
tells a proxy restarted under the same id from its evicted previous life; the store operation ``claim_and_get``.
10: the store operation ``list_wills``."""

NONCE_SIZE = 16
"""Bytes of each side's handshake nonce."""


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
    CHALLENGE = 8
    PROOF = 9


@dataclass(frozen=True, slots=True)
class Hello:
    """The client's introduction (``HELLO``), and a node's identity; the server answers with ``Challenge``."""

    cluster_id: str
    node_id: str
    role: str
    version: int
    """The RPC protocol version: both ends must speak the same (the store codec has no type tags)."""
    healthy: bool = True
    nonce: bytes = b""
    """The sender's random handshake nonce (``NONCE_SIZE`` bytes) that the other side's proof covers."""
    boot: str = field(default="", kw_only=True)  # keyword-only: ``Challenge`` adds ``mac`` after ``nonce``
    """The client's process life: drawn at its start, as its member record's ``boot`` (sent in HELLO only; a
    CHALLENGE leaves it empty)."""


@dataclass(frozen=True, slots=True)
class Challenge(Hello):
    """The server's answer to ``HELLO``: its identity, its nonce and its proof of the secret."""

    mac: bytes = b""
    """``handshake_mac(secret, "server", ...)``: the client checks it before proving anything itself."""


@dataclass(frozen=True, slots=True)
class Proof:
    """The client's proof of the secret, over the same nonces and identities as the server's."""

    mac: bytes


@dataclass(frozen=True, slots=True)
class HelloOk:
    """The server accepted the client's proof: the connection is open."""


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


Frame = Hello | Challenge | Proof | HelloOk | Call | Result | Error | Event | Heartbeat | Goodbye


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


def handshake_mac(secret: bytes, side: str, client: Hello, server: Hello) -> bytes:
    """HMAC-SHA256 keyed by the cluster secret over who proves (``side``: "client" or "server"), both nonces and
    both identities. An empty secret is still a key: both ends must agree there is none."""
    message = msgpack.packb(["twistmq-rpc", side, client.cluster_id, client.version,
                             client.node_id, client.role, client.nonce, server.node_id, server.role, server.nonce,
                             client.boot],
                            use_bin_type=True)
    return hmac.new(secret, message, hashlib.sha256).digest()


def _identity(frame: Hello) -> list:
    return [frame.cluster_id, frame.node_id, frame.role, frame.version, frame.healthy]


def _array(frame: Frame) -> list:
    if isinstance(frame, Challenge):  # before Hello: it is a subclass
        return [FrameType.CHALLENGE, 0, *_identity(frame), frame.nonce, frame.mac]
    if isinstance(frame, Hello):
        return [FrameType.HELLO, 0, *_identity(frame), frame.nonce, frame.boot]
    if isinstance(frame, Proof):
        return [FrameType.PROOF, 0, frame.mac]
    if isinstance(frame, HelloOk):
        return [FrameType.HELLO_OK, 0]
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
    FrameType.HELLO: ((str, str, str, int, bool, bytes, str), lambda rid, a: Hello(*a[:6], boot=a[6])),
    FrameType.CHALLENGE: ((str, str, str, int, bool, bytes, bytes), lambda rid, a: Challenge(*a)),
    FrameType.PROOF: ((bytes,), lambda rid, a: Proof(*a)),
    FrameType.HELLO_OK: ((), lambda rid, a: HelloOk()),
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
    if kind is FrameType.HELLO and len(types) - 2 <= len(fields) < len(types):
        # a HELLO of version 8 or older (no boot; 2 or older: no nonce either): decoded, so the version check
        # names the mismatch
        fields = [*fields, *(b"", "")[len(fields) - len(types):]]
    if len(fields) != len(types) or any(type(v) is not t for v, t in zip(fields, types)):
        raise FrameError(f"malformed {kind.name} frame")
    if not 0 <= array[1] < 1 << 63:
        raise FrameError("request id out of range")
    return build(array[1], fields)


_ARRAY_MIN, _ARRAY_MAX = 0x92, 0x99  # msgpack fixarray markers of 2..9 elements: every frame's first byte


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
