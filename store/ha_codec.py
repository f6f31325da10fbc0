"""The replication channel's frames: bytes in, frames out, and each frame's bytes.

Every frame starts with the same six bytes, then the fixed fields of its kind,
then ``body_size`` bytes of body (all integers big-endian)::

     0        1        2                 6
     +--------+--------+-----------------+---------------------+------------------+
     | state  | kind   | body_size (u32) | fixed fields (kind) | body (body_size) |
     +--------+--------+-----------------+---------------------+------------------+

``state`` is the connection state the frame belongs to (HANDSHAKE or TRANSFER,
``store.ha_connection.HAState``); a frame whose state does not match its kind is
corrupt. The kinds::

    slave -> master   HELLO      version u8 | flags u8 | nonce (16)          body: slave id (utf-8)
    master -> slave   CHALLENGE  nonce (16) | mac (32)                       body: -
    slave -> master   PROOF      mac (32) | max_offset u64                   body: -
    master -> slave   EPOCHS     max_offset u64 | min_offset u64             body: count x (epoch u32, start u64)
    master -> slave   TRANSFER   offset u64 | epoch u32 | epoch_start u64 | confirm_offset u64
                                                                             body: whole commit-log records
    slave -> master   ACK        max_offset u64                              body: -
    either            REFUSED    -                                           body: reason (utf-8)

So the transfer header is ``state | kind | body_size | offset | epoch |
epoch_start_offset | confirm_offset`` (34 bytes, RocketMQ's
``MSG_HEADER_SIZE`` plus the kind byte) and the slave's ack carries its max
offset. A TRANSFER with an empty body is the master's heartbeat.

The MACs are HMAC-SHA256 under the cluster secret over a label that names the
direction and both nonces (``master_mac``, ``slave_mac``): each side proves
it knows the secret to the other, and neither answer can be replayed as the other's.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

from store import record as rec
from store.ha_epochs import EpochEntry

VERSION = 1
NONCE_SIZE = 16
MAC_SIZE = 32
MAX_BODY = rec.MAX_RECORD_SIZE  # a TRANSFER's body at most: one whole record (the master cuts bodies far below)
MAX_EPOCHS = 65536
FLAG_ASYNC_LEARNER = 1

_PREFIX = struct.Struct(">BBI")  # state, kind, body_size
PREFIX_SIZE = _PREFIX.size
_EPOCH = struct.Struct(">IQ")


class HAState(enum.IntEnum):
    """A replication connection's state (RocketMQ's ``HAConnectionState``)."""

    READY = 0  # made, nothing exchanged yet
    HANDSHAKE = 1  # proving the secret, comparing epochs, truncating
    TRANSFER = 2  # the master streams the log, the slave acks
    SUSPEND = 3  # transfer held (the master stops sending records; heartbeats go on)
    SHUTDOWN = 4  # closed for good


class Kind(enum.IntEnum):
    """What a frame is."""

    HELLO = 1
    CHALLENGE = 2
    PROOF = 3
    EPOCHS = 4
    TRANSFER = 5
    ACK = 6
    REFUSED = 7


class FrameError(ValueError):
    """Bytes that are not a valid frame: the peer misbehaved."""


@dataclass(frozen=True, slots=True)
class Hello:
    """The slave opens the handshake: who it is and its challenge to the master."""

    slave_id: str
    nonce: bytes
    async_learner: bool = False
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Challenge:
    """The master proves the secret (``mac`` over the slave's nonce) and challenges back."""

    nonce: bytes
    mac: bytes


@dataclass(frozen=True, slots=True)
class Proof:
    """The slave proves the secret and says how far its log goes."""

    mac: bytes
    max_offset: int


@dataclass(frozen=True, slots=True)
class Epochs:
    """The master's epoch list and log bounds: the slave walks back to their last common epoch."""

    max_offset: int
    min_offset: int
    entries: tuple[EpochEntry, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    """A stretch of the master's log, all in one epoch (``body`` empty: a heartbeat)."""

    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Ack:
    """The slave's log now ends at ``max_offset``."""

    max_offset: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The sender refuses the connection and says why (then closes)."""

    reason: str


Frame = Hello | Challenge | Proof | Epochs | Transfer | Ack | Refused

# kind -> (state, fixed-field struct)
_LAYOUT: dict[Kind, tuple[HAState, struct.Struct]] = {
    Kind.HELLO: (HAState.HANDSHAKE, struct.Struct(f">BB{NONCE_SIZE}s")),
    Kind.CHALLENGE: (HAState.HANDSHAKE, struct.Struct(f">{NONCE_SIZE}s{MAC_SIZE}s")),
    Kind.PROOF: (HAState.HANDSHAKE, struct.Struct(f">{MAC_SIZE}sQ")),
    Kind.EPOCHS: (HAState.HANDSHAKE, struct.Struct(">QQ")),
    Kind.TRANSFER: (HAState.TRANSFER, struct.Struct(">QIQQ")),
    Kind.ACK: (HAState.TRANSFER, struct.Struct(">Q")),
    Kind.REFUSED: (HAState.SHUTDOWN, struct.Struct(">")),
}
TRANSFER_HEADER_SIZE = PREFIX_SIZE + _LAYOUT[Kind.TRANSFER][1].size


def _frame(kind: Kind, fields: tuple, body: bytes = b"") -> bytes:
    state, layout = _LAYOUT[kind]
    return _PREFIX.pack(state, kind, len(body)) + layout.pack(*fields) + body


def encode(frame: Frame) -> bytes:
    """The bytes of ``frame``; ValueError if it cannot be sent (our own misuse, not the peer's)."""
    if isinstance(frame, Transfer):
        if len(frame.body) > MAX_BODY:
            raise ValueError(f"transfer body of {len(frame.body)} bytes exceeds {MAX_BODY}")
        return _frame(Kind.TRANSFER, (frame.offset, frame.epoch, frame.epoch_start, frame.confirm_offset), frame.body)
    if isinstance(frame, Ack):
        return _frame(Kind.ACK, (frame.max_offset,))
    if isinstance(frame, Hello):
        _check_nonce(frame.nonce)
        return _frame(Kind.HELLO, (frame.version, FLAG_ASYNC_LEARNER if frame.async_learner else 0, frame.nonce),
                      frame.slave_id.encode("utf-8"))
    if isinstance(frame, Challenge):
        _check_nonce(frame.nonce)
        return _frame(Kind.CHALLENGE, (frame.nonce, frame.mac))
    if isinstance(frame, Proof):
        return _frame(Kind.PROOF, (frame.mac, frame.max_offset))
    if isinstance(frame, Epochs):
        if len(frame.entries) > MAX_EPOCHS:
            raise ValueError(f"{len(frame.entries)} epochs exceed {MAX_EPOCHS}")
        body = b"".join(_EPOCH.pack(e.epoch, e.start_offset) for e in frame.entries)
        return _frame(Kind.EPOCHS, (frame.max_offset, frame.min_offset), body)
    if isinstance(frame, Refused):
        return _frame(Kind.REFUSED, (), frame.reason.encode("utf-8")[:1024])
    raise TypeError(f"not a frame: {frame!r}")


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise ValueError(f"nonce must be {NONCE_SIZE} bytes")


class FrameDecoder:
    """Incremental decoder: ``feed(bytes)`` returns the frames completed so far.

    Raises FrameError on the first invalid frame; the connection is then done
    (the stream cannot be resynchronised).
    """

    def __init__(self, max_body: int = MAX_BODY) -> None:
        self._buf = bytearray()
        self.max_body = max_body

    @property
    def buffered(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        out: list[Frame] = []
        pos = 0
        while len(buf) - pos >= PREFIX_SIZE:
            state, kind_value, body_size = _PREFIX.unpack_from(buf, pos)
            try:
                kind = Kind(kind_value)
            except ValueError:
                raise FrameError(f"unknown frame kind {kind_value}") from None
            want_state, layout = _LAYOUT[kind]
            if state != want_state:
                raise FrameError(f"{kind.name} frame in state {state}, expected {want_state.name}")
            limit = self.max_body if kind is Kind.TRANSFER else (MAX_EPOCHS * _EPOCH.size if kind is Kind.EPOCHS
                                                                  else 1024)
            if body_size > limit:
                raise FrameError(f"{kind.name} body of {body_size} bytes exceeds {limit}")
            total = PREFIX_SIZE + layout.size + body_size
            if len(buf) - pos < total:
                break
            fields = layout.unpack_from(buf, pos + PREFIX_SIZE)
            body = bytes(buf[pos + PREFIX_SIZE + layout.size:pos + total])
            out.append(_decode(kind, fields, body))
            pos += total
        if pos:
            del buf[:pos]
        return out


def _decode(kind: Kind, fields: tuple, body: bytes) -> Frame:
    if kind is Kind.TRANSFER:
        return Transfer(fields[0], fields[1], fields[2], fields[3], body)
    if kind is Kind.ACK:
        return Ack(fields[0])
    try:
        if kind is Kind.HELLO:
            version, flags, nonce = fields
            return Hello(body.decode("utf-8"), nonce, bool(flags & FLAG_ASYNC_LEARNER), version)
        if kind is Kind.CHALLENGE:
            return Challenge(*fields)
        if kind is Kind.PROOF:
            return Proof(*fields)
        if kind is Kind.EPOCHS:
            if len(body) % _EPOCH.size:
                raise FrameError(f"EPOCHS body of {len(body)} bytes is not whole entries")
            entries = tuple(EpochEntry(*e) for e in _EPOCH.iter_unpack(body))
            return Epochs(fields[0], fields[1], entries)
        return Refused(body.decode("utf-8", errors="replace"))
    except UnicodeDecodeError as exc:
        raise FrameError(f"{kind.name} text is not UTF-8: {exc}") from None


# -- the secret's proofs ---------------------------------------------------------------------

def master_mac(secret: str, slave_nonce: bytes, master_nonce: bytes) -> bytes:
    """The master's proof: HMAC-SHA256(secret, "twistmq-ha master" | slave nonce | master nonce)."""
    return hmac.new(secret.encode("utf-8"), b"twistmq-ha master\x00" + slave_nonce + master_nonce,
                    hashlib.sha256).digest()


def slave_mac(secret: str, slave_nonce: bytes, master_nonce: bytes) -> bytes:
    """The slave's proof: HMAC-SHA256(secret, "twistmq-ha slave" | slave nonce | master nonce)."""
    return hmac.new(secret.encode("utf-8"), b"twistmq-ha slave\x00" + slave_nonce + master_nonce,
                    hashlib.sha256).digest()


def mac_ok(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison of two MACs."""
    return hmac.compare_digest(expected, got)
