"""Durable session state as commit-log records; the session KV is the index derived from them.

The same mechanism keeps the native engine's state (consumer cursors, messages
in flight, POP checkpoints, known queues) in the log, all of it as positions
(``positions_only``, below), under its own ``namespace``.

Every change of session state (a subscription, a session's meta, a claim, the
epoch mark, a QoS 2 packet id, ...) is one key set or deleted in the session
KV. ``SessionLog`` appends that change to the commit log as a ``SESSION``
record, answers the writer once the record is durable under the flush policy
(as a publish is answered), and applies it to the KV when the record is
dispatched, live or replayed. So the log, which replicates, holds the state,
and the KV can be rebuilt from it::

    kind SESSION, flags 0, topic "", client_id "", body empty (the common layout of store.record)
    properties: SK = the KV key, SV = its new value (absent: the key is deleted),
                both bytes as latin-1 text (one code point per byte), so any key round-trips;
                SN = the namespace, absent for sessions ("native": the native engine's KV)

Beside each key the KV holds where its live record is (``WHERE`` + key ->
offset u64, size u32) and the commit-log offset it has applied up to
(``CHECKPOINT``), written in the same batch as the change itself. Recovery
replays the log from that checkpoint (``dispatched_offset``); a checkpoint
outside the log (a lost KV tail, a KV older than retention) clears the KV and
rebuilds it from the oldest segment. Retention never loses a live key:
``records_to_carry`` names every live record below the segments to delete, and
retention re-appends them (``SYSTEM`` records that keep ``SK``/``SV`` and add
``CARRIED``) before it deletes (``store.retention``).

Delivery positions may lag (``put_position``): a subscription's send mark, a
QoS 1 PUBLISH in flight and a shared group's committed offset change with
every delivery, so they go to the KV at once (its WAL on: a kill -9 of this
broker keeps them, as before) and to the log only every ``position_log_s``,
each dirty key once with its value then. A failover to a replica therefore
resumes from positions up to that interval old and redelivers (QoS 1
duplicates), never loses. A key with a logged change not yet dispatched takes
its position writes through the log too, so the KV never goes back. With
``positions_only`` every write is a position: the native engine's cursors and
in-flight entries change with every consume and confirm, and losing some of
the last second of them on a failover redelivers those messages (at least
once, as ``retry`` and POP invisibility already do), never loses one: the
values logged in one round are all taken at one moment, so a cursor never
runs ahead of the in-flight entries it relies on.

The KV keeps its WAL on: the positions written in place are not derived from
the log (their log copy lags), so only the logged keys are rebuildable.

A data dir from before this module (sessions in the KV, none in the log) is
upgraded by ``open``: such a KV has keys but no checkpoint (every batch that
applies a record carries one), so every key is appended once; no checkpoint is
saved until those records are dispatched, so a crash before then upgrades
again. (Its first start replays the whole log once, finding no records.)
"""

from __future__ import annotations

import functools
import logging
import struct
from typing import Iterator, Sequence

from twisted.internet import defer, task

from store import record as rec
from store.dispatch import DispatcherBase, DispatchRequest
from store.message_store import MessageStore, PutResult, PutStatus
from store.retention import CARRIED

log = logging.getLogger("twistmq.store.session_log")

SESSION_KEY = "SK"  # property: the KV key a SESSION record sets or deletes (latin-1 text of its bytes)
SESSION_VALUE = "SV"  # property: its new value (absent: deleted)
NAMESPACE = "SN"  # property: which KV the record belongs to (absent: the session KV)
INTERNAL = b"\x01"  # keys of this module start with it; session keys never do (they start with a letter)
WHERE = b"\x01w/"  # + key -> (offset, size) of the record holding the key's live value
CHECKPOINT = b"\x01checkpoint"  # commit-log offset applied up to (u64)
_POS = struct.Struct(">QI")
_U64 = struct.Struct(">Q")
_WRITTEN = (PutStatus.FLUSH_DISK_FAILED, PutStatus.FLUSH_SLAVE_TIMEOUT)  # refused, yet written and dispatched
CHECKPOINT_EVERY = 16 << 20  # bytes of log without session records after which the checkpoint moves anyway


class SessionLogError(RuntimeError):
    """A session change could not be made durable (the store refused or failed the append)."""


