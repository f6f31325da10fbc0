"""Delayed messages on the store: TIMER records in, real messages out when they are due.

``schedule(message, deliver_at_ms)`` appends ONE commit-log record of kind
``TIMER`` that holds the real message (topic, body, qos, retain, client id and
properties) plus two properties: ``TIMER_KIND`` (the real record kind) and
``TIMER_AT`` (the delivery time, ms since the epoch). The service is a store
dispatcher: every TIMER record dispatched (live or replayed after a crash) is
enqueued in the ``Timer`` (timer log + wheel). A ``LoopingCall`` on the injected
clock ticks every ``tick_ms`` (10 ms, finer than a slot): it reads the slot whose
window holds the current time ahead of the slot's end, keeps its entries (sorted
by due time) in the backlog, and hands each out on the first tick at or after
its due time, so lateness is a tick plus the put, not up to a slot plus a tick.
A tick reads and hands out at most ``max_per_tick`` entries, so a burst due at
once, or the catch-up after a stall, is spread over short reactor turns.
Each due entry is read back from
the commit log and its real message is ``put`` into the store, where it is
indexed and delivered like any other. The real message carries the property
``ORIGIN``: the commit-log offset of the first TIMER record written for it, a
stable id that the native protocol reports as ``msg_id``.

Durability (what survives kill -9):

- A scheduled message is acknowledged once its TIMER record is written (the
  store's rule), so it survives by construction: the record is in the log.
- The checkpoint file (``DIR/checkpoint.json``) holds the timer checkpoint,
  ``dispatched_offset`` (the commit-log offset up to which the timer has seen
  every record), the cancelled set and the ledger (below). After a restart
  the store replays the log from there into the timer, so TIMER records
  appended after the checkpoint are enqueued again.
- A checkpoint is only taken when every entry handed out by the timer has been
  put into the store and acknowledged (a barrier: advancing pauses until the
  delivery puts in flight resolve). An entry put after the saved checkpoint is
  handed out again after a crash, but the delivered message carries
  ``TIMER_FROM`` (the TIMER record it consumes), the replay finds it, and the
  entry is dropped: exactly once, as far as the log survived.
- Long delays hop: a TIMER record is parked at most ``hop_ms`` ahead; when that
  comes due and the real time is still ahead, a fresh TIMER record (same
  ``ORIGIN``, ``TIMER_FROM`` naming the copy it replaces) is appended, so
  commit-log retention never deletes the only copy of a message that is still
  waiting.

Replicas (``store.timer_ledger``). Whether a TIMER record is still owed is a
fact of the log: no later record names it in ``TIMER_FROM``. A slave enqueues
the TIMER records it replicates and advances its wheel like its master, but
does not deliver (``pause()``, and whenever the store refuses writes): what
comes due waits in ``ledger.pending`` until the master's delivery replicates.
Promoted (``start()`` on a writable store), it delivers exactly what is still
pending, then goes on as master. A truncation (``truncate_to``, a replica's
handshake) takes the saved checkpoint back if it saw nothing past the cut and
the store replays the log up to the cut, else the state is rebuilt from the
whole log; either way a timer whose delivery was cut is owed again and one
delivered below the cut is not.
- ``cancel(timer_id)`` appends one ``SYSTEM`` record naming the timer (property
  ``TIMER_CANCEL``, its ``ORIGIN``) and its due time; dispatching it (live or
  replayed) adds the id to the cancelled set, which every checkpoint saves, and
  a cancelled entry is dropped when it comes due. A timer-log delete marker
  would name one (offset, slot) entry, but a hopped message's live entry is a
  later copy, hence the set: an id leaves it once the timer has read past the
  slot where its last copy could be.

A checkpoint is taken on the reactor thread (the timer state, the timer log
written out, a copy of the 28-bytes-per-slot wheel every ``wheel_snapshot_s``)
and persisted on the executor: timer-log fsync, wheel snapshot, checkpoint file
with its fsyncs. It counts as saved (``dispatched_offset`` moves, consumed
timer-log segments go) only once that returns; meanwhile the wheel goes on
advancing, and the next checkpoint waits for this one. Only ``close()`` writes
synchronously (recovery re-chains the timer-log units written after the
snapshot it finds).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import operator
import os
import shutil
import threading
from typing import Callable, Sequence

from twisted.internet import defer, task

from store import record as rec
from store.executor import SynchronousExecutor
from store.dispatch import DispatcherBase, DispatchRequest
from store.message_store import MessageStore, PutResult, PutStatus
from store.timer import EnqueueStatus, Timer, TimerCheckpoint, TimerEntry
from store.timer_ledger import TIMER_FROM, TimerLedger, consumed_mark

log = logging.getLogger("twistmq.store.timer_service")

TIMER_KIND = "TIMER_KIND"
TIMER_AT = "TIMER_AT"
TIMER_CANCEL = "TIMER_CANCEL"  # property of a SYSTEM record: the ORIGIN of the timer it cancels
ORIGIN = "ORIGIN"
CHECKPOINT_FILE = "checkpoint.json"
WHEEL_SPAN_MS = 4 * 3600 * 1000  # the wheel covers 4 hours whatever the precision; longer delays roll
DEFAULT_HOP_MS = 24 * 3600 * 1000
DEFAULT_TICK_MS = 10
MAX_CATCH_UP_MS = 600_000  # slots consumed per tick after a long stop (keeps the reactor responsive)
_INTERNAL = (TIMER_KIND, TIMER_AT, rec.QUEUES_PROPERTY)
# Put results after which the record is in the log (the ledger learnt of it when it was dispatched): not retried.
_WRITTEN = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_SLAVE_TIMEOUT, PutStatus.FLUSH_DISK_FAILED})
_DUE = operator.itemgetter(2)  # TimerEntry.deliver_at_ms
_KIND_BY_TEXT = {str(int(k)): k for k in rec.RecordKind}  # TIMER_KIND's text -> kind, without int() and Enum()


class TimerNotFound(LookupError):
    """``cancel`` was given an id that is not the offset of a TIMER record."""


class TimerService(DispatcherBase):
    """The store's delayed-delivery service; one per store, shared by MQTT and the native protocol."""

    def __init__(self, store: MessageStore, directory: str, clock, precision_ms: int = 100, *,
                 slot_count: int | None = None, checkpoint_interval_s: float = 1.0,
                 wheel_snapshot_s: float = 30.0, hop_ms: int | None = None, max_per_tick: int = 2_000,
                 executor=None, tick_ms: int | None = None) -> None:
        if getattr(store, "is_open", False):
            raise RuntimeError("TimerService must be created before store.open() (it replays as a dispatcher)")
        self.store = store
        self.directory = directory
        self._clock = clock
        self.precision_ms = precision_ms
        # Ticks finer than a slot: an entry goes out within a tick of its time, not up to a slot late.
        self.tick_ms = tick_ms or max(1, min(precision_ms, DEFAULT_TICK_MS))
        self._slot_count = slot_count or max(2, WHEEL_SPAN_MS // precision_ms)
        self._cp_interval_ms = int(checkpoint_interval_s * 1000)
        self._wheel_interval_ms = int(wheel_snapshot_s * 1000)
        if hop_ms is None:
            retention_ms = int(getattr(store.config, "retention_hours", 72.0) * 3600 * 1000)
            hop_ms = max(precision_ms, min(DEFAULT_HOP_MS, retention_ms // 2))
        self.hop_ms = hop_ms
        self.max_per_tick = max_per_tick
        self._executor = executor if executor is not None else SynchronousExecutor()
        self._saving: defer.Deferred | None = None  # a checkpoint being persisted on the executor
        self._file_lock = threading.Lock()  # the checkpoint files: a worker's save against close()
        self._files_closed = False
        self._generation = 0  # bumped when the state is rebuilt (truncation): older saves and puts are stale
        os.makedirs(directory, exist_ok=True)
        saved = self._load_checkpoint()
        self.dispatched_offset = saved[1] if saved else 0
        self._dispatched_end = self.dispatched_offset
        self.timer = self._make_timer(saved[0] if saved else None)
        # timer id (ORIGIN) -> the last slot time a copy of it can be handed out at
        self._cancelled: dict[int, int] = saved[2] if saved else {}
        self.ledger = TimerLedger(precision_ms)
        if saved:
            self.ledger.load(saved[3])
        self._backlog: collections.deque[TimerEntry] = collections.deque()
        self._firing = False  # start(): this broker delivers; else it follows (its master delivers)
        self._outstanding = 0
        self._cp_wanted = False
        now = self._now()
        self._last_cp_ms = now
        self._last_wheel_ms = now
        self._loop: task.LoopingCall | None = None
        self._closed = False
        self._drained: list[defer.Deferred] = []
        self.on_deliver: Callable[[int, int], None] | None = None  # (deliver_at_ms, now_ms), for benches
        self.enqueued = 0
        self.delivered = 0
        self.hops = 0
        self.lost = 0
        self.cancelled = 0
        self.skipped = 0  # handed out again although the log says they were delivered: not delivered twice
        self.checkpoints = 0
        self.lateness_max_ms = 0
        store.register_dispatcher(self)

    # -- files -------------------------------------------------------------------------------

    def _make_timer(self, cp: TimerCheckpoint | None) -> Timer:
        return Timer(os.path.join(self.directory, "timer"), cp, slot_count=self._slot_count,
                     precision_ms=self.precision_ms)

    def _load_checkpoint(self) -> tuple[TimerCheckpoint, int, dict[int, int], dict] | None:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        try:
            with open(path) as f:
                data = json.load(f)
            cancelled = {int(k): int(v) for k, v in data.get("cancelled", {}).items()}  # absent before cancel
            return TimerCheckpoint(**data["timer"]), int(data["dispatched_offset"]), cancelled, data
        except FileNotFoundError:
            return None

    def _save_checkpoint(self, cp: TimerCheckpoint, dispatched: int, cancelled: dict[int, int],
                         ledger: dict) -> None:
        path = os.path.join(self.directory, CHECKPOINT_FILE)
        tmp = path + ".tmp"
        body = json.dumps({"timer": json.loads(cp.to_json()), "dispatched_offset": dispatched,
                           "cancelled": {str(k): v for k, v in cancelled.items()}, **ledger}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- dispatcher --------------------------------------------------------------------------

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """Enqueue every TIMER record (idempotent: offsets already enqueued are ignored); note every copy a record
        consumes (``TIMER_FROM``), whoever wrote it."""
        if self._closed:
            return None  # not advancing dispatched_end: a restart replays them
        now = self._now()
        timer = self.timer
        timer_kind, system_kind = rec.RecordKind.TIMER, rec.RecordKind.SYSTEM  # looked up once, not per record
        for r in requests:
            props = r.properties
            kind = r.kind
            if props:
                if TIMER_FROM in props:
                    self._consumed(r)
                elif ORIGIN in props and kind != timer_kind:
                    self._consumed_before_marks(r, now)
            if kind != timer_kind and kind != system_kind:
                continue  # what nearly every record is: nothing for the timer
            if kind == timer_kind:
                try:
                    at = int(r.properties[TIMER_AT])
                except (KeyError, ValueError):
                    log.error("timer_record_unusable offset=%d properties=%r", r.offset, r.properties)
                else:
                    status = timer.enqueue(min(at, r.store_ts + self.hop_ms), r.offset, r.size, r.topic, now)
                    if status is not EnqueueStatus.DUPLICATE:
                        self.enqueued += 1
            elif TIMER_CANCEL in r.properties:
                self._apply_cancel(r)
        if requests:
            last = requests[-1]
            self._dispatched_end = last.offset + last.size
        return None

    def _consumed(self, r: DispatchRequest) -> None:
        if not self.ledger.consumed(r.properties[TIMER_FROM], self.timer.read_time_ms):
            log.error("timer_from_unusable offset=%d value=%r", r.offset, r.properties[TIMER_FROM])

    def _consumed_before_marks(self, r: DispatchRequest, now: int) -> None:
        """A delivery written before deliveries named their copy (an upgraded data directory): it names its timer's
        first copy (``ORIGIN``), which is the copy it consumed unless the timer hopped. That copy was due by ``hop_ms``
        after it was written, so before ``hop_ms`` from now."""
        copy = _as_int(r.properties[ORIGIN])
        if copy is not None:
            read = self.timer.read_time_ms
            self.ledger.consumed_copy(copy, max(read or 0, now) + self.hop_ms)

    def reset(self) -> None:
        """The log lost records the timer had seen: start empty and re-enqueue the whole log.

        Exact all the same: the replay finds every copy's consuming record too
        (``store.timer_ledger``), so only what the log still owes comes out.
        """
        log.warning("timer_reset directory=%s", self.directory)
        with self._file_lock:  # a checkpoint being saved lands first; one not started yet is dropped
            self._generation += 1
            self.timer.log.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            os.makedirs(self.directory, exist_ok=True)
        self.timer = self._make_timer(None)
        self.dispatched_offset = self._dispatched_end = 0
        self._backlog.clear()
        self._cancelled.clear()
        self.ledger.clear()
        self._saving = None  # a save in flight belongs to the state that went
        self._cp_wanted = True

    def truncate_to(self, cl_offset: int) -> None:
        """The log was cut to end at ``cl_offset``: roll the timer state back to what that log says.

        The saved checkpoint is taken back if it saw nothing past the cut (the
        store then replays the log from its ``dispatched_offset`` to the cut);
        otherwise everything is rebuilt from the log. Either way the copies whose
        delivery was cut are owed again, and those delivered below the cut are
        not. Puts and saves in flight from before belong to a state that is gone.
        """
        if self._closed or self._dispatched_end <= cl_offset:
            return  # nothing past the cut was seen (closed: the next start replays from its checkpoint, or rebuilds)
        with self._file_lock:
            saved = self._load_checkpoint()
            if saved is None or saved[1] > cl_offset:
                saved = None
            else:
                self._generation += 1
                self.timer.log.close()
        if saved is None:
            self.reset()
            return
        cp, dispatched, cancelled, data = saved
        self.timer = self._make_timer(cp)  # cuts the timer log back to the checkpoint and re-chains the wheel
        self.dispatched_offset = self._dispatched_end = dispatched
        self._cancelled = cancelled
        self.ledger.load(data)
        self._backlog.clear()
        self._saving = None
        self._cp_wanted = True
        log.warning("timer_rolled_back cut=%d checkpoint_dispatched=%d read_time=%s pending=%d", cl_offset,
                    dispatched, cp.read_time_ms, len(self.ledger.pending))

    # -- scheduling --------------------------------------------------------------------------

    def schedule(self, message: rec.Message, deliver_at_ms: int) -> defer.Deferred:
        """Park ``message`` until ``deliver_at_ms``; fires with the PutResult of its TIMER record."""
        if message.kind == rec.RecordKind.TIMER:
            return defer.succeed(PutResult(PutStatus.MESSAGE_ILLEGAL, reason="cannot schedule a TIMER record"))
        props = dict(message.properties)
        props.pop(TIMER_FROM, None)  # the timer's own bookkeeping: it would consume another copy
        props[TIMER_KIND] = str(int(message.kind))
        props[TIMER_AT] = str(int(deliver_at_ms))
        timer_message = rec.Message(message.topic, message.body, rec.RecordKind.TIMER, message.qos, message.retain,
                                    message.client_id, message.born_ts, props)
        return self.store.put(timer_message)

    def cancel(self, timer_id: int) -> defer.Deferred:
        """Cancel the message scheduled as ``timer_id`` (its TIMER record's offset, or a hopped copy's).

        Appends a SYSTEM record, so a replay after a crash cancels it again.
        Fires once that record is written, with True if the timer had not come
        due (it will not be delivered) and False if it had (it was probably
        delivered); fails with TimerNotFound if ``timer_id`` is no TIMER record,
        and with RuntimeError if the cancellation could not be stored.
        """
        log_ = self.store.commit_log
        if not log_.min_offset <= timer_id < log_.max_offset:
            return defer.fail(TimerNotFound(f"no timer {timer_id}: outside the commit log"))
        return self.store.read(timer_id).addCallbacks(self._append_cancel, self._not_a_timer,
                                                      errbackArgs=(timer_id,))

    @staticmethod
    def _not_a_timer(failure, timer_id: int):
        if failure.check(TimerNotFound):
            return failure
        raise TimerNotFound(f"no timer {timer_id}: {failure.getErrorMessage()}")

    def _append_cancel(self, record: rec.Record) -> defer.Deferred:
        if record.kind != rec.RecordKind.TIMER or TIMER_AT not in record.properties:
            raise TimerNotFound(f"no timer {record.offset}: the record there is of kind {record.kind.name}")
        origin = int(record.properties.get(ORIGIN, record.offset))
        props = {TIMER_CANCEL: str(origin), TIMER_AT: record.properties[TIMER_AT]}
        marker = rec.Message(record.topic, b"", rec.RecordKind.SYSTEM, 0, False, "", self._now(), props)

        def stored(result: PutResult) -> bool:
            if result.status is not PutStatus.PUT_OK:
                raise RuntimeError(f"timer cancel not stored: {result.status.value} {result.reason}".strip())
            return origin in self._cancelled

        return self.store.put(marker).addCallback(stored)

    def _apply_cancel(self, r: DispatchRequest) -> None:
        """A cancel record (live or replayed): drop the timer's copies from now on, unless it came due already."""
        try:
            origin = int(r.properties[TIMER_CANCEL])
            at = int(r.properties[TIMER_AT])
        except (KeyError, ValueError):
            log.error("timer_cancel_unusable offset=%d properties=%r", r.offset, r.properties)
            return
        read = self._read_floor()
        last_slot = -(-at // self.precision_ms) * self.precision_ms
        if read is not None and last_slot < read:
            return  # its slot was consumed: handed out already
        self._cancelled[origin] = last_slot
        for e in [e for e in self.ledger.pending.values() if self._origin(e) == origin]:
            del self.ledger.pending[e.cl_offset]  # a follower held it for its master, who drops it
        log.info("timer_cancelled timer_id=%d deliver_at=%d", origin, at)

    def _read_floor(self) -> int | None:
        """The first slot time whose entries may still come out: the wheel's read pointer, or earlier for entries
        read ahead (backlog) or held for the master (pending)."""
        read = self.timer.read_time_ms
        p = self.precision_ms
        if self._backlog:  # read ahead: the slot of the first entry not handed out yet is still open
            head = -(-self._backlog[0].deliver_at_ms // p) * p
            read = head if read is None else min(read, head)
        first = self.ledger.first_slot()
        if first is not None:
            read = first if read is None else min(read, first)
        return read

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Deliver: advance the timer every ``tick_ms`` on the injected clock and put what comes due.

        A broker whose store refuses writes (a slave) only follows even so, and
        delivers once its store takes writes: then the entries it held for its
        master (``ledger.pending``) go first.
        """
        self._firing = True
        self._run()

    def pause(self) -> None:
        """Follow (the broker became a slave: its master delivers): the wheel goes on, what comes due waits in
        ``ledger.pending`` until the log shows it delivered; ``start`` delivers what is still pending."""
        self._firing = False
        self._run()

    def _run(self) -> None:
        if self._loop is not None or self._closed:
            return
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self._clock
        self._loop.start(self.tick_ms / 1000.0, now=True)

    @property
    def firing(self) -> bool:
        """Whether this service delivers now: asked to, and its store takes writes (a slave's log stays a copy)."""
        return self._firing and not getattr(self.store, "replica_of", "")

    def _now(self) -> int:
        return int(self._clock.seconds() * 1000)

    def _tick(self) -> None:
        try:
            self._tick_inner()
        except Exception:  # noqa: BLE001 - the timer must keep running; the error is logged
            log.exception("timer_tick_failed")

    def _tick_inner(self) -> None:
        now = self._now()
        # Wanting a checkpoint holds the wheel back until the handed-out entries are stored; while the
        # last one is still being saved (fsyncs on the executor) it could not be taken anyway, so the
        # wheel goes on: otherwise every slow fsync would make every entry due meanwhile late.
        if not self._cp_wanted and self._saving is None and now - self._last_cp_ms >= self._cp_interval_ms:
            self._cp_wanted = True
        # A checkpoint that can be taken now is taken first, so a tick that comes a checkpoint interval
        # or more after the last one (a busy or stalled reactor) still advances the wheel.
        self._maybe_checkpoint()
        backlog = self._backlog
        if not self.firing:
            self._follow(now)
            return
        if self.ledger.pending:  # just promoted: what came due while following is delivered first
            backlog.extend(self._merge(self.ledger.take_pending(), backlog))
        if not backlog and not self._cp_wanted:
            # Read the slot whose window holds ``now`` ahead of its end: its entries are handed out one
            # tick after each comes due (ticks run every ``tick_ms``), not when the whole slot is due.
            backlog.extend(self.timer.advance(self._target(now), self.max_per_tick))
        n = 0
        limit = self.max_per_tick
        while backlog and n < limit and backlog[0].deliver_at_ms <= now:
            self._deliver(backlog.popleft(), now)
            n += 1
        self._maybe_checkpoint()

    def _target(self, now: int) -> int:
        read = self.timer.read_time_ms
        ahead = now + self.precision_ms - 1
        return ahead if read is None else min(ahead, read + MAX_CATCH_UP_MS)

    def _follow(self, now: int) -> None:
        """A follower's tick: the wheel advances as its master's does, what comes due waits for the log."""
        if self._backlog:  # it was delivering a moment ago: what it had not put yet is owed still
            self._hold(self._backlog)
            self._backlog.clear()
        if not self._cp_wanted:
            self._hold(self.timer.advance(self._target(now), self.max_per_tick))
        self._maybe_checkpoint()

    def _hold(self, entries) -> None:
        """Keep due entries owed (``ledger.pending``) but those a cancellation drops, as the master does."""
        if self._cancelled:
            entries = [e for e in entries if self._origin(e) not in self._cancelled]
        self.ledger.follow(entries)

    def _origin(self, entry: TimerEntry) -> int | None:
        """The timer id (``ORIGIN``) of an entry's copy; read back only while cancellations are live."""
        try:
            props = self.store.commit_log.read(entry.cl_offset, entry.cl_size).properties
        except Exception:  # noqa: BLE001 - gone or unreadable: the master could not deliver it either
            return entry.cl_offset
        return _as_int(props.get(ORIGIN, str(entry.cl_offset)))

    @staticmethod
    def _merge(first: list[TimerEntry], backlog) -> list[TimerEntry]:
        """``first`` and what the backlog held, in due-time order (the backlog is emptied)."""
        merged = sorted([*first, *backlog], key=_DUE)
        backlog.clear()
        return merged

    def _deliver(self, entry: TimerEntry, now: int) -> None:
        if self.ledger.take_done(entry.cl_offset):  # the log holds its delivery (or hop) already
            self.skipped += 1
            return
        try:
            record = self.store.commit_log.read(entry.cl_offset, entry.cl_size)
        except Exception as exc:  # noqa: BLE001 - retention deleted it, or the disk failed: nothing to put
            self.lost += 1
            log.error("timer_record_unreadable offset=%d error=%s", entry.cl_offset, exc)
            return
        props = record.properties  # decode gave this record its own dict: changed in place, not copied
        try:
            at = int(props[TIMER_AT])
            kind = _KIND_BY_TEXT[props[TIMER_KIND]]
        except (KeyError, ValueError):
            self.lost += 1
            log.error("timer_record_unusable offset=%d", entry.cl_offset)
            return
        props.setdefault(ORIGIN, str(entry.cl_offset))
        mark = props[TIMER_FROM] = consumed_mark(entry)  # the log says which copy this consumes (replicas, replays)
        if self._cancelled and _as_int(props[ORIGIN]) in self._cancelled:
            self.cancelled += 1
            log.info("timer_dropped_cancelled timer_id=%s offset=%d", props[ORIGIN], entry.cl_offset)
            return
        if at > now + self.precision_ms:  # a hop: park a fresh copy, keeping the message's identity
            self.hops += 1
            props.pop(rec.QUEUES_PROPERTY, None)
            message = rec.Message(record.topic, record.body, rec.RecordKind.TIMER, record.qos, record.retain,
                                  record.client_id, record.born_ts, props)
        else:
            for key in _INTERNAL:
                props.pop(key, None)
            message = rec.Message(record.topic, record.body, kind, record.qos, record.retain, record.client_id,
                                  record.born_ts, props)
        self._outstanding += 1
        self.ledger.inflight.add(mark)
        # submit, not put: a tick hands out hundreds of entries and a Deferred each was a fair share of
        # the tick; they are all appended in the store's next write, one batch for the tick.
        self.store.submit(message, functools.partial(self._put_done, entry, at, message.kind, mark,
                                                     self._generation))

    def _put_done(self, entry: TimerEntry, at: int, kind, mark: str, generation: int, result: PutResult) -> None:
        self._outstanding -= 1
        if generation != self._generation:  # the state was rebuilt from the log since: it knows what is owed
            self._after_put()
            return
        self.ledger.inflight.discard(mark)
        if result.status in _WRITTEN:
            if result.status is not PutStatus.PUT_OK:  # in the log all the same: the ledger counts it delivered
                log.warning("timer_put_unconfirmed offset=%d status=%s", entry.cl_offset, result.status.name)
            if kind != rec.RecordKind.TIMER:
                self.delivered += 1
                now = self._now()
                self.lateness_max_ms = max(self.lateness_max_ms, now - at)
                if self.on_deliver is not None:
                    self.on_deliver(at, now)
        elif result.status is PutStatus.MESSAGE_ILLEGAL:
            self.lost += 1
            log.error("timer_message_illegal offset=%d reason=%s", entry.cl_offset, result.reason)
        else:  # the store could not take it now: retry, and hold checkpoints back until it does
            log.warning("timer_put_retry offset=%d status=%s", entry.cl_offset, result.status.name)
            if self.firing:
                self._backlog.appendleft(entry)
            else:  # no longer master: owed, unless the log shows its delivery
                self._hold((entry,))
        self._after_put()

    def _after_put(self) -> None:
        if self._outstanding == 0:
            if not self._closed:
                self._maybe_checkpoint()
            drained, self._drained = self._drained, []
            for d in drained:
                d.callback(None)

    def _maybe_checkpoint(self) -> None:
        if (self._cp_wanted and not self._backlog and self._outstanding == 0 and not self._closed
                and self._saving is None):
            self.checkpoint()

    def checkpoint(self, wheel: bool | None = None) -> TimerCheckpoint:
        """Take the timer state now and persist it on the executor (callers must hold the barrier:
        nothing handed out and unput, and no other checkpoint being saved)."""
        now = self._now()
        cp = self.timer.checkpoint()
        if wheel is None:
            wheel = now - self._last_wheel_ms >= self._wheel_interval_ms
        if wheel:
            self._last_wheel_ms = now
        self._collect()
        persist_timer = self.timer.flush_later(wheel)
        dispatched = self._dispatched_end
        cancelled = dict(self._cancelled)  # the executor writes this copy: the reactor goes on changing the set
        ledger = self.ledger.to_json()
        self._cp_wanted = False
        self._last_cp_ms = now
        gen = self._generation
        d = self._saving = self._executor.submit(self._persist, persist_timer, cp, dispatched, cancelled, ledger,
                                                 gen)
        d.addCallbacks(self._saved, self._save_failed, callbackArgs=(cp, dispatched, gen), errbackArgs=(gen,))
        return cp

    def _collect(self) -> None:
        """Forget cancellations and consumed copies that can no longer meet an entry the wheel hands out."""
        floor = self._read_floor()
        if floor is None:
            return
        for timer_id in [t for t, slot in self._cancelled.items() if slot < floor]:
            del self._cancelled[timer_id]  # every copy of these was handed out (and dropped) already
        if self.timer.read_time_ms is not None:
            self.ledger.collect(self.timer.read_time_ms)

    def _persist(self, persist_timer: Callable[[], None], cp: TimerCheckpoint, dispatched: int,
                 cancelled: dict[int, int], ledger: dict, generation: int) -> None:
        """On the executor: fsync the timer log, write the wheel if taken, then the checkpoint file."""
        with self._file_lock:
            if self._files_closed or generation != self._generation:  # a newer checkpoint, or a rebuilt state
                return
            persist_timer()
            self._save_checkpoint(cp, dispatched, cancelled, ledger)

    def _saved(self, _, cp: TimerCheckpoint, dispatched: int, generation: int) -> None:
        if generation != self._generation:
            return  # truncate_to() set up the state (and _saving) anew
        self._saving = None
        self.dispatched_offset = max(self.dispatched_offset, dispatched)
        if not self._closed:
            self.timer.checkpoint_saved(cp)
        self.checkpoints += 1

    def _save_failed(self, failure, generation: int) -> None:
        if generation != self._generation:
            return
        self._saving = None
        self._cp_wanted = True  # the next tick tries again
        log.error("timer_checkpoint_failed error=%s", failure.getErrorMessage())

    def _wait_drained(self) -> defer.Deferred:
        if self._outstanding == 0:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._drained.append(d)
        return d

    def stop(self) -> defer.Deferred:
        """Stop advancing, wait for delivery puts in flight, save a final checkpoint and close the timer."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._closed:
            return defer.succeed(None)
        return self._wait_drained().addCallback(lambda _: self._wait_saved()).addCallback(lambda _: self.close())

    def _wait_saved(self) -> defer.Deferred:
        """Fires once the checkpoint being persisted (if any) is saved or has failed."""
        if self._saving is None:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._saving.addBoth(lambda result: (d.callback(None), result)[1])
        return d

    def close(self) -> None:
        """Synchronous close (the store calls it from ``close()``): final checkpoint if safe, then flush."""
        if self._closed:
            return
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._backlog:  # handed out, not put: saved as owed, so a restart delivers them (once)
            self._hold(self._backlog)
            self._backlog.clear()
        if self._outstanding == 0:
            self._checkpoint_now()
        self._closed = True
        with self._file_lock:  # a checkpoint a worker has not saved yet is older: it must not land after
            self._files_closed = True
        self.timer.close()

    def _checkpoint_now(self) -> None:
        """The final checkpoint, written here and now (shutdown: blocking is fine)."""
        cp = self.timer.checkpoint()
        dispatched = self._dispatched_end
        self._collect()
        with self._file_lock:
            self.timer.flush()
            self._save_checkpoint(cp, dispatched, dict(self._cancelled), self.ledger.to_json())
            self._files_closed = True
        self.dispatched_offset = dispatched
        self.timer.checkpoint_saved(cp)
        self.checkpoints += 1

    # -- observation --------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Counters for metrics."""
        return {
            "timer_enqueued_total": float(self.enqueued),
            "timer_delivered_total": float(self.delivered),
            "timer_hops_total": float(self.hops),
            "timer_lost_total": float(self.lost),
            "timer_cancelled_total": float(self.cancelled),
            "timer_skipped_delivered_total": float(self.skipped),
            "timer_pending": float(len(self.ledger.pending)),
            "timer_backlog": float(len(self._backlog)),
            "timer_puts_in_flight": float(self._outstanding),
            "timer_checkpoints_total": float(self.checkpoints),
            "timer_lateness_max_ms": float(self.lateness_max_ms),
        }


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
