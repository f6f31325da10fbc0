"""The light-queue index: queue entries in RocksDB (WAL off), derived from the commit log.

Layout (all integers big-endian)::

    column family "entries":  key = queue_id (u64) | queue_offset (u64) of the run's first entry
                              value = a run of 1 to RUN_ENTRIES entries at consecutive queue offsets,
                                      each cl_offset (u64) | size (u32) | store_ts (u64)
                              b"\xff" * 17 -> dispatched commit-log offset (u64), sorting after every entry
    column family "meta":     b"q" | queue_id (u64) -> min (u64) | max (u64) | last_ts (u64) | name (utf-8)
                              b"checkpoint"         -> dispatched commit-log offset (u64)

A dispatch writes each queue's new entries as runs (one RocksDB key per queue per
tick, not one per entry: the per-key cost was the largest share of the MQTT
fan-in path); replay writes runs of one. Readers find the run holding an offset
with ``seek_for_prev``. Each dispatch tick is one WriteBatch that also carries the new checkpoint, into
both column families. With the WAL off, each family keeps some prefix of those
batches after a crash, and the manual flush (``flush``) runs on a worker thread
while the reactor goes on dispatching, so after a crash either family may be
ahead of the other. Replay starts from the smaller of the two checkpoints;
queue state whose meta lags or leads its entries is checked against the last
entry on disk on first touch during replay, so a replayed record is indexed
exactly once, at the queue offset it had. (A data directory from before the
entries checkpoint existed replays from the meta checkpoint.)

Reads at the end of a queue (a live subscriber) are served from memory: a queue
that has been read keeps its newest entries (its tail, bounded per queue and in
the number of queues) as they are dispatched, so the subscriber's reads of
what just arrived cost no RocksDB lookup. RocksDB stays the truth; the tail is
a copy of its newest keys, dropped whenever the index changes other than by
appending (replay, retention, garbage collection, reset). A tail holds each
entry as the packed value its run in RocksDB got (the same bytes object): no
Python object per entry for the collector to walk while it waits to be read.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from array import array
from typing import Container, Iterator, Sequence

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from lightqueue.names import LMQ_PREFIX, TOPIC_PREFIX, lmq_name, native_queue_name, topic_queue_name
from lightqueue.topic_trie import TopicTrie
from store import record as rec
from store.dispatch import DispatcherBase, DispatchRequest, QueueEntry
from store.message_store import MessageStore

log = logging.getLogger("twistmq.lightqueue")

_KEY = struct.Struct(">QQ")
_VALUE = struct.Struct(">QIQ")
_META = struct.Struct(">QQQ")
_U64 = struct.Struct(">Q")
_CHECKPOINT = b"checkpoint"
_ENTRIES_CHECKPOINT = b"\xff" * 17  # longer than any entry key: sorts after all of them, no queue range holds it
RESOLVE_CACHE_SIZE = 65536
TAIL_ENTRIES = 1024  # newest entries kept in memory per queue that is read, at least (half go when it is full)
TAIL_QUEUES = 128    # queues with a tail at most (the oldest goes first)
# Entries kept across all tails (~45 MB at ~170 B each): a queue may keep up to its share of this, so the few
# queues of a fan-in keep as long a tail as the store's recent appends (a subscriber tens of thousands of
# messages behind a burst still reads from memory); at worst max(this, TAIL_QUEUES * TAIL_ENTRIES) entries.
TAIL_BUDGET = 262144
RUN_ENTRIES = 256  # entries of one queue in one RocksDB value at most (a dispatch writes a run per queue)
ENTRIES_WRITE_BUFFER = 4 << 20  # bytes of light-queue entries held in memory before a flush


class LightQueueIndex(DispatcherBase):
    """Queues, their entries and the topic-filter interest that decides what gets indexed."""

    def __init__(self, path: str, max_filter_shapes: int = 0, max_topic_queues: int = 0) -> None:
        self.path = path
        self._open_db()
        self.trie = TopicTrie(max_filter_shapes)
        self.max_topic_queues = max_topic_queues  # 0: no cap
        self.topic_queues = 0  # topic consume queues known
        self.topic_queues_refused = 0  # publishes to a new first level not indexed for the cap
        self._promised: set[str] = set()  # topic queues resolved puts will create (see _topic_queue_allowed)
        self._resolved: dict[str, tuple[str, ...]] = {}  # topic -> target queues
        self._ids: dict[str, int] = {}
        self._names: list[str | None] = []
        self._min = array("q")
        self._max = array("q")
        self._last_ts = array("q")
        self.dispatched_offset = 0
        self._replay_bound = 0  # records below this offset may already be indexed (see module doc)
        self._verified: set[int] = set()
        self._replay_last_cl: dict[int, int] = {}
        self._tails: dict[int, _Tail] = {}  # qid -> the newest entries of a queue that readers read
        self._load()

    def _open_db(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.create_missing_column_families(True)
        opts.set_atomic_flush(True)
        entries_opts = Options(raw_mode=True)
        # Small memtables: an offline subscriber's backlog goes to disk, not to the broker's RSS.
        entries_opts.set_write_buffer_size(ENTRIES_WRITE_BUFFER)
        entries_opts.set_max_write_buffer_number(2)
        self._db = Rdict(self.path, opts, column_families={
            "meta": Options(raw_mode=True), "entries": entries_opts})
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._entries_cf = self._db.get_column_family_handle("entries")
        self._meta = self._db.get_column_family("meta")
        self._entries = self._db.get_column_family("entries")
        self._wo = WriteOptions()
        self._wo.disable_wal = True  # derived data: the commit log is the source of truth

    def _load(self) -> None:
        raw = self._meta.get(_CHECKPOINT)
        self.dispatched_offset = _U64.unpack(raw)[0] if raw else 0
        raw = self._entries.get(_ENTRIES_CHECKPOINT)
        if raw is not None:  # the family that is behind bounds what is durable
            self.dispatched_offset = min(self.dispatched_offset, _U64.unpack(raw)[0])
        for key, value in self._meta.items(from_key=b"q"):
            if not key.startswith(b"q"):
                break
            (qid,) = _U64.unpack_from(key, 1)
            lo, hi, ts = _META.unpack_from(value, 0)
            self._register(value[_META.size:].decode("utf-8"), qid, lo, hi, ts)
        log.info("lightqueue_loaded queues=%d checkpoint=%d", len(self._ids), self.dispatched_offset)

    def _register(self, name: str, qid: int, lo: int, hi: int, ts: int) -> None:
        while len(self._names) <= qid:
            self._names.append(None)
            self._min.append(0)
            self._max.append(0)
            self._last_ts.append(0)
        self._names[qid] = name
        self._ids[name] = qid
        if name.startswith(TOPIC_PREFIX):
            self.topic_queues += 1
            self._promised.discard(name)
        self._min[qid], self._max[qid], self._last_ts[qid] = lo, hi, ts

    # -- interest and resolution -------------------------------------------------------

    def add_filter(self, topic_filter: str, capped: bool = True) -> str:
        """Count one more subscriber of ``topic_filter``; create its light queue on first use (``capped``: a
        new filter may not pass the trie's shape bound)."""
        name = lmq_name(topic_filter)
        if self.trie.add(topic_filter, capped):
            self._resolved.clear()
        if name not in self._ids:
            self._create(name)
        return name

    def remove_filter(self, topic_filter: str) -> None:
        """Count one subscriber fewer; the queue stays until garbage collection."""
        if self.trie.remove(topic_filter):
            self._resolved.clear()

    def resolve(self, message: rec.Message) -> tuple[str, ...]:
        """The queues ``message`` goes to: its topic queue and one light queue per matching filter."""
        if message.kind == rec.RecordKind.MQTT_PUBLISH:
            # Devices publish to the same topics over and over: cache until the filter set changes.
            queues = self._resolved.get(message.topic)
            if queues is None:
                if len(self._resolved) >= RESOLVE_CACHE_SIZE:
                    self._resolved.clear()
                matches = self.trie.match(message.topic)
                topic_queue = topic_queue_name(message.topic)
                if self._topic_queue_allowed(topic_queue):
                    queues = (topic_queue, *[lmq_name(f) for f in matches])
                    self._resolved[message.topic] = queues
                else:
                    # Past the cap a new first level is not indexed for native topic consumers (MQTT delivery
                    # goes on): counted, logged; not cached, so it is indexed once collection makes room.
                    queues = tuple(lmq_name(f) for f in matches)
                    self._refused_topic_queue(topic_queue)
            return queues
        if message.kind == rec.RecordKind.NATIVE_MESSAGE:
            explicit = message.properties.get("TARGETS")
            if explicit:  # virtual queues: the native layer names the real queues
                return tuple(native_queue_name(q) for q in explicit.split(","))
            return (native_queue_name(message.topic),)
        return ()

    def _topic_queue_allowed(self, name: str) -> bool:
        """Whether ``name`` has or may get a topic queue under ``max_topic_queues``.

        A put resolves before its tick dispatches (creates) anything, so queues
        promised to resolved puts count against the cap until they exist.
        """
        cap = self.max_topic_queues
        if not cap or name in self._ids or name in self._promised:
            return True
        if self.topic_queues + len(self._promised) >= cap:
            return False
        self._promised.add(name)
        return True

    def _refused_topic_queue(self, name: str) -> None:
        self.topic_queues_refused += 1
        count = self.topic_queues_refused
        if count & (count - 1) == 0:  # 1st, 2nd, 4th, ...: a flood logs a few lines, not one per publish
            log.warning("topic_queue_refused queue=%s topic_queues=%d max_topic_queues=%d refused_total=%d "
                        "(the publish is stored and delivered to MQTT subscribers; native topic consumers of "
                        "this first level do not see it)", name, self.topic_queues, self.max_topic_queues,
                        count)

    def resolve_many(self, messages: Sequence[rec.Message]) -> list[tuple[str, ...]]:
        """``resolve`` of each message: a run of publishes to one topic object is resolved once."""
        out: list[tuple[str, ...]] = []
        append = out.append
        publish = rec.RecordKind.MQTT_PUBLISH
        topic = queues = None
        for m in messages:
            if m.topic is topic and m.kind is publish:
                append(queues)
                continue
            resolved = self.resolve(m)
            if m.kind is publish:
                topic, queues = m.topic, resolved
            append(resolved)
        return out

    # -- dispatch -----------------------------------------------------------------------

    def _create(self, name: str) -> int:
        qid = len(self._names)
        self._register(name, qid, 0, 0, 0)
        self._verified.add(qid)  # new this run: nothing of it can be in RocksDB
        self._meta.put(b"q" + _U64.pack(qid), _META.pack(0, 0, 0) + name.encode("utf-8"), self._wo)
        return qid

    def dispatch(self, requests: Sequence[DispatchRequest]) -> set[str]:
        """Append one entry per (record, queue) in a single WriteBatch; return the queues touched."""
        wb = WriteBatch(raw_mode=True)
        wb.set_default_column_family(self._entries_cf)
        end = self.dispatched_offset
        if requests:
            last = requests[-1]
            end = last.offset + last.size
            if requests[0].offset < self._replay_bound:
                touched = self._index_replayed(requests, wb)
            else:
                touched = self._index_appended(requests, wb)
        else:
            touched = {}
        mx, last_ts, tails = self._max, self._last_ts, self._tails
        if tails:
            cap = max(TAIL_ENTRIES, TAIL_BUDGET // len(tails))
            for qid in touched:
                tail = tails.get(qid)
                if tail is not None and len(tail.values) > cap:
                    tail.trim(cap // 2)
        for qid in touched:
            wb.put(b"q" + _U64.pack(qid),
                   _META.pack(self._min[qid], mx[qid], last_ts[qid]) + self._names[qid].encode("utf-8"),
                   self._meta_cf)
        checkpoint = _U64.pack(end)
        wb.put(_CHECKPOINT, checkpoint, self._meta_cf)
        wb.put(_ENTRIES_CHECKPOINT, checkpoint, self._entries_cf)
        self._db.write(wb, self._wo)
        self.dispatched_offset = end
        return set(touched.values())

    def _index_appended(self, requests: Sequence[DispatchRequest], wb: WriteBatch) -> dict[int, str]:
        """Index new appends as one run per queue: none can be indexed already, and they extend each queue's end.

        Records of one topic share their queues, so the queue ids, runs and tails are
        looked up once per distinct ``queues`` tuple (the resolver hands out one tuple
        per topic), and each record's entry value is packed once for all its queues.
        """
        mx, last_ts = self._max, self._last_ts
        pack_value = _VALUE.pack
        plans: dict[tuple[str, ...], list] = {}  # queues -> [(run values, tail values or None, first offset)]
        runs: dict[int, tuple[int, list[bytes]]] = {}  # qid -> (queue offset of its run's first entry, values)
        newest: dict[tuple[str, ...], int] = {}  # queues -> store_ts of the newest record sent to them
        for req in requests:
            queues = req.queues
            plan = plans.get(queues)
            if plan is None:
                plan = plans[queues] = self._plan(queues, runs)
            newest[queues] = req.store_ts
            value = pack_value(req.offset, req.size, req.store_ts)
            for run, tail, first in plan:
                run.append(value)
                if tail is not None:
                    tail.append(value)
        put, pack_key = wb.put, _KEY.pack
        for qid, (first, run) in runs.items():
            for i in range(0, len(run), RUN_ENTRIES):
                put(pack_key(qid, first + i), b"".join(run[i:i + RUN_ENTRIES]))
            mx[qid] = first + len(run)
        for queues, ts in newest.items():
            for qid in self._qids(queues):
                if ts > last_ts[qid]:
                    last_ts[qid] = ts
        names = self._names
        return {qid: names[qid] for qid in runs}

    def _qids(self, queues: tuple[str, ...]) -> list[int]:
        ids = self._ids
        return [ids[name] for name in queues]

    def _plan(self, queues: tuple[str, ...], runs: dict[int, tuple[int, list[bytes]]]) -> list:
        ids, tails = self._ids, self._tails
        plan = []
        for name in queues:
            qid = ids.get(name)
            if qid is None:
                qid = self._create(name)
            run = runs.get(qid)
            if run is None:
                run = runs[qid] = (self._max[qid], [])
            tail = tails.get(qid)
            plan.append((run[1], None if tail is None else tail.values, run[0]))
        return plan

    def _index_replayed(self, requests: Sequence[DispatchRequest], wb: WriteBatch) -> dict[int, str]:
        """Index records replayed after a restart, skipping those a queue already holds."""
        touched: dict[int, str] = {}
        ids, mx, last_ts = self._ids, self._max, self._last_ts
        pack_key, pack_value = _KEY.pack, _VALUE.pack
        bound = self._replay_bound
        tails = self._tails
        for req in requests:
            value = pack_value(req.offset, req.size, req.store_ts)
            for name in req.queues:
                qid = ids.get(name)
                if qid is None:
                    qid = self._create(name)
                if req.offset < bound and self._already_indexed(qid, req.offset):
                    continue
                off = mx[qid]
                wb.put(pack_key(qid, off), value)
                mx[qid] = off + 1
                last_ts[qid] = req.store_ts
                touched[qid] = name
                tail = tails.get(qid)
                if tail is not None:
                    tail.values.append(value)
        return touched

    def _already_indexed(self, qid: int, cl_offset: int) -> bool:
        """During replay: is the record at ``cl_offset`` already in this queue?"""
        if qid not in self._verified:
            self._verified.add(qid)
            last = self._last_entry(qid)
            if last is not None:
                # The entries on disk are the truth: meta may lag them or lead them (see module doc).
                qoff, last_cl = last
                self._max[qid] = qoff + 1
                self._replay_last_cl[qid] = last_cl
        last_cl = self._replay_last_cl.get(qid)
        if last_cl is None:
            return False
        if cl_offset <= last_cl:
            return True
        del self._replay_last_cl[qid]
        return False

    def _last_entry(self, qid: int) -> tuple[int, int] | None:
        """(queue offset, commit-log offset) of the last entry of ``qid`` in RocksDB; None if it has none."""
        it = self._entries.iter()
        try:
            it.seek_for_prev(_KEY.pack(qid, (1 << 64) - 1))
            if not it.valid():
                return None
            kq, first = _run_key(it.key())
            if kq != qid:
                return None
            v = it.value()
            n = len(v) // _VALUE.size
            return first + n - 1, _VALUE.unpack_from(v, (n - 1) * _VALUE.size)[0]
        finally:
            del it

    def begin_replay(self, log_end: int) -> None:
        """Records below ``log_end`` may already be indexed: check before appending."""
        self._replay_bound = log_end
        self._tails.clear()  # replay may move a queue's end back to what is on disk

    def reset(self) -> None:
        """Drop the whole index (the log no longer holds what it points to)."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open_db()
        self._ids.clear()
        self._names.clear()
        self.topic_queues = 0
        self._promised.clear()
        for arr in (self._min, self._max, self._last_ts):
            del arr[:]
        self._verified.clear()
        self._replay_last_cl.clear()
        self._resolved.clear()
        self._tails.clear()
        self.dispatched_offset = 0
        for f in list(self.trie):
            self._create(lmq_name(f))

    # -- reading --------------------------------------------------------------------------

    def entries(self, queue: str, offset: int, max_count: int) -> list[QueueEntry]:
        """Up to ``max_count`` entries of ``queue`` from ``offset`` (an unknown queue is empty)."""
        qid = self._ids.get(queue)
        if qid is None or max_count <= 0:
            return []
        lo, hi = self._min[qid], self._max[qid]
        start = max(offset, lo)
        tail = self._tails.get(qid)
        if tail is None and hi - start <= max_count:  # a reader at the end: it will want what comes next
            self._start_tail(qid, hi)
        if start >= hi:
            return []
        stop = min(hi, start + max_count)
        if tail is not None and stop > tail.base:
            if start >= tail.base:
                return _unpacked(start, tail.values[start - tail.base:stop - tail.base])
            # The part below the tail from RocksDB, the rest from memory.
            return self._read_entries(qid, start, tail.base) + _unpacked(tail.base, tail.values[:stop - tail.base])
        return self._read_entries(qid, start, stop)

    def tail_entries(self, queue: str, offset: int, max_count: int) -> tuple[int, Iterator[tuple[int, int, int]]] | None:
        """Up to ``max_count`` entries of ``queue`` from ``offset`` when its tail holds them all, else None.

        As ``(queue offset of the first, an iterator of each one's (commit-log
        offset, size, store time))``: a live reader's read, with no object per
        entry made to be thrown away.
        """
        qid = self._ids.get(queue)
        if qid is None:
            return None
        tail = self._tails.get(qid)
        if tail is None:
            return None
        start = max(offset, self._min[qid])
        if start < tail.base:
            return None
        stop = min(self._max[qid], start + max_count)
        return start, _VALUE.iter_unpack(b"".join(tail.values[start - tail.base:stop - tail.base]))

    def _start_tail(self, qid: int, hi: int) -> None:
        """Keep ``qid``'s entries from ``hi`` on in memory as they are dispatched."""
        tails = self._tails
        if len(tails) >= TAIL_QUEUES:
            del tails[next(iter(tails))]
        tails[qid] = _Tail(hi)

    def _read_entries(self, qid: int, start: int, stop: int) -> list[QueueEntry]:
        """Entries ``start`` up to ``stop`` of ``qid`` from RocksDB, walking its runs (missing ones skipped)."""
        out: list[QueueEntry] = []
        unpack = _VALUE.unpack_from
        it = self._entries.iter()
        try:
            it.seek_for_prev(_KEY.pack(qid, start))  # the run holding ``start`` begins at or before it
            if not it.valid() or _run_key(it.key())[0] != qid:
                it.seek(_KEY.pack(qid, start))
            while it.valid():
                kq, first = _run_key(it.key())
                if kq != qid or first >= stop:
                    break
                v = it.value()
                for i in range(max(0, start - first), min(len(v) // _VALUE.size, stop - first)):
                    out.append(QueueEntry(first + i, *unpack(v, i * _VALUE.size)))
                it.next()
        finally:
            del it
        return out

    def _run_at(self, qid: int, offset: int) -> tuple[int, bytes] | None:
        """(first queue offset, values) of the run of ``qid`` holding ``offset``; None if no run does."""
        it = self._entries.iter()
        try:
            it.seek_for_prev(_KEY.pack(qid, offset))
            if not it.valid():
                return None
            kq, first = _run_key(it.key())
            v = it.value()
            if kq != qid or offset >= first + len(v) // _VALUE.size:
                return None
            return first, v
        finally:
            del it

    def min_offset(self, queue: str) -> int:
        qid = self._ids.get(queue)
        return 0 if qid is None else self._min[qid]

    def max_offset(self, queue: str) -> int:
        qid = self._ids.get(queue)
        return 0 if qid is None else self._max[qid]

    def queue_names(self) -> list[str]:
        """Every queue currently known."""
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    # -- housekeeping -----------------------------------------------------------------------

    def log_truncated(self, min_cl_offset: int) -> None:
        """Retention deleted log below ``min_cl_offset``: move each queue's minimum past it."""
        wb = WriteBatch(raw_mode=True)
        changed = 0
        for name, qid in self._ids.items():
            lo, hi = self._min[qid], self._max[qid]
            new_lo = self._first_at_or_after(qid, lo, hi, min_cl_offset)
            if new_lo != lo:
                self._tails.pop(qid, None)
                # Whole runs below new_lo go; a run that holds new_lo stays (its older entries are below min).
                run = self._run_at(qid, new_lo)
                wb.delete_range(_KEY.pack(qid, 0), _KEY.pack(qid, new_lo if run is None else run[0]),
                                self._entries_cf)
                self._min[qid] = new_lo
                wb.put(b"q" + _U64.pack(qid), _META.pack(new_lo, hi, self._last_ts[qid]) + name.encode("utf-8"),
                       self._meta_cf)
                changed += 1
        if changed:
            self._db.write(wb, self._wo)
        log.info("lightqueue_retention min_cl_offset=%d queues_moved=%d", min_cl_offset, changed)

    def truncate_to(self, cl_offset: int) -> None:
        """The log now ends at ``cl_offset`` (a replica's handshake cut it): every entry at or past it goes.

        Each queue's end moves back to its first entry at or past the cut; the
        run holding that entry is rewritten with the entries before it, later
        runs are deleted. One WriteBatch with the new checkpoint, like a dispatch.
        """
        wb = WriteBatch(raw_mode=True)
        changed = 0
        for name, qid in self._ids.items():
            lo, hi = self._min[qid], self._max[qid]
            new_hi = self._first_at_or_after(qid, lo, hi, cl_offset)
            if new_hi == hi:
                continue
            self._tails.pop(qid, None)
            run = self._run_at(qid, new_hi)
            first = new_hi if run is None else run[0]
            wb.delete_range(_KEY.pack(qid, first), _KEY.pack(qid + 1, 0), self._entries_cf)
            if run is not None and first < new_hi:
                wb.put(_KEY.pack(qid, first), run[1][:(new_hi - first) * _VALUE.size], self._entries_cf)
            self._max[qid] = new_hi
            wb.put(b"q" + _U64.pack(qid), _META.pack(lo, new_hi, self._last_ts[qid]) + name.encode("utf-8"),
                   self._meta_cf)
            changed += 1
        self.dispatched_offset = min(self.dispatched_offset, cl_offset)
        self._replay_bound = min(self._replay_bound, cl_offset)
        self._replay_last_cl = {q: c for q, c in self._replay_last_cl.items() if c < cl_offset}
        checkpoint = _U64.pack(self.dispatched_offset)
        wb.put(_CHECKPOINT, checkpoint, self._meta_cf)
        wb.put(_ENTRIES_CHECKPOINT, checkpoint, self._entries_cf)
        self._db.write(wb, self._wo)
        log.warning("lightqueue_truncated cl_offset=%d queues_cut=%d", cl_offset, changed)

    def _first_at_or_after(self, qid: int, lo: int, hi: int, cl_offset: int) -> int:
        """Binary search: the first queue offset whose entry is at or after ``cl_offset``."""
        while lo < hi:
            mid = (lo + hi) // 2
            run = self._run_at(qid, mid)
            if run is None or _VALUE.unpack_from(run[1], (mid - run[0]) * _VALUE.size)[0] < cl_offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def collect_idle(self, older_than_ts: int, owed: Container[str] = ()) -> int:
        """Delete queues with no interest and nothing stored since ``older_than_ts`` (ms).

        Churning client ids would otherwise leave one queue per abandoned
        filter, and made-up first levels one topic queue each. A light queue is
        kept while a filter holds it; a topic queue while a native consumer
        group reads it (``owed``: the queues retention found owed, which names
        every consumer group's queue). Native queues are kept: producers make
        them on purpose.
        """
        wb = WriteBatch(raw_mode=True)
        dead = []
        trie = self.trie
        for name, qid in self._ids.items():
            if self._last_ts[qid] >= older_than_ts:
                continue
            if name.startswith(LMQ_PREFIX):
                if name[5:] in trie:
                    continue
            elif not name.startswith(TOPIC_PREFIX) or name in owed:
                continue
            dead.append((name, qid))
        topics = 0
        for name, qid in dead:
            wb.delete_range(_KEY.pack(qid, 0), _KEY.pack(qid + 1, 0), self._entries_cf)
            wb.delete(b"q" + _U64.pack(qid), self._meta_cf)
            del self._ids[name]
            self._names[qid] = None
            self._tails.pop(qid, None)
            if name.startswith(TOPIC_PREFIX):
                topics += 1
        self._promised.clear()  # a promise whose put failed would hold its place for good otherwise
        if dead:
            self.topic_queues -= topics
            self._resolved.clear()  # a cached resolution may name a collected queue
            self._db.write(wb, self._wo)
            log.info("lightqueue_gc removed=%d topic_queues=%d", len(dead), topics)
        return len(dead)

    def drop_idle(self, name: str) -> bool:
        """Delete one light queue nobody subscribes to (the admin API's queue delete); False if it is in use."""
        qid = self._ids.get(name)
        if qid is None or not name.startswith("%LMQ%") or name[5:] in self.trie:
            return False
        wb = WriteBatch(raw_mode=True)
        wb.delete_range(_KEY.pack(qid, 0), _KEY.pack(qid + 1, 0), self._entries_cf)
        wb.delete(b"q" + _U64.pack(qid), self._meta_cf)
        self._db.write(wb, self._wo)
        del self._ids[name]
        self._names[qid] = None
        log.info("lightqueue_dropped queue=%s", name)
        return True

    def flush(self) -> None:
        """Persist memtables, entries first, then meta.

        Safe on a worker thread while the reactor dispatches (rocksdict releases
        the GIL for it): a family flushed later may run ahead of the other, which
        loading and replay allow for (module doc).
        """
        self._entries.flush(True)
        self._meta.flush(True)

    def close(self) -> None:
        """Flush and close RocksDB."""
        try:
            self.flush()
        finally:
            del self._meta, self._entries, self._meta_cf, self._entries_cf
            self._db.close()
            del self._db


def _run_key(key: bytes) -> tuple[int, int]:
    """(queue id, first queue offset) of an entries key; the checkpoint key reads as no queue's."""
    if len(key) != _KEY.size:
        return -1, 0
    return _KEY.unpack(key)


class _Tail:
    """The newest entries of one queue: ``values[i]`` is the packed entry at queue offset ``base + i``."""

    __slots__ = ("base", "values")

    def __init__(self, base: int) -> None:
        self.base = base
        self.values: list[bytes] = []  # VALUE-packed (commit-log offset, size, store time), as in RocksDB

    def trim(self, keep: int) -> None:
        """Keep the newest ``keep`` entries (half the cap: amortised, one slice per ``keep`` appends)."""
        drop = len(self.values) - keep
        del self.values[:drop]
        self.base += drop


def _unpacked(first: int, values: list[bytes]) -> list[QueueEntry]:
    """QueueEntries of consecutive packed ``values``, the first at queue offset ``first``."""
    new = tuple.__new__
    return [new(QueueEntry, (qoff, *v)) for qoff, v in enumerate(_VALUE.iter_unpack(b"".join(values)), first)]


def attach(store: MessageStore, data_dir: str | None = None) -> LightQueueIndex:
    """Create the index under ``DATA_DIR/lightqueue`` and install it in ``store``."""
    cfg = store.config
    index = LightQueueIndex(os.path.join(data_dir or store.data_dir, "lightqueue"), cfg.max_filter_shapes,
                            cfg.max_topic_queues)
    store.set_queue_index(index)
    return index