class SessionLog(DispatcherBase):
    """``SessionLog(store, kv, clock)``: the session KV's writer (through the log) and its dispatcher.

    Reads (``get``/``scan``) see every write at once, appended or not; made
    before ``store.open()`` (it replays as a dispatcher); ``open()`` after it.
    """

    def __init__(self, store: MessageStore, kv, clock, position_log_s: float = 1.0, namespace: str = "",
                 positions_only: bool = False) -> None:
        if getattr(store, "is_open", False):
            raise RuntimeError("SessionLog must be created before store.open() (it replays as a dispatcher)")
        self._store = store
        self._kv = kv
        self._clock = clock
        self.position_log_s = position_log_s
        self.namespace = namespace
        self.positions_only = positions_only
        raw = kv.get(CHECKPOINT)
        self.dispatched_offset = _U64.unpack(raw)[0] if raw else 0
        # keys and no checkpoint: a KV from before the log held its state (no checkpoint until it is upgraded)
        self._upgrade = raw is None and next(iter(kv.scan(b"")), None) is not None
        self._end = self.dispatched_offset  # the end of the last dispatched request
        # key -> [value or None, records of it appended and not yet dispatched]: what reads see meanwhile
        self._overlay: dict[bytes, list] = {}
        # key -> its value (None: deleted), for keys whose position was written in place since last logged
        self._dirty: dict[bytes, bytes | None] = {}
        # positions_only: the keys with a live record in the log (few: cursors, messages in flight, queues),
        # so a key written and deleted between two rounds costs no lookup
        self._logged: set[bytes] | None = set() if positions_only else None
        self._stopped = False
        self._seq = 0  # appends made
        self._answered = 0  # appends answered (the store answers in append order)
        self._barriers: list[tuple[int, defer.Deferred]] = []
        self._loop: task.LoopingCall | None = None
        self.appended = 0
        self.position_records = 0
        self.migrated = 0
        store.register_dispatcher(self)
        store.retention.add_carrier(self.records_to_carry)

    # -- the KV interface SessionStore writes through ---------------------------------------------

    def put(self, key: bytes, value: bytes) -> defer.Deferred:
        """Set ``key``; fires once its record is durable under the flush policy."""
        if self.positions_only:
            return self.put_position(key, value)
        return self._append(key, value)

    def delete(self, key: bytes) -> defer.Deferred:
        """Delete ``key``; fires once its record is durable under the flush policy."""
        if self.positions_only:
            return self.put_position(key, None)
        return self._append(key, None)

    def put_position(self, key: bytes, value: bytes | None) -> defer.Deferred:
        """Set (``None``: delete) a delivery position: in the KV now (the Deferred fires once it is durable
        there), in the log within ``position_log_s``."""
        self._position(key, value)
        return self._kv.put(key, value) if value is not None else self._kv.delete(key)

    def stage(self, key: bytes, value: bytes | None) -> None:
        """``put_position`` without a Deferred (``on_durable`` tells when it is durable), as ``DurableKV.stage``."""
        self._position(key, value)
        self._kv.stage(key, value)

    def on_durable(self, on_done, on_error) -> None:
        """``on_done()`` once every position written so far is durable in the KV (``DurableKV.on_durable``)."""
        self._kv.on_durable(on_done, on_error)

    def _position(self, key: bytes, value: bytes | None) -> None:
        if key in self._overlay:  # a logged change of it is on its way: this one follows it in the log too
            self._append(key, value).addErrback(self._position_failed, key)
        else:
            self._dirty[key] = value

    def delete_position(self, key: bytes) -> defer.Deferred:
        """``put_position(key, None)``."""
        return self.put_position(key, None)

    def get(self, key: bytes) -> bytes | None:
        """The latest value of ``key``, including writes not yet durable."""
        entry = self._overlay.get(key)
        if entry is not None:
            return entry[0]
        return self._kv.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Pairs whose key starts with ``prefix``, in key order, including writes not yet durable."""
        over = {k: e[0] for k, e in self._overlay.items() if k.startswith(prefix)} if self._overlay else None
        if not over:
            yield from self._kv.scan(prefix)
            return
        merged = dict(self._kv.scan(prefix))
        merged.update(over)
        for k in sorted(merged):
            v = merged[k]
            if v is not None:
                yield k, v

    def barrier(self) -> defer.Deferred:
        """Fires once every write made so far is durable (appended ones and positions alike)."""
        kv = self._kv.barrier()
        if self._answered >= self._seq:
            return kv
        d: defer.Deferred = defer.Deferred()
        self._barriers.append((self._seq, d))
        return defer.gatherResults([kv, d], consumeErrors=True).addCallback(lambda _: None)

    def _append(self, key: bytes, value: bytes | None) -> defer.Deferred:
        props = {SESSION_KEY: key.decode("latin-1")}
        if value is not None:
            props[SESSION_VALUE] = value.decode("latin-1")
        if self.namespace:
            props[NAMESPACE] = self.namespace
        self._dirty.pop(key, None)  # this record carries the latest value
        entry = self._overlay.get(key)
        if entry is None:
            self._overlay[key] = [value, 1]
        else:
            entry[0] = value
            entry[1] += 1
        self._seq += 1
        self.appended += 1
        d: defer.Deferred = defer.Deferred()
        message = rec.Message("", b"", rec.RecordKind.SESSION, properties=props)
        self._store.submit(message, functools.partial(self._answer, key, self._seq, d))
        return d

    def _answer(self, key: bytes, seq: int, d: defer.Deferred, result: PutResult) -> None:
        self._answered = max(self._answered, seq)
        if result.status is PutStatus.PUT_OK:
            d.callback(None)
        else:
            if result.status not in _WRITTEN:  # never written, so never dispatched
                self._undo(key)
            log.error("session_log_append_failed key=%r status=%s reason=%s", key[:64], result.status.name,
                      result.reason)
            d.errback(SessionLogError(f"session state not stored: {result.status.value} {result.reason}".strip()))
        while self._barriers and self._barriers[0][0] <= self._answered:
            self._barriers.pop(0)[1].callback(None)

    def _undo(self, key: bytes) -> None:
        entry = self._overlay.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._overlay[key]

    # -- dispatcher ---------------------------------------------------------------------------------

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """Apply the session records among ``requests`` to the KV, with their places and the checkpoint."""
        if not requests:
            return None
        if self._stopped:
            return None  # the KV may be closed: a restart replays these from the checkpoint
        session, system, namespace = rec.RecordKind.SESSION, rec.RecordKind.SYSTEM, self.namespace
        applied = False
        for r in requests:
            kind = r.kind
            if kind is not session and kind is not system:
                continue  # what nearly every record is
            props = r.properties
            skey = props.get(SESSION_KEY)
            if skey is None or props.get(NAMESPACE, "") != namespace or r.offset < self.dispatched_offset:
                continue
            key = skey.encode("latin-1")
            carried = props.get(CARRIED) if kind is system else None
            if carried is not None and self._moved(key, carried, r.offset, r.size):
                applied = True
                continue
            self._apply(key, props.get(SESSION_VALUE), r.offset, r.size)
            applied = True
        last = requests[-1]
        self._end = last.offset + last.size
        if applied or self._end - self.dispatched_offset >= CHECKPOINT_EVERY:
            self._checkpoint()
        return None

    def _apply(self, key: bytes, value: str | None, offset: int, size: int) -> None:
        stage = self._kv.stage
        if value is None:
            stage(key, None)
            stage(WHERE + key, None)
            if self._logged is not None:
                self._logged.discard(key)
        else:
            stage(key, value.encode("latin-1"))
            stage(WHERE + key, _POS.pack(offset, size))
            if self._logged is not None:
                self._logged.add(key)
        self._undo(key)  # the overlay's copy (if this process wrote it) is in the KV now

    def _moved(self, key: bytes, carried: str, offset: int, size: int) -> bool:
        """A carried copy of the record the KV applied last for ``key``: only its place moves.

        Its value is that record's, and the KV may hold a newer position
        written in place since (between the carry and this dispatch): applying
        the copy would take the KV back. Replayed on a KV that never saw the
        original (rebuilt after retention deleted it), the copy is applied.
        """
        where = self._kv.get(WHERE + key)
        if where is None or str(_POS.unpack(where)[0]) != carried:
            return False
        self._kv.stage(WHERE + key, _POS.pack(offset, size))
        return True

    def _checkpoint(self) -> None:
        if self._upgrade:
            return  # a checkpoint would mark the KV upgraded before it is
        self._kv.stage(CHECKPOINT, _U64.pack(self._end))  # in the same KV batch as the changes it covers
        self.dispatched_offset = self._end

    def reset(self) -> None:
        """The log lost records the KV has applied (or the KV is older than the log): rebuild from the log."""
        log.warning("session_log_rebuild checkpoint=%d", self.dispatched_offset)
        for key, _ in list(self._kv.scan(b"")):
            self._kv.stage(key, None)
        self.dispatched_offset = self._end = 0
        if self._logged is not None:
            self._logged.clear()

    def close(self) -> None:
        """The store is closing: save the checkpoint of everything dispatched (``stop`` did, if it ran)."""
        if not self._stopped and self._end != self.dispatched_offset:
            self._checkpoint()

    # -- retention and positions -----------------------------------------------------------------------

    def records_to_carry(self, offset: int) -> list[tuple[int, int]]:
        """``(cl_offset, size)`` of every live session record below ``offset`` (a RetentionCarrier).

        The positions written in place go to the log first and every pending
        append is dispatched, so the places read are current: nothing appended
        later can be older than a record carried now.
        """
        self.log_positions()
        self._store.drain()
        out = []
        for _key, raw in self._kv.scan(WHERE):
            cl_offset, size = _POS.unpack(raw)
            if cl_offset < offset:
                out.append((cl_offset, size))
        out.sort()
        return out

    def log_positions(self) -> int:
        """Append the current value of every position written in place since the last call; returns how many."""
        dirty, self._dirty = self._dirty, {}
        if getattr(self._store, "replica_of", ""):
            return 0  # a slave: its master logs the positions (a slave's own are rebuilt from the master's log)
        logged = self._logged
        n = 0
        for key, value in dirty.items():
            if value is None and key not in self._overlay and (
                    key not in logged if logged is not None else self._kv.get(WHERE + key) is None):
                continue  # never logged and gone again (a message acknowledged meanwhile)
            self._append(key, value).addErrback(self._position_failed, key)
            n += 1
        self.position_records += n
        return n

    def _position_failed(self, failure, key: bytes) -> None:
        if key not in self._dirty and key not in self._overlay:  # the next round tries again, with the value then
            self._dirty[key] = self.get(key)

    # -- lifecycle -------------------------------------------------------------------------------------

    def open(self) -> defer.Deferred:
        """After ``store.open()``: upgrade a KV that predates the log's session records, start logging positions.

        Fires once the upgrade's records are durable (at once when there is none).
        """
        d = defer.succeed(None)
        if self._logged is not None:
            self._logged.update(k[len(WHERE):] for k, _ in self._kv.scan(WHERE))
        if self._upgrade and getattr(self._store, "replica_of", ""):
            # A slave's state comes from its master's log: it appends nothing of its own (the store refuses).
            self._upgrade = False
            log.info("session_log_upgrade_skipped namespace=%s role=slave", self.namespace or "sessions")
        if self._upgrade:
            pairs = [(k, v) for k, v in self._kv.scan(b"") if not k.startswith(INTERNAL)]
            writes = [self._append(k, v) for k, v in pairs]
            self._upgrade = False  # their dispatch saves the checkpoint, in the KV batch that applies them
            self.migrated = len(pairs)
            log.info("session_log_upgrade namespace=%s keys=%d", self.namespace or "sessions", len(pairs))
            d = defer.gatherResults(writes, consumeErrors=True).addCallback(lambda _: None)
        if self._loop is None and self.position_log_s > 0:
            self._loop = task.LoopingCall(self._position_tick)
            self._loop.clock = self._clock
            self._loop.start(self.position_log_s, now=False)
        return d

    def _position_tick(self) -> None:
        try:
            self.log_positions()
        except Exception:  # noqa: BLE001 - the loop must go on; the error is logged
            log.exception("session_positions_failed")

    def stop(self) -> defer.Deferred:
        """Stop the position loop, log what moved since its last round, wait until that is durable and
        dispatched, and save the checkpoint; the KV may be closed once this fires."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._store.is_open:
            self.log_positions()

        def stopped(result):
            if not self._stopped:
                if self._end != self.dispatched_offset:
                    self._checkpoint()
                self._stopped = True
            return result

        return self.barrier().addErrback(
            lambda f: log.error("session_log_stop error=%s", f.getErrorMessage())).addBoth(stopped)

    def stats(self) -> dict[str, float]:
        """Counters for metrics."""
        return {
            "session_records_appended_total": float(self.appended),
            "session_position_records_total": float(self.position_records),
            "session_changes_in_flight": float(len(self._overlay)),
        }
