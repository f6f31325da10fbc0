"""The two ends of a replication connection as sans-IO state machines (RocketMQ's AutoSwitchHAConnection/Client).

Bytes in, events out, time passed in: the Twisted adapters (``cluster.replication``)
write the ``Send`` events' bytes, apply the slave's ``Truncate``/``NewEpoch``/``Append``
events to the store in order, and drop the connection on ``Close``.

States (``HAState``) and what moves them::

    master side                                  slave side
    READY --connection_made--> HANDSHAKE         READY --connection_made--> HANDSHAKE (sends HELLO)
    HANDSHAKE: HELLO  -> CHALLENGE               HANDSHAKE: CHALLENGE (master's MAC ok) -> PROOF
               PROOF (slave's MAC ok) -> EPOCHS             EPOCHS -> walk back, Truncate, ACK -> TRANSFER
               first ACK (a valid offset) -> TRANSFER
    TRANSFER: pump -> TRANSFER frames (window)   TRANSFER: TRANSFER -> [NewEpoch] Append, ACK
              ACK -> SlaveAcked                            (an empty TRANSFER is a heartbeat: ACK)
    TRANSFER <-suspend/resume-> SUSPEND
    any --bad input / timeout / REFUSED / close--> SHUTDOWN (Close event; REFUSED sent first when we refuse)

The slave refuses, and never truncates, on: a master that fails the secret, an
epoch list out of order, no common epoch, a truncation point below the confirm
offset it has seen, a transfer at any offset but its log's end, an epoch older
than its newest or with another start, and a body that is not whole records
with good CRCs. The master refuses a slave that fails the secret and acks
outside what it holds or was sent.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from store import ha_codec as codec
from store import record as rec
from store.ha_codec import HAState
from store.ha_epochs import EpochEntry, EpochError, check_entries, epoch_at, truncation_point


# -- events -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Send:
    """Write ``data`` to the peer."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Close:
    """Drop the connection; ``refused``: the peer misbehaved (log it loudly), else an orderly or timed-out end."""

    reason: str
    refused: bool = False


@dataclass(frozen=True, slots=True)
class SlaveReady:
    """(master) A slave proved the secret and starts receiving from ``offset``."""

    slave_id: str
    offset: int
    async_learner: bool


@dataclass(frozen=True, slots=True)
class SlaveAcked:
    """(master) The slave's log reaches ``offset``; ``caught_up_at``: when it last had all of the master's log."""

    slave_id: str
    offset: int
    caught_up_at: float


@dataclass(frozen=True, slots=True)
class Truncate:
    """(slave) Cut the local log and all it feeds to ``offset``; keep the epochs up to ``keep_epoch`` (None: all go)."""

    offset: int
    keep_epoch: int | None


@dataclass(frozen=True, slots=True)
class NewEpoch:
    """(slave) The records that follow belong to a new epoch: record it in the epoch file."""

    entry: EpochEntry


@dataclass(frozen=True, slots=True)
class Append:
    """(slave) Append ``data`` (whole records, already checked) at ``offset``, the local log's end."""

    offset: int
    data: bytes
    records: tuple[rec.Record, ...]


@dataclass(frozen=True, slots=True)
class ConfirmAdvanced:
    """(slave) The master's confirm offset, capped at the local log's end, moved to ``offset``."""

    offset: int


Event = Send | Close | SlaveReady | SlaveAcked | Truncate | NewEpoch | Append | ConfirmAdvanced


