"""The store's front door: ``put`` a message, ``get`` from a queue, hear about new entries.

A put is encoded, appended to the commit log and dispatched to every
registered dispatcher in the same reactor tick as the other puts of that tick
(one ``os.write``, one index batch). The queue index (served by the
``lightqueue`` package, registered through ``set_queue_index``) names each
message's target queues before the append, so the record carries them and a
replay after a crash rebuilds exactly the same index. Every call returns a
Deferred, so the same interface can later sit behind an RPC.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections import Counter, deque
from typing import Callable, Container, Mapping, Sequence

from twisted.internet import defer, task

from store import record as rec
from store.api import AppendResult, AppendStatus, IndexedAppend
from store.commit_log import CommitLog, CommitLogError
from store.config import StoreConfig
from store.dispatch import DispatchRequest, Dispatcher, QueueIndex, QueueMessage, StoreObserver
from store.flush import make_flush_policy
from store.ha_epochs import EpochFile
from store.ha_gate import ReplicationGate
from store.replica_writes import ReplicaWrites
from store.retention import Retention

log = logging.getLogger("twistmq.store")

MAX_GET_COUNT = 1000
MAX_GET_BYTES = 4 * 1024 * 1024
REPLAY_CHUNK = 2000
# Appends kept in memory for readers of the log's tail (no read, no decode). A fan-in subscriber can run tens
# of thousands of messages behind a burst of publishers, so the cache is large; but a full collector pass walks
# every kept entry, so it is bounded (docs/tuning.md has the measurements behind both numbers).
RECENT_RECORDS = 262144
RECENT_BYTES = 64 << 20  # ... and at most this much memory: record bytes plus Python's cost per entry
RECENT_MAX_RECORD = 8192  # larger records are read back from the log: copying them dominates anyway
RECENT_ENTRY_COST = 400  # bytes of Python objects behind one kept append, beside its record bytes
RECENT_BYTES_COST = 120  # ... and behind one kept as its written bytes (a bytes object, its dict and deque slots)


PutStatus = AppendStatus  # the outcome of a put is the store interface's (store.api), under RocketMQ's name


PutResult = AppendResult  # what a put resolves to: the store interface's result (store.api)


class StoreLockedError(RuntimeError):
    """Another process holds the data directory."""


class MessageStore(ReplicaWrites):
    """Commit log + dispatchers + flush policy + retention, driven by one clock."""

    def __init__(self, data_dir: str, config: StoreConfig, clock, executor,
                 observer: StoreObserver | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self._clock = clock
        self._executor = executor
        self.commit_log = CommitLog(os.path.join(data_dir, "commitlog"), config.segment_size)
        self.flush_policy = make_flush_policy(config.flush, self.commit_log.sync, executor, clock,
                                              config.flush_interval_ms)
        self._dispatchers: list[Dispatcher] = []
        self._index: QueueIndex | None = None
        self._listeners: list[Callable[[set[str]], None]] = []
        self._append_listeners: list[Callable[[int], None]] = []
        self._truncate_listeners: list[Callable[[int], None]] = []
        self.epochs = EpochFile(data_dir)
        """Which master epoch wrote which stretch of the log (broker groups; ``store.ha_epochs``)."""
        self._observer = observer or StoreObserver()
        self._pending: list[tuple[Sequence[rec.Message], object]] = []  # (messages, whom to answer)
        self._drain_call = None
        self._loops: list[task.LoopingCall] = []
        self._index_flush: defer.Deferred | None = None  # the index flush running on the executor
        self._lock_fd: int | None = None
        os.makedirs(data_dir, exist_ok=True)
        self._lock_data_dir()  # first, before any index opens files in the directory
        self.is_open = False
        self.puts = 0
        self.bytes_in = 0
        self._recent: dict[int, rec.Record | bytes] = {}  # commit-log offset -> a recent append (or its bytes)
        self._recent_order: deque[int] = deque()  # the offsets kept in _recent, oldest first
        self._recent_bytes = 0
        self._telling = True  # whether the last answer to a submitter that asked told it where its records went
        self.retention = Retention(self, clock)
        self.visible_offset = 0
        """Commit-log offset below which records are durable under the flush policy: reads stop there."""
        self._truncations = 0  # cuts so far: a write acknowledged after a later cut must not move visible_offset
        self.gate = ReplicationGate()
        """A master's hold on reads, notifies and acks until its group has the records (``store.ha_gate``)."""
        self.replica_of = ""
        """Set on a slave (its master's address): the log takes only its master's records, every put is refused."""

    # -- wiring ------------------------------------------------------------------

    def register_dispatcher(self, dispatcher: Dispatcher) -> None:
        """Add a consumer of appended records (call before ``open``)."""
        self._dispatchers.append(dispatcher)

    def set_queue_index(self, index: QueueIndex) -> None:
        """Install the index that resolves target queues and serves reads; it is also a dispatcher."""
        self._index = index
        self.register_dispatcher(index)

    def add_listener(self, callback: Callable[[set[str]], None]) -> None:
        """``callback(queue_names)`` runs after each tick's dispatch with the queues that gained entries."""
        self._listeners.append(callback)

    def add_truncate_listener(self, callback: Callable[[int], None]) -> None:
        """``callback(offset)`` after ``truncate`` cut the log to ``offset``: state kept outside the dispatchers
        (the native engine's cursors and prefetched messages) forgets what pointed past it."""
        self._truncate_listeners.append(callback)

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        """``callback(log_end)`` runs after every append is written (replication sends what is new)."""
        self._append_listeners.append(callback)

    # -- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        """Lock the data dir, recover the log and replay it into every dispatcher."""
        self.commit_log.open()
        self.epochs.load()
        self.epochs.truncate_suffix(self.commit_log.max_offset)  # recovery may have cut the tail
        self.epochs.truncate_prefix(self.commit_log.min_offset)
        self._replay()
        self.visible_offset = self.commit_log.max_offset  # what recovery found is on disk
        self.flush_policy.start()
        for interval, fn in ((self.config.retention_check_s, self._retention_tick),
                             (self.config.index_flush_s, self._flush_index)):
            loop = task.LoopingCall(fn)
            loop.clock = self._clock
            loop.start(interval, now=False)
            self._loops.append(loop)
        self.is_open = True

    def _lock_data_dir(self) -> None:
        path = os.path.join(self.data_dir, "LOCK")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                holder = open(path).read().strip() or "?"
                raise StoreLockedError(
                    f"data dir {self.data_dir} is in use by another process (pid {holder})") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _replay(self) -> None:
        """Feed each dispatcher the records it has not made durable yet."""
        end = self.commit_log.max_offset
        starts = []
        for d in self._dispatchers:
            start = d.dispatched_offset
            if start > end or start < self.commit_log.min_offset and start != 0:
                log.warning("index_rebuild dispatcher=%s checkpoint=%d log=[%d,%d)",
                            type(d).__name__, start, self.commit_log.min_offset, end)
                d.reset()
                start = 0
            starts.append(max(start, self.commit_log.min_offset))
        if not starts or min(starts) >= end:
            return
        begin = min(starts)
        for d in self._dispatchers:
            d.begin_replay(end)
        count = 0
        chunk: list[DispatchRequest] = []
        for r in self.commit_log.iterate(begin, end):
            chunk.append(DispatchRequest(r.offset, r.size, r.store_ts, r.kind, r.topic, r.queues,
                                         dict(r.properties), r.retain, len(r.body)))
            if len(chunk) >= REPLAY_CHUNK:
                self._replay_chunk(chunk, starts)
                count += len(chunk)
                chunk = []
        if chunk:
            self._replay_chunk(chunk, starts)
            count += len(chunk)
        log.info("dispatch_replayed from=%d to=%d records=%d", begin, end, count)

    def _replay_chunk(self, chunk: list[DispatchRequest], starts: list[int]) -> None:
        for d, start in zip(self._dispatchers, starts):
            todo = [r for r in chunk if r.offset >= start] if chunk[0].offset < start else chunk
            if todo:
                d.dispatch(todo)

    def close(self) -> defer.Deferred:
        """Finish pending puts, fsync, close indexes and release the data dir."""
        if not self.is_open:
            return defer.succeed(None)
        self._drain()
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops = []
        self.is_open = False
        waits = [self.flush_policy.stop()]
        if self._index_flush is not None:
            waits.append(self._index_flush)  # an index cannot close under its own flush
        d = defer.DeferredList(waits, consumeErrors=True)

        def finish(_):
            for disp in self._dispatchers:
                disp.close()
            self.commit_log.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

        return d.addBoth(lambda r: finish(r))

    # -- writing -----------------------------------------------------------------

    def put(self, message: rec.Message) -> defer.Deferred:
        """Store ``message`` once; fires with a PutResult when it is acknowledged."""
        d: defer.Deferred = defer.Deferred()
        if not self.is_open or self.replica_of:
            d.callback(self._not_writable())
            return d
        self._pending.append(((message,), d))
        if self._drain_call is None:
            self._drain_call = self._clock.callLater(0, self._drain)
        return d

    def submit(self, message: rec.Message, on_done: Callable[[PutResult], None]) -> None:
        """Like ``put`` without a Deferred: ``on_done(result)`` runs when it is acknowledged.

        The MQTT hot path stores one message per PUBLISH; skipping the Deferred
        and its callbacks is a measurable share of that path.
        """
        if not self.is_open or self.replica_of:
            on_done(self._not_writable())
            return
        self._pending.append(((message,), on_done))
        if self._drain_call is None:
            self._drain_call = self._clock.callLater(0, self._drain)

    def submit_batch(self, messages: Sequence[rec.Message], on_done: Callable[..., None],
                     wanted: Mapping[str, int] | None = None) -> None:
        """Like ``submit`` for many messages: ``on_done(results)`` runs once, a result per message in order.

        A proxy hands every PUBLISH of a tick over at once: the batch stays one
        unit through the append (one callback, its results made in one pass).
        With ``wanted`` (queue -> watches of it the submitter holds), ``on_done(results,
        indexed)``: ``indexed`` is an ``IndexedAppend`` without its group
        (``group`` empty) for the wanted queues the batch reached, or None when
        readers may not see the records yet (a master's confirm offset short of
        them) or it reached none. The submitter reads those entries from what it
        sent, so its watches do not make the store keep the records in memory.
        """
        if not messages or not self.is_open or self.replica_of:
            results = [self._not_writable()] * len(messages) if messages else []
            on_done(results) if wanted is None else on_done(results, None)
            return
        self._pending.append((messages, _Batch(on_done, wanted)))
        if self._drain_call is None:
            self._drain_call = self._clock.callLater(0, self._drain)

    def _not_writable(self) -> PutResult:
        if not self.is_open:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason="store is not open")
        # A slave's log must stay a copy of its master's: one record of its own would make them differ.
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=f"this broker is a slave of {self.replica_of}: "
                                                                 "writes go to the group's master")

    def put_batch(self, messages: Sequence[rec.Message]) -> defer.Deferred:
        """Store many messages in one write; fires with a list of PutResults in order."""
        return defer.gatherResults([self.put(m) for m in messages])

    def _drain(self) -> None:
        if self._drain_call is not None and self._drain_call.active():
            self._drain_call.cancel()
        self._drain_call = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            self._append_batch(batch)
        finally:
            del batch  # its messages die here, before the collector's turn
            self._observer.drained()  # the batch's objects are dead now (cluster/runtime/heap.py's TickCollector)

    def _append_batch(self, batch: list) -> None:
        started = self._clock.seconds()
        now = int(started * 1000)
        index = self._index
        resolve = index.resolve if index is not None else (lambda m: ())
        resolve_many = index.resolve_many if index is not None else (lambda ms: [() for _ in ms])
        encode = rec.encode
        encoded: list[bytes] = []
        accepted: list[rec.Message] = []
        targets: list[tuple[str, ...]] = []
        waiters: list[tuple] = []  # (waiter, first, end, refused) over ``accepted``; refused: index -> result
        encode_many = rec.encode_many
        for messages, waiter in batch:
            first = len(accepted)
            refused = None
            try:  # the whole submission at once; one refused message sends it through the loop below
                queue_sets = resolve_many(messages)
                encoded += encode_many(messages, now, queue_sets)
            except (rec.RecordError, ValueError):
                pass
            else:
                accepted += messages
                targets += queue_sets
                waiters.append((waiter, first, len(accepted), None))
                continue
            for message in messages:
                try:
                    queues = resolve(message)
                    encoded.append(encode(message, now, queues))
                except (rec.RecordError, ValueError) as exc:
                    if refused is None:
                        refused = {}
                    refused[len(accepted) - first + len(refused)] = PutResult(PutStatus.MESSAGE_ILLEGAL,
                                                                              reason=str(exc))
                    continue
                accepted.append(message)
                targets.append(queues)
            if len(accepted) == first:  # nothing of it to write: answer now
                _answer(waiter, [], refused)
            else:
                waiters.append((waiter, first, len(accepted), refused))
        if not accepted:
            return
        try:
            offsets = self.commit_log.append(encoded)
        except CommitLogError as exc:
            log.error("commitlog_append_failed messages=%d error=%s", len(accepted), exc)
            failed = PutResult(PutStatus.OS_ERROR, reason=str(exc))
            for waiter, first, end, refused in waiters:
                _answer(waiter, [failed] * (end - first), refused)
            return
        new = tuple.__new__  # DispatchRequest's own __new__ is a Python-level call per record
        requests = [
            new(DispatchRequest, (off, len(data), now, m.kind, m.topic, queues, m.properties, m.retain, len(m.body)))
            for off, data, m, queues in zip(offsets, encoded, accepted, targets)
        ]
        touched: set[str] = set()
        for disp in self._dispatchers:
            gained = disp.dispatch(requests)
            if gained:
                touched.update(gained)
        for waiter, first, end, refused in waiters:
            if type(waiter) is _Batch and waiter.wanted:
                waiter.indexed = self._indexed(waiter.wanted, requests, targets, first, end, refused, now)
        recent = self._recent
        order_append = self._recent_order.append
        Record = rec.Record
        read_soon = self._observer.read_soon
        keep: dict[tuple[str, ...], int] = {}  # asked once per distinct queue set in the tick: _KEEP_*
        kept_bytes = 0
        last_queues, k = None, _KEEP_NOTHING  # a topic's records come in runs with the very same queues tuple
        told = self._told(waiters)  # accepted index -> the told submitter's watches, where one starts
        excluding = None
        for i, (r, m) in enumerate(zip(requests, accepted)):
            if told is not None and i in told:  # another submission: its own readers differ
                excluding, keep, last_queues = told[i], {}, None
            if r.size <= RECENT_MAX_RECORD:
                queues = r.queues
                if queues is not last_queues:
                    last_queues = queues
                    k = keep.get(queues)
                    if k is None:
                        k = keep[queues] = _keep_what(read_soon, queues, excluding)
                if k == _KEEP_BYTES:
                    # Only its submitter watches (it reads them from what it sent): kept as written, at no cost
                    # but a slot, and decoded only if it reads them back after all (a lagging session).
                    recent[r.offset] = encoded[i]
                    order_append(r.offset)
                    kept_bytes += r.size + RECENT_BYTES_COST
                elif k:
                    # The Record readers get, built now: one long-lived object per kept append (the request and
                    # the message die with the tick), so the collector's full passes walk a third as many. The
                    # QUEUES bookkeeping property (replay's business) is left out: readers deliver messages.
                    recent[r.offset] = Record(r.offset, r.size, m.kind, m.qos, m.retain, now, m.born_ts or now,
                                              m.topic, m.client_id, m.properties, m.body)
                    order_append(r.offset)
                    kept_bytes += r.size + RECENT_ENTRY_COST
        self._recent_bytes += kept_bytes
        if len(recent) > RECENT_RECORDS or self._recent_bytes > RECENT_BYTES:
            self._trim_recent()
        self.puts += len(requests)
        self.bytes_in += sum(map(len, encoded))
        log_end = self.commit_log.max_offset
        for appended in self._append_listeners:
            appended(log_end)
        flushed = self.flush_policy.written(log_end)

        def acknowledge(_):
            # Readers see a record only once it is durable under the policy in force: at once under async (written
            # to the OS), after the fsync the publisher waits for under sync; before the publisher hears, so a
            # read its answer triggers finds the record.
            if log_end > self.visible_offset:
                self.visible_offset = log_end
            self._observer.appended(self._clock.seconds() - started)
            wait = self.gate.ack_wait(log_end) if self.gate.ack_wait is not None else None
            if wait is None:
                answer_ok()
            else:  # a master: its group must hold the records too (the acknowledgement policy)
                wait.addCallbacks(answer_ok, not_replicated)

        def answer_ok(_=None):
            new, ok = tuple.__new__, PutStatus.PUT_OK  # one result per message: built in one call each
            results = [new(PutResult, (ok, offset, queues, "")) for offset, queues in zip(offsets, targets)]
            shown = log_end <= self.visible_offset and self.gate.shows(log_end)
            if not shown:  # no reader may see them yet
                untold()
            elif any(type(w) is _Batch and w.wanted for w, _first, _end, _refused in waiters):
                self._telling = True
            for waiter, first, end, refused in waiters:
                _answer(waiter, results[first:end], refused)

        def untold():
            for waiter, _first, _end, _refused in waiters:
                if type(waiter) is _Batch:
                    if waiter.wanted:
                        self._telling = False
                    waiter.indexed = None

        def not_replicated(f):
            untold()
            reason = f"not replicated to the broker group in time: {f.getErrorMessage() or f.type.__name__}"
            log.warning("put_not_replicated log_end=%d messages=%d reason=%s", log_end, len(offsets), reason)
            for waiter, first, end, refused in waiters:
                _answer(waiter, [PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, off, q, reason)
                                 for off, q in zip(offsets[first:end], targets[first:end])], refused)

        def fsync_failed(f):
            untold()
            if log_end > self.visible_offset:  # refused, but written: the records after it are read past them
                self.visible_offset = log_end
            reason = f.getErrorMessage()
            for waiter, first, end, refused in waiters:
                _answer(waiter, [PutResult(PutStatus.FLUSH_DISK_FAILED, off, q, reason)
                                 for off, q in zip(offsets[first:end], targets[first:end])], refused)

        def notify(_=None):
            if touched:
                self._notify(log_end, touched)

        flushed.addCallbacks(acknowledge, fsync_failed)
        flushed.addBoth(notify)  # watchers hear of new entries once they are visible

    def _told(self, waiters: list) -> dict[int, Mapping[str, int] | None] | None:
        """Where each submission that will be told where its records went starts (accepted index -> its watches,
        whose reads it answers itself: no reason to keep its records in memory for them), and where the others
        start (-> None); None if no submission is told. Only while answers are told: a master tells a batch only
        if its confirm offset passed it by the answer, which this drain cannot know, so it goes by the last
        answer (a master alone in its group tells every one; one with slaves tells those its confirm offset passed
        when the acknowledgement policy answered: all of them under ``all_ack_in_sync_state_set``, whose
        confirm offset moves before the answers go)."""
        if not self._telling:
            return None
        told = {first: (w.wanted if type(w) is _Batch and w.indexed is not None else None)
                for w, first, _end, _refused in waiters}
        return told if any(v is not None for v in told.values()) else None

    def _indexed(self, wanted: Mapping[str, int], requests: list, targets: list, first: int, end: int,
                 refused: dict | None, now: int) -> IndexedAppend | None:
        """Where one submission's records ``first``..``end`` (of this drain) went in the ``wanted`` queues.

        Called right after the dispatch: a queue's end now is the end of this drain's run in it, so the
        submission's first entry there is that end less the entries this drain gave it from ``first`` on.
        """
        index = self._index
        if index is None:
            return None
        own = Counter(targets[first:end])  # a topic's records share one tuple: counted per distinct tuple
        mine = {q for queues in own for q in queues if q in wanted}
        if not mine:
            return None
        ends = {q: index.max_offset(q) for q in mine}
        for queues, n in Counter(targets[end:]).items():  # later submissions of this drain (usually none)
            for q in queues:
                if q in mine:
                    ends[q] -= n
        firsts = dict(ends)
        for queues, n in own.items():
            for q in queues:
                if q in mine:
                    firsts[q] -= n
        sizes = [r.size for r in requests[first:end]]
        if refused:
            for i in sorted(refused):
                sizes.insert(i, 0)
        return IndexedAppend("", now, tuple(sizes), firsts, ends)

    def _notify(self, log_end: int, touched: set[str]) -> None:
        if not self.gate.shows(log_end):
            self.gate.hold(log_end, touched)  # past the confirm offset: heard of once the group holds it
            return
        for listener in self._listeners:
            listener(touched)

    def set_confirm_offset(self, offset: int) -> None:
        """A master's confirm offset: readers see records below it only; the notifies it passed are sent."""
        released = self.gate.advance(offset)
        if released:
            for listener in self._listeners:
                listener(released)

    def open_gate(self) -> None:
        """No confirm offset any more (this broker stopped being a master): the held notifies are sent."""
        released = self.gate.open()
        if released:
            for listener in self._listeners:
                listener(released)

    @property
    def kept_in_memory(self) -> int:
        """Recent appends kept in memory for the readers waiting on their queues (``read_soon``)."""
        return len(self._recent)

    def _trim_recent(self) -> None:
        """Drop the oldest kept appends until both bounds hold again.

        A tick can add far more appends than a fixed number of drops takes away
        (a fan-in tick holds hundreds), so the drops follow the excess. Every
        kept append is a few objects the garbage collector walks on each full
        pass, which stops the reactor for the whole walk: the bounds keep that short.
        """
        recent, order = self._recent, self._recent_order
        size = self._recent_bytes
        # Oldest first from the deque: walking the dict from its front would step over every slot its
        # earlier drops left empty (CPython compacts a dict only when it grows), again on every tick.
        while order and (len(recent) > RECENT_RECORDS or size > RECENT_BYTES):
            entry = recent.pop(order.popleft(), None)
            if entry is not None:
                size -= _size(entry)
        self._recent_bytes = size

    # -- reading -----------------------------------------------------------------

    def read(self, offset: int, size: int | None = None) -> defer.Deferred:
        """The record at a commit-log offset."""
        record = self._recent.get(offset)  # a recent append: no read, no decode (but of one kept as written)
        if record is not None:
            return defer.succeed(rec.decode(record, 0, offset) if type(record) is bytes else record)
        return defer.maybeDeferred(self.commit_log.read, offset, size)

    def get(self, queue: str, offset: int, max_count: int = 32) -> defer.Deferred:
        """Up to ``max_count`` messages of ``queue`` from ``offset``, as QueueMessages.

        Reads are bounded (count and bytes) because they run on the caller's
        thread from the page cache. Entries whose records retention deleted
        are skipped.
        """
        return defer.maybeDeferred(self._get, queue, offset, max_count)

    def get_now(self, queue: str, offset: int, max_count: int = 32) -> list[QueueMessage]:
        """``get`` answered on the spot, without a Deferred (an in-process caller's hot path)."""
        return self._get(queue, offset, max_count)

    def _get(self, queue: str, offset: int, max_count: int) -> list[QueueMessage]:
        index = self._require_index()
        count = min(max_count, MAX_GET_COUNT)
        tail = index.tail_entries(queue, offset, count)  # a live reader: the queue's newest entries, in memory
        if tail is None:
            found = [(e.queue_offset, (e.cl_offset, e.size, e.store_ts)) for e in index.entries(queue, offset, count)]
        else:
            found = enumerate(tail[1], tail[0])
        out: list[QueueMessage] = []
        budget = MAX_GET_BYTES
        log_min, visible = self.commit_log.min_offset, self.visible_offset
        limit = self.gate.read_limit
        if limit is not None and limit < visible:
            visible = limit  # a master: past its confirm offset, a failover could take it back
        todo: list = []  # entries whose records are not in memory: read in contiguous runs
        new = tuple.__new__
        recent = self._recent
        for queue_offset, (cl_offset, size, store_ts) in found:
            if cl_offset < log_min:
                continue
            if cl_offset >= visible:
                break  # not durable yet under flush = sync, or not confirmed: its notify comes after
            record = recent.get(cl_offset)
            if record is None:
                todo.append((len(out), queue_offset, cl_offset, size))
                out.append(None)  # filled by _read_runs
            else:
                if type(record) is bytes:  # kept as written (a told submission's): decoded from memory
                    record = rec.decode(record, 0, cl_offset)
                out.append(new(QueueMessage, (queue_offset, record)))
            budget -= size
            if budget <= 0:
                break
        if todo:
            self._read_runs(out, todo)
        return out

    def _read_runs(self, out: list, todo: list) -> None:
        """Fill ``out`` at the indexes ``todo`` names (``(index, queue offset, commit-log offset, size)`` each):
        records that follow each other in the log come with one read (an offline drain's are all one run)."""
        new = tuple.__new__
        read_run = self.commit_log.read_run
        i, n = 0, len(todo)
        while i < n:
            start = end = todo[i][2]
            sizes = []
            j = i
            while j < n and todo[j][2] == end:
                size = todo[j][3]
                sizes.append(size)
                end += size
                j += 1
            # Without QUEUES, as a recent append is served: the reader delivers it (replay reads the log itself).
            for (k, queue_offset, _, _), record in zip(todo[i:j], read_run(start, sizes, False)):
                out[k] = new(QueueMessage, (queue_offset, record))
            i = j

    def min_offset(self, queue: str) -> defer.Deferred:
        """The oldest queue offset still readable."""
        return defer.maybeDeferred(self._require_index().min_offset, queue)

    def max_offset(self, queue: str) -> defer.Deferred:
        """The queue offset the next entry will get."""
        return defer.maybeDeferred(self._require_index().max_offset, queue)

    def add_filter(self, topic_filter: str, capped: bool = True) -> defer.Deferred:
        """Register interest in a topic filter; fires with its light queue's name (``capped``: within the
        index's bound on filter shapes)."""
        return defer.maybeDeferred(self._require_index().add_filter, topic_filter, capped)

    def remove_filter(self, topic_filter: str) -> defer.Deferred:
        """Drop one reference to a topic filter's interest."""
        return defer.maybeDeferred(self._require_index().remove_filter, topic_filter)

    def _require_index(self) -> QueueIndex:
        if self._index is None:
            raise RuntimeError("no queue index installed (see lightqueue.attach)")
        return self._index

    # -- housekeeping ------------------------------------------------------------

    def apply_retention(self) -> defer.Deferred:
        """One retention pass (``store.retention``); fires with its RetentionReport."""
        return self.retention.run()

    def _retention_tick(self) -> defer.Deferred:
        # A failed pass is logged and the loop goes on (a LoopingCall stops on an error).
        return self.apply_retention().addErrback(
            lambda f: log.error("retention_failed error=%s", f.getTraceback()))

    def log_truncated(self) -> None:
        """Retention deleted segments: every dispatcher moves past what is gone, and so do the epochs."""
        for disp in self._dispatchers:
            disp.log_truncated(self.commit_log.min_offset)
        self.epochs.truncate_prefix(self.commit_log.min_offset)

    def _forget_recent_from(self, offset: int) -> None:
        """Drop the kept appends at or past ``offset`` (a truncation: those offsets will hold other bytes)."""
        for cl_offset in [o for o in self._recent if o >= offset]:
            self._recent_bytes -= _size(self._recent.pop(cl_offset))
        self._recent_order = deque(o for o in self._recent_order if o < offset)

    def collect_idle_queues(self, owed: Container[str] = ()) -> int:
        """Delete light and topic queues nobody uses (no filter, no reader in ``owed``) and idle for a retention period."""
        if self._index is None:
            return 0
        cfg = self.config
        return self._index.collect_idle(int((self._clock.seconds() - cfg.retention_hours * 3600) * 1000), owed)

    @property
    def queue_index(self) -> QueueIndex | None:
        """The installed queue index (light queues), if any."""
        return self._index

    def drain(self) -> None:
        """Append and dispatch the puts waiting for this tick now."""
        self._drain()

    def _flush_index(self) -> defer.Deferred | None:
        """Flush the derived indexes on the executor: a RocksDB memtable flush writes and fsyncs files.

        rocksdict releases the GIL while it flushes, so the reactor goes on
        dispatching meanwhile; the indexes allow for that (``Dispatcher.flush``).
        """
        flushes = [disp.flush for disp in self._dispatchers]
        if not flushes or self._index_flush is not None:
            return None
        d = self._index_flush = self._executor.submit(_call_each, flushes)

        def done(result):
            self._index_flush = None
            return result

        d.addBoth(done)
        # A failed flush is logged and the loop goes on: the next one retries, and replay covers a crash meanwhile.
        d.addErrback(lambda f: log.error("index_flush_failed error=%s", f.getErrorMessage()))
        return d

    def size_bytes(self) -> int:
        """Bytes of commit log on disk."""
        return sum(s.size for s in self.commit_log.segments())