class LogSource(Protocol):
    """What the master side reads: the log's bounds, its epochs and its raw bytes."""

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    def epochs(self) -> Sequence[EpochEntry]: ...

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes from ``offset`` (fewer at a segment's end; may end inside a record)."""


class _Peer:
    """What both ends share: the state, the decoder, refusing."""

    def __init__(self, secret: str, timeout_s: float, nonce: Callable[[int], bytes]) -> None:
        self.secret = secret
        self.timeout_s = timeout_s
        self._nonce = nonce
        self.state = HAState.READY
        self.decoder = codec.FrameDecoder()
        self.last_received = 0.0
        self.close_reason = ""

    def _refuse(self, reason: str) -> list[Event]:
        if self.state is HAState.SHUTDOWN:
            return []
        self.state = HAState.SHUTDOWN
        self.close_reason = reason
        return [Send(codec.encode(codec.Refused(reason))), Close(reason, refused=True)]

    def refuse(self, reason: str) -> list[Event]:
        """Refuse the peer for what its adapter found wrong (REFUSED is sent, then the connection closes)."""
        return self._refuse(reason)

    def close(self, reason: str) -> list[Event]:
        """Our side ends the connection (shutdown, role change)."""
        if self.state is HAState.SHUTDOWN:
            return []
        self.state = HAState.SHUTDOWN
        self.close_reason = reason
        return [Close(reason)]

    def _frames(self, data: bytes, now: float) -> tuple[list, list[Event]]:
        if self.state is HAState.SHUTDOWN:
            return [], []
        self.last_received = now
        try:
            return self.decoder.feed(data), []
        except codec.FrameError as exc:
            return [], self._refuse(f"bad frame: {exc}")

    def _timed_out(self, now: float) -> list[Event]:
        if self.state not in (HAState.READY, HAState.SHUTDOWN) and now - self.last_received > self.timeout_s:
            self.state = HAState.SHUTDOWN
            self.close_reason = f"no frame from the peer for {self.timeout_s:g} s"
            return [Close(self.close_reason)]
        return []


class MasterConnection(_Peer):
    """The master's end of one slave's connection."""

    def __init__(self, source: LogSource, secret: str, *, max_body: int = 1 << 20, window: int = 8 << 20,
                 heartbeat_s: float = 1.0, timeout_s: float = 5.0,
                 nonce: Callable[[int], bytes] = os.urandom) -> None:
        super().__init__(secret, timeout_s, nonce)
        self.source = source
        self.max_body = max_body
        self.window = window
        self.heartbeat_s = heartbeat_s
        self.decoder.max_body = 0  # a slave sends no TRANSFER
        self.slave_id = ""
        self.async_learner = False
        self._slave_nonce = b""
        self._master_nonce = b""
        self._step = "hello"
        self.transfer_offset = -1  # where the next TRANSFER starts
        self.acked_offset = -1  # the slave's log end, as it last said
        self.caught_up_at = 0.0
        self._last_sent = 0.0
        # (the master's log end, when) at each frame sent: an ack reaching an end says the slave then held all the
        # master held at that time (RocketMQ's lastMasterMaxOffset / lastTransferTimeMs, one per frame in flight).
        self._sent: deque[tuple[int, float]] = deque()

    def connection_made(self, now: float) -> list[Event]:
        """The slave connected: wait for its HELLO."""
        self.state = HAState.HANDSHAKE
        self.last_received = now
        return []

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Bytes from the slave."""
        frames, out = self._frames(data, now)
        for frame in frames:
            if self.state is HAState.SHUTDOWN:
                break
            out += self._on_frame(frame, now)
        return out

    def _on_frame(self, frame, now: float) -> list[Event]:
        if isinstance(frame, codec.Refused):
            return self.close(f"slave refused: {frame.reason}")
        step = self._step
        if step == "hello" and isinstance(frame, codec.Hello):
            if frame.version != codec.VERSION:
                return self._refuse(f"protocol version {frame.version}, this master speaks {codec.VERSION}")
            self.slave_id, self.async_learner, self._slave_nonce = frame.slave_id, frame.async_learner, frame.nonce
            self._master_nonce = self._nonce(codec.NONCE_SIZE)
            self._step = "proof"
            mac = codec.master_mac(self.secret, self._slave_nonce, self._master_nonce)
            return [Send(codec.encode(codec.Challenge(self._master_nonce, mac)))]
        if step == "proof" and isinstance(frame, codec.Proof):
            if not codec.mac_ok(codec.slave_mac(self.secret, self._slave_nonce, self._master_nonce), frame.mac):
                return self._refuse(f"slave {self.slave_id!r} failed the cluster secret")
            self._step = "first_ack"
            src = self.source
            return [Send(codec.encode(codec.Epochs(src.max_offset, src.min_offset, tuple(src.epochs()))))]
        if step == "first_ack" and isinstance(frame, codec.Ack):
            src = self.source
            if frame.max_offset > src.max_offset:
                return self._refuse(f"slave offset {frame.max_offset} is beyond this master's end {src.max_offset}")
            if frame.max_offset < src.min_offset:
                return self._refuse(f"slave offset {frame.max_offset} is below this master's first offset "
                                    f"{src.min_offset} (retention deleted it): the slave needs a fresh copy")
            self._step = "transfer"
            self.state = HAState.TRANSFER
            self.transfer_offset = self.acked_offset = frame.max_offset
            self.caught_up_at = now if frame.max_offset >= src.max_offset else 0.0
            return [SlaveReady(self.slave_id, frame.max_offset, self.async_learner)]
        if step == "transfer" and isinstance(frame, codec.Ack):
            if not self.acked_offset <= frame.max_offset <= self.transfer_offset:
                return self._refuse(f"ack {frame.max_offset} outside [{self.acked_offset}, {self.transfer_offset}]"
                                    " (acked, sent)")
            self.acked_offset = frame.max_offset
            sent = self._sent
            while sent and sent[0][0] <= frame.max_offset:
                self.caught_up_at = max(self.caught_up_at, sent.popleft()[1])
            return [SlaveAcked(self.slave_id, frame.max_offset, self.caught_up_at)]
        return self._refuse(f"unexpected {type(frame).__name__} in {self.state.name} ({step})")

    def suspend(self) -> None:
        """Hold the transfer (heartbeats go on)."""
        if self.state is HAState.TRANSFER:
            self.state = HAState.SUSPEND

    def resume(self) -> None:
        """Transfer again after ``suspend``."""
        if self.state is HAState.SUSPEND:
            self.state = HAState.TRANSFER

    def pump(self, now: float, confirm_offset: int) -> list[Event]:
        """Send what the log holds beyond the slave, within the window; a heartbeat when idle."""
        if self.state not in (HAState.TRANSFER, HAState.SUSPEND):
            return []
        src = self.source
        log_end = src.max_offset
        out: list[Event] = []
        if self.acked_offset >= log_end:
            self.caught_up_at = now
        while self.state is HAState.TRANSFER and self.transfer_offset < log_end \
                and self.transfer_offset - self.acked_offset < self.window:
            frame = self._next_transfer(log_end, confirm_offset)
            if isinstance(frame, list):
                return out + frame
            out.append(Send(codec.encode(frame)))
            self.transfer_offset += len(frame.body)
            self._last_sent = now
            self._note_sent(log_end, now)
        if not out and now - self._last_sent >= self.heartbeat_s:
            found = epoch_at(src.epochs(), self.transfer_offset, log_end)
            entry = found[0] if found else (src.epochs() or [EpochEntry(0, 0)])[-1]
            out.append(Send(codec.encode(codec.Transfer(self.transfer_offset, entry.epoch, entry.start_offset,
                                                        min(confirm_offset, self.transfer_offset)))))
            self._last_sent = now
            self._note_sent(log_end, now)
        return out

    def _note_sent(self, log_end: int, now: float) -> None:
        sent = self._sent
        if sent and sent[-1][0] == log_end:
            sent[-1] = (log_end, now)  # the same end, later: the newer time is the one an ack proves
        else:
            sent.append((log_end, now))

    def _next_transfer(self, log_end: int, confirm_offset: int) -> codec.Transfer | list[Event]:
        offset = self.transfer_offset
        if offset < self.source.min_offset:
            return self._refuse(f"retention deleted this master's log below {self.source.min_offset} before "
                                f"offset {offset} reached the slave: it needs a fresh copy")
        found = epoch_at(self.source.epochs(), offset, log_end)
        if found is None:
            return self._refuse(f"this master has no epoch for offset {offset}")
        entry, end = found
        limit = min(end, log_end, offset + self.max_body)
        raw = self.source.read_raw(offset, limit - offset)
        size = whole_records(raw)
        if size == 0:  # the first record is larger than max_body (or than what one read gave): send it alone
            try:
                need = rec.check_header(raw) if len(raw) >= rec.HEADER_SIZE else \
                    rec.check_header(self.source.read_raw(offset, rec.HEADER_SIZE))
            except rec.RecordError as exc:
                return self._refuse(f"this master's log is unreadable at {offset}: {exc}")
            raw = self.source.read_raw(offset, need)
            size = whole_records(raw)
            if size == 0:
                return self._refuse(f"this master's log is unreadable at {offset}")
        return codec.Transfer(offset, entry.epoch, entry.start_offset, min(confirm_offset, offset + size), raw[:size])

    def tick(self, now: float) -> list[Event]:
        """Time passed: a slave silent for ``timeout_s`` is dropped."""
        return self._timed_out(now)


def whole_records(buf: bytes) -> int:
    """How many leading bytes of ``buf`` are whole records (headers checked, not CRCs)."""
    pos = 0
    n = len(buf)
    while n - pos >= rec.HEADER_SIZE:
        try:
            size = rec.check_header(buf, pos)
        except rec.RecordError:
            break
        if pos + size > n:
            break
        pos += size
    return pos


def decode_records(body: bytes, offset: int) -> tuple[rec.Record, ...]:
    """Every record of ``body`` (CRC checked), the first at log offset ``offset``; RecordError if it is not whole."""
    out = []
    pos = 0
    while pos < len(body):
        r = rec.decode(body, pos, offset=offset + pos)
        out.append(r)
        pos += r.size
    return tuple(out)


class SlaveConnection(_Peer):
    """The slave's end: proves the secret, walks the epochs back, truncates, then appends and acks."""

    def __init__(self, slave_id: str, secret: str, *, async_learner: bool = False, timeout_s: float = 5.0,
                 nonce: Callable[[int], bytes] = os.urandom) -> None:
        super().__init__(secret, timeout_s, nonce)
        self.slave_id = slave_id
        self.async_learner = async_learner
        self.decoder.max_body = 0  # no TRANSFER before the master proved the secret
        self._nonce_sent = b""
        self._step = "challenge"
        self.max_offset = 0
        self.min_offset = 0
        self.epochs: list[EpochEntry] = []
        self.confirm_offset = 0
        self.master_proved = False

    def connection_made(self, now: float, max_offset: int, min_offset: int, epochs: Sequence[EpochEntry],
                        confirm_offset: int = 0) -> list[Event]:
        """Connected to the master: say who we are and challenge it.

        ``confirm_offset`` is the highest confirm offset this broker knows of:
        the handshake never truncates below it.
        """
        self.state = HAState.HANDSHAKE
        self.last_received = now
        self.max_offset, self.min_offset = max_offset, min_offset
        self.epochs = list(epochs)
        self.confirm_offset = min(confirm_offset, max_offset)
        self._nonce_sent = self._nonce(codec.NONCE_SIZE)
        return [Send(codec.encode(codec.Hello(self.slave_id, self._nonce_sent, self.async_learner)))]

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Bytes from the master."""
        frames, out = self._frames(data, now)
        for frame in frames:
            if self.state is HAState.SHUTDOWN:
                break
            out += self._on_frame(frame)
        return out

    def tick(self, now: float) -> list[Event]:
        """Time passed: a master silent for ``timeout_s`` (no heartbeat) is given up on."""
        return self._timed_out(now)

    def _on_frame(self, frame) -> list[Event]:
        if isinstance(frame, codec.Refused):
            return self.close(f"master refused: {frame.reason}")
        step = self._step
        if step == "challenge" and isinstance(frame, codec.Challenge):
            if not codec.mac_ok(codec.master_mac(self.secret, self._nonce_sent, frame.nonce), frame.mac):
                return self._refuse("the master failed the cluster secret")
            self.master_proved = True
            self._step = "epochs"
            mac = codec.slave_mac(self.secret, self._nonce_sent, frame.nonce)
            return [Send(codec.encode(codec.Proof(mac, self.max_offset)))]
        if step == "epochs" and isinstance(frame, codec.Epochs):
            return self._on_epochs(frame)
        if step == "transfer" and isinstance(frame, codec.Transfer):
            return self._on_transfer(frame)
        return self._refuse(f"unexpected {type(frame).__name__} in {self.state.name} ({step})")

    def _on_epochs(self, frame: codec.Epochs) -> list[Event]:
        try:
            check_entries(frame.entries)
        except EpochError as exc:
            return self._refuse(f"master's epochs are not in order: {exc}")
        if frame.min_offset > frame.max_offset:
            return self._refuse(f"master's log bounds [{frame.min_offset}, {frame.max_offset}) are impossible")
        out: list[Event] = []
        if not self.epochs:
            if self.max_offset > self.min_offset:
                return self._refuse(f"this slave holds [{self.min_offset}, {self.max_offset}) under no epoch: "
                                    "nothing proves it matches the master's log")
            point, keep = self.max_offset, None
        else:
            found = truncation_point(self.epochs, self.max_offset, frame.entries, frame.max_offset)
            if found is None and self.max_offset == self.min_offset:
                # It holds nothing, so none of its epochs can conflict: a master elected before any record of the
                # last epoch reached it lists none of it (an old master relaunched over an empty log).
                found = (self.max_offset, None)
            if found is None:
                return self._refuse(f"no common epoch with the master (local {self.epochs[-3:]}, "
                                    f"master {list(frame.entries[-3:])})")
            point, keep = found
        if point < self.min_offset:
            return self._refuse(f"the handshake would truncate to {point}, below this log's first offset "
                                f"{self.min_offset}")
        if point < self.confirm_offset:
            return self._refuse(f"the handshake would truncate to {point}, below the confirm offset "
                                f"{self.confirm_offset}")
        if point < frame.min_offset:
            return self._refuse(f"this slave's log ends at {point}, below the master's first offset "
                                f"{frame.min_offset}")
        kept = [e for e in self.epochs if keep is not None and e.epoch <= keep]
        if point < self.max_offset or kept != self.epochs:
            out.append(Truncate(point, keep))
            self.max_offset, self.epochs = point, kept
        self._step = "transfer"
        self.state = HAState.TRANSFER
        self.decoder.max_body = codec.MAX_BODY
        out.append(Send(codec.encode(codec.Ack(self.max_offset))))
        return out

    def _on_transfer(self, t: codec.Transfer) -> list[Event]:
        if t.offset != self.max_offset:
            where = "beyond" if t.offset > self.max_offset else "behind"
            return self._refuse(f"transfer at {t.offset} is {where} this log's end {self.max_offset}")
        last = self.epochs[-1] if self.epochs else None
        out: list[Event] = []
        if last is not None and t.epoch < last.epoch:
            return self._refuse(f"transfer in epoch {t.epoch}, older than this log's epoch {last.epoch}")
        if last is not None and t.epoch == last.epoch and t.epoch_start != last.start_offset:
            return self._refuse(f"epoch {t.epoch} starts at {t.epoch_start} for the master, "
                                f"at {last.start_offset} here")
        records: tuple[rec.Record, ...] = ()
        if t.body:
            try:
                records = decode_records(t.body, t.offset)
            except rec.RecordError as exc:
                return self._refuse(f"corrupt body in the transfer at {t.offset}: {exc}")
        if t.body and (last is None or t.epoch > last.epoch):
            if t.epoch_start > t.offset or (last is not None and t.epoch_start != t.offset):
                return self._refuse(f"new epoch {t.epoch} starting at {t.epoch_start} cannot begin a transfer "
                                    f"at {t.offset}")
            entry = EpochEntry(t.epoch, t.epoch_start)
            self.epochs.append(entry)
            out.append(NewEpoch(entry))
        if t.body:
            out.append(Append(t.offset, t.body, records))
            self.max_offset += len(t.body)
        confirm = min(t.confirm_offset, self.max_offset)
        if confirm > self.confirm_offset:
            self.confirm_offset = confirm
            out.append(ConfirmAdvanced(confirm))
        out.append(Send(codec.encode(codec.Ack(self.max_offset))))
        return out