def _call_each(calls) -> None:
    """Run each call in order (one executor job for the whole index flush)."""
    for call in calls:
        call()


def _size(record: rec.Record | bytes) -> int:
    """Memory charged for a kept append."""
    if type(record) is bytes:
        return len(record) + RECENT_BYTES_COST
    return record.size + RECENT_ENTRY_COST


_KEEP_NOTHING, _KEEP_RECORD, _KEEP_BYTES = 0, 1, 2


def _keep_what(read_soon, queues: tuple[str, ...], excluding: Mapping[str, int] | None) -> int:
    """How the recent cache keeps an append to ``queues``: as a Record for readers waiting on one of them; as
    its bytes when only its submitter watches them (``excluding``: it reads them from what it sent, but for a
    session that falls behind); else not at all."""
    if excluding is None:
        return _KEEP_RECORD if read_soon(queues) else _KEEP_NOTHING
    if read_soon(queues, excluding):
        return _KEEP_RECORD
    return _KEEP_BYTES if any(q in excluding for q in queues) else _KEEP_NOTHING


class _Batch:
    """A ``submit_batch``'s callback: it takes the batch's results as one list."""

    __slots__ = ("on_done", "wanted", "indexed")

    def __init__(self, on_done: Callable[..., None], wanted: Mapping[str, int] | None = None) -> None:
        self.on_done = on_done
        self.wanted = wanted  # queue names whose entries the submitter wants told (``IndexedAppend``)
        self.indexed: IndexedAppend | None = None


def _answer(waiter, results: list[PutResult], refused: dict[int, PutResult] | None) -> None:
    """Give a put's Deferred, a submit's callback or a submit_batch's its results (``refused`` at their places)."""
    if refused:
        for i in sorted(refused):
            results.insert(i, refused[i])
    kind = type(waiter)
    if kind is _Batch:
        if waiter.wanted is None:
            waiter.on_done(results)
        else:
            waiter.on_done(results, waiter.indexed)
    elif kind is defer.Deferred:
        waiter.callback(results[0])
    else:
        waiter(results[0])
