"""The native queue engine: requests in, reply dicts out, on the store, a durable KV and the timer.

Storage model:

- a produce to queue ``q`` is one ``NATIVE_MESSAGE`` record (topic ``q``, body the
  data) indexed in the light queue ``%QUEUE%q``; a virtual queue's record names its
  real queues in the ``TARGETS`` property, so it is stored once and indexed in
  each; ``delay`` goes through the TimerService (one TIMER record, the real one
  when due); the expiry time is the record property ``exp`` (absolute ms, the
  same one MQTT message expiry uses) and ``retry`` the property ``retry`` (s);
- a produce to a topic is one ``MQTT_PUBLISH`` record, so MQTT subscribers get it;
- ``msg_id`` is the commit-log offset of the record the produce wrote (for a
  delayed message the TIMER record's, carried on as ``ORIGIN``);
- consumers are ``Cursor``s (``native_state.py``) keyed by (store queue, group), kept in
  a ``DurableKV`` under ``DATA_DIR/native``: ``o|queue NUL group`` -> offset and
  ``f|queue NUL group NUL msg_id`` -> in-flight entry. Every reply that reports a change
  of that state is sent after the KV batch holding it is durable.

The engine reads the store in-process: the Deferreds of ``store.get``/``read``/
``max_offset`` fire at once (``MessageStore`` serves them from the caller's
thread), which is what keeps two consumes of one tick from taking one message.
"""

from __future__ import annotations

import collections
import logging
import struct
import time
from typing import Any, Callable

from twisted.internet import defer
from twisted.python import failure

from lightqueue.names import native_queue_name, topic_queue_name
from lightqueue.topic import first_level
from lightqueue.native_state import NO_EXPIRY, Cursor, InFlight, decode_inflight, encode_inflight
from store import native_types
from store import record as rec
from store.config import NativeConfig
from store.kv import DurableKV
from store.message_store import MessageStore, PutResult, PutStatus
from store.native_types import Item, Request
from store.record import EXPIRES_AT
from store.api import Owed

log = logging.getLogger("twistmq.native")

RETRY = "retry"
TARGETS = "TARGETS"
ORIGIN = "ORIGIN"  # set by store.timer_service on a delayed message
QUEUE_GROUP = ""  # the group of plain consume/confirm on a queue: the queue's own cursor
TOPIC_GROUP = "default"  # the group when a topic consume or a pop leaves it out
PREFETCH = 32
DLQ_PREFIX = "%DLQ%"  # dead-letter queue of a POP group: %DLQ%<group> (RocketMQ's name)
DLQ_QUEUE = "dlq_queue"  # properties of a dead letter: where it came from
DLQ_MSG_ID = "dlq_msg_id"
DLQ_ATTEMPTS = "dlq_attempts"
MAX_SKIP = 1000  # expired/duplicate entries skipped per request before answering "nothing ready"
MAX_CACHED_NAMES = 65536
READ_SOON_LAG = 1000  # a cursor this close to its queue's tail reads new appends soon (keep them in memory)
_U64 = struct.Struct(">Q")
_ANSWERS_ITSELF = object()  # a _dispatch result: the request calls ``done`` itself
_STAGED = object()  # a write staged in the KV (``_after`` waits for it with the others)
_COUNTER_NAMES = {code: "requests_" + name for code, name in native_types.ACTIONS.items()}


class _AfterKV:
    """A _dispatch result: ``reply`` once the KV writes staged so far are durable."""

    __slots__ = ("reply",)

    def __init__(self, reply: dict) -> None:
        self.reply = reply


class EngineError(Exception):
    """A request that fails for a reason the client should read."""


def _now_result(d: defer.Deferred) -> Any:
    """The result of an already-fired Deferred (in-process store reads)."""
    out: list = []
    d.addBoth(out.append)
    if not out:
        raise RuntimeError("the native engine needs an in-process store (a read did not complete at once)")
    result = out[0]
    if isinstance(result, Exception) or hasattr(result, "raiseException"):
        result.raiseException()
    return result


def _msg_id(record: rec.Record) -> int:
    origin = record.properties.get(ORIGIN)
    if origin is not None:
        try:
            return int(origin)
        except ValueError:
            pass
    return record.offset


def _expire_at(record: rec.Record) -> int:
    exp = record.properties.get(EXPIRES_AT)
    try:
        return int(exp) if exp is not None else NO_EXPIRY
    except ValueError:
        return NO_EXPIRY


class NativeEngine:
    """Serves validated requests; ``handle`` never fails (errors become ``code: -1`` replies)."""

    def __init__(self, store: MessageStore, kv: DurableKV, config: NativeConfig, clock, timers=None,
                 retained_quota: Callable[[str, int], bool] | None = None) -> None:
        self.store = store
        # (topic, payload size) -> would retaining it break the retained limits? (RetainedIndex.would_exceed):
        # a produce to a topic with retain meets the quota an MQTT retained PUBLISH meets.
        self.retained_quota = retained_quota
        self.kv = kv
        self.config = config
        self._clock = clock
        self.timers = timers
        self._cursors: dict[tuple[str, str], Cursor] = {}
        self._buffers: dict[tuple[str, str], collections.deque] = {}
        self._queues: set[str] = set()  # native queue names ever produced to (durable)
        self._topics: set[str] = set()  # topic consume queues seen since start
        self._unindexed: collections.Counter = collections.Counter()
        self._expired_unread: dict[str, int] = {}  # queue nobody read yet -> queue offset counted expired up to
        self._virtual = {name: tuple(dict.fromkeys(targets)) for name, targets in config.virtual_queues.items()}
        self._started = time.time()
        self.counters = collections.Counter()
        self._qnames: dict[str, str] = {}  # native queue -> its store queue, checked once
        self._readers: dict[str, list[Cursor]] = {}  # store queue -> the cursors reading it

    def _qname(self, queue: str) -> str:
        """``native_queue_name(queue)``, built and checked once per queue (a share of a request otherwise)."""
        name = self._qnames.get(queue)
        if name is None:
            name = native_queue_name(queue)
            if len(self._qnames) >= MAX_CACHED_NAMES:
                self._qnames.clear()
            self._qnames[queue] = name
        return name

    # -- durable state ---------------------------------------------------------------------------

    def open(self) -> None:
        """Load cursors, in-flight entries and queue names from the KV."""
        for key, value in self.kv.scan(b"n|"):
            self._queues.add(key[2:].decode("utf-8"))
        for key, value in self.kv.scan(b"o|"):
            queue, group = key[2:].decode("utf-8").split("\x00", 1)
            self._cursor(queue, group).offset = _U64.unpack(value)[0]
        restored = 0
        for key, value in self.kv.scan(b"f|"):
            head, msg_id = key[2:-9], _U64.unpack(key[-8:])[0]
            queue, group = head.decode("utf-8").split("\x00", 1)
            self._cursor(queue, group).restore(decode_inflight(msg_id, value))
            restored += 1
        for name in self._virtual:
            self._queues.discard(name)
        log.info("native_state_loaded queues=%d cursors=%d inflight=%d", len(self._queues), len(self._cursors),
                 restored)

    def reload(self) -> None:
        """Forget the cursors, in-flight entries and queue names held in memory and load them from the KV again:
        a slave's KV follows its master's through replication while its memory stays as first loaded, so a
        broker that becomes master reloads before it serves (it resumes where the old master's logged positions
        were, at most ``position_log_s`` old, not where it started)."""
        self._cursors.clear()
        self._readers.clear()
        self._buffers.clear()
        self._queues.clear()
        self.open()

    @staticmethod
    def _ckey(prefix: bytes, queue: str, group: str) -> bytes:
        return prefix + f"{queue}\x00{group}".encode("utf-8")

    def _cursor(self, queue: str, group: str) -> Cursor:
        c = self._cursors.get((queue, group))
        if c is None:
            # A new group starts at the oldest message still stored (retention took what came before).
            start = _now_result(self.store.min_offset(queue))
            c = self._cursors[(queue, group)] = Cursor(queue, group, start)
            self._readers.setdefault(queue, []).append(c)
        return c

    def _max_offset(self, qname: str) -> int:
        index = self.store.queue_index
        if index is not None:  # the in-process index answers at once: no Deferred per produce
            return index.max_offset(qname)
        return _now_result(self.store.max_offset(qname))

    # The cursor writes are staged in the KV without a Deferred each: ``_after`` asks the KV once
    # for the whole request (a Deferred and its callbacks per write were a share of a consume's time).
    def _save_offset(self, c: Cursor) -> object:
        self.kv.stage(self._ckey(b"o|", c.queue, c.group), _U64.pack(c.offset))
        return _STAGED

    def _save_inflight(self, c: Cursor, e: InFlight) -> object:
        self.kv.stage(self._ckey(b"f|", c.queue, c.group) + b"\x00" + _U64.pack(e.msg_id), encode_inflight(e))
        return _STAGED

    def _drop_inflight(self, c: Cursor, msg_id: int) -> object:
        self.kv.stage(self._ckey(b"f|", c.queue, c.group) + b"\x00" + _U64.pack(msg_id), None)
        return _STAGED

    def log_truncated_to(self, cl_offset: int) -> None:
        """The log was cut back to ``cl_offset`` (a replica's handshake): forget what pointed past it.

        Prefetched messages go; a cursor past its queue's new end moves back to it
        (the queue's next entries are new records); an in-flight message whose record
        was cut is dropped (it was never confirmed by anyone who will see it again).
        """
        self._buffers.clear()
        moved = dropped = 0
        for c in self._cursors.values():
            top = self._max_offset(c.queue)
            if c.offset > top:
                c.offset = top
                self._save_offset(c)
                moved += 1
            for msg_id, e in list(c.inflight.items()):
                if e.cl_offset >= cl_offset:
                    c.ack(msg_id)
                    self._drop_inflight(c, msg_id)
                    dropped += 1
        log.warning("native_truncated cl_offset=%d cursors_moved=%d inflight_dropped=%d", cl_offset, moved, dropped)

    def reads_soon(self, queues) -> bool:
        """Store ``read_soon`` hook: a consumer close to the tail of one of ``queues`` will read the append.

        The store then keeps the append in memory, so the consume that follows
        a produce (the common native pattern) reads no disk and decodes nothing;
        a backlog nobody is close to reading stays on disk.
        """
        readers = self._readers
        for q in queues:
            cursors = readers.get(q)
            if cursors:
                tail = self._max_offset(q)
                for c in cursors:
                    if tail - c.offset <= READ_SOON_LAG:
                        return True
        return False

    def note_queues(self, names: set[str]) -> None:
        """Store listener: remember topic consume queues that gained entries (for the queue lists)."""
        for n in names:
            if n.startswith("%TOPIC%"):
                self._topics.add(n)

    # -- entry point ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._clock.seconds() * 1000)

    def handle(self, req: Request, max_data_bytes: int | None = None) -> defer.Deferred:
        """Serve one request; fires with the reply dict (echo fields included), never with a failure."""
        d: defer.Deferred = defer.Deferred()
        self.serve(req, d.callback, max_data_bytes)
        return d

    def serve(self, req: Request, done: Callable[[dict], None], max_data_bytes: int | None = None) -> None:
        """Serve one request; ``done(reply)`` runs once (maybe before this returns), never with a failure.

        ``handle`` without its Deferred: the TCP adapter's path, where a Deferred
        and its callback chain per request were a measurable share of the time.
        """
        counters = self.counters
        counters["requests"] += 1
        counters[_COUNTER_NAMES[req.action]] += 1
        try:
            reply = self._dispatch(req, max_data_bytes, done)
        except Exception:  # noqa: BLE001 - every failure becomes an error reply
            done(self._failed(failure.Failure(), req))
            return
        if reply is _ANSWERS_ITSELF:
            return
        if type(reply) is dict:
            done(self._finish(reply, req))
            return
        if type(reply) is _AfterKV:
            answer = reply.reply
            self.kv.on_durable(lambda: done(self._finish(answer, req)),
                               lambda exc: done(self._failed(failure.Failure(exc), req)))
            return
        reply.addCallbacks(self._finish, self._failed, callbackArgs=(req,), errbackArgs=(req,)).addCallback(done)

    def _finish(self, reply: dict, req: Request) -> dict:
        out = dict(req.echo)
        out.update(reply)
        if out.get("code", 0) != 0:
            self.counters["errors"] += 1
        return out

    def _failed(self, failure, req: Request) -> dict:
        self.counters["errors"] += 1
        if failure.check(EngineError):
            return native_types.error_reply(str(failure.value), req.echo)
        log.error("native_request_failed action=%s error=%s", req.name, failure.getTraceback())
        return native_types.error_reply(f"internal error: {failure.getErrorMessage()[:200]}", req.echo)

    def _dispatch(self, req: Request, max_data_bytes: int | None, done: Callable[[dict], None]):
        a = req.action
        if a == native_types.PRODUCE:
            return self._produce(req, done)
        if a in (native_types.CONSUME, native_types.POP):
            return self._consume(req, max_data_bytes)
        if a in (native_types.CONFIRM, native_types.ACK):
            return self._ack(req)
        if a == native_types.CHANGE_INVISIBLE_TIME:
            return self._change_invisible(req)
        if a == native_types.MONITOR:
            return self._monitor(req)
        if a in (native_types.QUEUE_LIST, native_types.NODE_QUEUE_LIST):
            return self._queue_list()
        if a == native_types.NODE_MONITOR:
            return self._node_monitor()
        if a == native_types.CANCEL_TIMER:
            return self._cancel_timer(req)
        raise EngineError(f"action {a} is not served")

    # -- produce -----------------------------------------------------------------------------------

    def _targets(self, queue: str) -> tuple[str, ...]:
        return self._virtual.get(queue, (queue,))

    def _size(self, queue: str) -> int:
        """Messages in a native queue not yet consumed for good: ready + in flight + being written."""
        qname = self._qname(queue)
        c = self._cursors.get((qname, QUEUE_GROUP))
        hi = self._max_offset(qname)
        if c is None:
            return hi + self._unindexed[queue]
        return max(0, hi - c.offset) + len(c.inflight) + self._unindexed[queue]

    def _produce(self, req: Request, done: Callable[[dict], None] | None = None):
        now = self.now_ms()
        queue = req.queue
        if (done is not None and queue is not None and len(req.items) == 1 and not req.items[0].delay
                and queue in self._queues and queue not in self._virtual):
            return self._produce_one(req, queue, now, done)
        if req.queue is not None:
            targets = self._targets(req.queue)
            n = len(req.items)
            for t in targets:
                size = self._size(t)
                if size + n > self.config.max_queue_size:
                    raise EngineError(f"queue {t} is full ({size} of max_size {self.config.max_queue_size})")
            waits = [self._register_queue(t) for t in targets if t not in self._queues]
            messages = [self._queue_message(req.queue, targets, item, now) for item in req.items]
            for t in targets:
                self._unindexed[t] += n
        else:
            targets, waits = (), []
            quota = self.retained_quota
            if quota is not None and any(item.retain and item.data and quota(req.topic, len(item.data))
                                         for item in req.items):
                raise EngineError(f"retaining a message on {req.topic!r} exceeds the retained quota "
                                  "(max_retained_messages, max_retained_bytes)")
            messages = [self._topic_message(req.topic, item, now) for item in req.items]
        puts = []
        for item, m in zip(req.items, messages):
            if item.delay and self.timers is not None:
                puts.append(self.timers.schedule(m, now + item.delay * 1000))
            else:
                if item.delay:
                    raise EngineError("delay is not available (no timer service)")
                puts.append(self.store.put(m))
        self.counters["produced"] += len(puts)
        if len(puts) == 1 and not waits and not targets:
            return puts[0].addCallback(lambda r: self._produced(req, [r]))
        d = puts[0].addCallback(lambda r: [r]) if len(puts) == 1 else defer.gatherResults(puts, consumeErrors=True)

        def done(results: list[PutResult]):
            for t in targets:
                self._unindexed[t] -= len(results)
                if self._unindexed[t] <= 0:
                    del self._unindexed[t]
            if not waits:
                return self._produced(req, results)
            return defer.gatherResults(waits, consumeErrors=True).addCallback(lambda _: self._produced(req, results))

        def failed(f):
            for t in targets:
                self._unindexed[t] -= len(puts)
                if self._unindexed[t] <= 0:
                    del self._unindexed[t]
            return f

        return d.addCallbacks(done, failed)

    def _produce_one(self, req: Request, queue: str, now: int, done: Callable[[dict], None]):
        """The common produce: one message to a known plain queue, answered from the store's callback."""
        size = self._size(queue)
        if size + 1 > self.config.max_queue_size:
            raise EngineError(f"queue {queue} is full ({size} of max_size {self.config.max_queue_size})")
        message = self._queue_message(queue, (queue,), req.items[0], now)
        self._unindexed[queue] += 1
        self.counters["produced"] += 1

        def stored(result: PutResult) -> None:
            left = self._unindexed[queue] - 1
            if left <= 0:
                del self._unindexed[queue]
            else:
                self._unindexed[queue] = left
            if result.status is PutStatus.PUT_OK:  # the common reply, without _produced's lists
                reply = dict(req.echo)
                reply["code"] = 0
                reply["node_id"] = self.config.node_id
                reply["msg_id"] = result.offset
                done(reply)
            else:
                done(self._finish(self._produced(req, [result]), req))

        self.store.submit(message, stored)
        return _ANSWERS_ITSELF

    def _produced(self, req: Request, results: list[PutResult]) -> dict:
        ids = [r.offset if r.status is PutStatus.PUT_OK else None for r in results]
        bad = [r for r in results if r.status is not PutStatus.PUT_OK]
        reply: dict = {"code": 0, "node_id": self.config.node_id}
        if req.batch:
            reply["msg_ids"] = ids
            reply["count"] = len(ids) - len(bad)
        elif not bad:
            reply["msg_id"] = ids[0]
        if bad:
            reply["code"] = -1
            reply["reason"] = f"not stored: {bad[0].status.value} {bad[0].reason}".strip()
        return reply

    def _register_queue(self, queue: str) -> defer.Deferred:
        self._queues.add(queue)
        return self.kv.put(b"n|" + queue.encode("utf-8"), b"")

    def _queue_message(self, queue: str, targets: tuple[str, ...], item: Item, now: int) -> rec.Message:
        props = {EXPIRES_AT: str(now + item.ttl * 1000)}
        if item.retry:
            props[RETRY] = str(item.retry)
        if targets != (queue,):
            props[TARGETS] = ",".join(targets)
        return rec.Message(queue, item.data, rec.RecordKind.NATIVE_MESSAGE, 0, False, "", now, props)

    def _topic_message(self, topic: str, item: Item, now: int) -> rec.Message:
        props = {EXPIRES_AT: str(now + item.ttl * 1000)} if item.ttl is not None else {}
        return rec.Message(topic, item.data, rec.RecordKind.MQTT_PUBLISH, item.qos, item.retain, "", now, props)

    # -- consume / pop -----------------------------------------------------------------------------

    def _source(self, req: Request) -> tuple[str, str]:
        """(store queue name, group) of a consuming request."""
        if req.queue is not None:
            if req.queue in self._virtual:
                raise EngineError(f"{req.queue} is a virtual queue: it only takes writes, "
                                  f"read its real queues {', '.join(self._virtual[req.queue])}")
            pop_family = (native_types.POP, native_types.ACK, native_types.CHANGE_INVISIBLE_TIME)
            default = TOPIC_GROUP if req.action in pop_family else QUEUE_GROUP
            return self._qname(req.queue), req.group or default
        return topic_queue_name(first_level(req.topic)), req.group or TOPIC_GROUP

    def _consume(self, req: Request, max_data_bytes: int | None) -> defer.Deferred | dict:
        qname, group = self._source(req)
        c = self._cursor(qname, group)
        now = self.now_ms()
        pop = req.action == native_types.POP
        pop_ms = req.invisible_time * 1000 if pop else None
        writes: list = []  # _STAGED KV writes and Deferreds
        expired: list[InFlight] = []
        # 1. a message in flight whose invisible time is over comes back first
        e = c.due(now, expired)
        while e is not None:
            record = self._read(e.cl_offset, e.size)
            if record is None:  # a disk limit deleted it
                self._lost_inflight(c, e)
            elif pop and e.attempts > self.config.max_reconsume:
                writes.append(self._dead_letter(c, e, record))
            else:
                break
            c.ack(e.msg_id)
            writes.append(self._drop_inflight(c, e.msg_id))
            e = c.due(now, expired)
        for x in expired:
            writes.append(self._drop_inflight(c, x.msg_id))
            self.counters["expired"] += 1
        if e is not None:
            if self._too_big(record, max_data_bytes):
                return self._after(writes, self._too_big_reply(e.msg_id, record))
            c.redeliver(e, now, pop_ms)
            writes.append(self._save_inflight(c, e))
            self.counters["redelivered"] += 1
            return self._after(writes, self._message_reply(req, e.msg_id, record, e.attempts))
        # 2. the next new message
        key = (qname, group)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = collections.deque()
        moved = False
        for _ in range(MAX_SKIP):
            while buf and buf[0].queue_offset < c.offset:
                buf.popleft()
            if not buf:
                got = self.store.get_now(qname, c.offset, PREFETCH)
                if not got:
                    break
                if got[0].queue_offset > c.offset:
                    self._gap(c, got[0].queue_offset)
                    moved = True
                buf.extend(got)
                continue
            qm = buf[0]
            record = qm.record
            msg_id = _msg_id(record)
            expire_at = _expire_at(record)
            if (expire_at != NO_EXPIRY and expire_at <= now) or c.is_inflight(msg_id):
                c.skip(qm.queue_offset)
                buf.popleft()
                moved = True
                self.counters["expired" if expire_at != NO_EXPIRY and expire_at <= now else "duplicates"] += 1
                continue
            if self._too_big(record, max_data_bytes):
                if moved:
                    writes.append(self._save_offset(c))
                return self._after(writes, self._too_big_reply(msg_id, record))
            if pop:
                invisible = pop_ms
            else:
                try:
                    invisible = int(record.properties.get(RETRY, "0")) * 1000
                except ValueError:
                    invisible = 0
            buf.popleft()
            entry = c.take(qm.queue_offset, msg_id, record.offset, record.size, expire_at, invisible, now)
            writes.append(self._save_offset(c))
            if entry is not None:
                writes.append(self._save_inflight(c, entry))
            self.counters["consumed"] += 1
            return self._after(writes, self._message_reply(req, msg_id, record, 1))
        if moved:
            writes.append(self._save_offset(c))
        return self._after(writes, {"code": 0})

    def _gap(self, c: Cursor, first_live: int) -> None:
        """Owed messages are gone (a disk limit deleted them): count, log, and resume after the gap."""
        lost = first_live - c.offset
        self.counters["gap"] += lost
        log.warning("delivery_gap queue=%s group=%r queue_offsets=[%d,%d) messages=%d",
                    c.queue, c.group, c.offset, first_live, lost)
        c.skip(first_live - 1)

    def _lost_inflight(self, c: Cursor, e: InFlight) -> None:
        self.counters["gap"] += 1
        log.warning("delivery_gap queue=%s group=%r msg_id=%d in flight, deleted by a disk limit",
                    c.queue, c.group, e.msg_id)

    def _dead_letter(self, c: Cursor, e: InFlight, record: rec.Record) -> defer.Deferred:
        """Move a message popped too often to ``%DLQ%<group>``: kept (no expiry) until someone reads it."""
        dlq = DLQ_PREFIX + c.group
        origin = c.queue[len("%QUEUE%"):] if c.queue.startswith("%QUEUE%") else c.queue
        props = {DLQ_QUEUE: origin, DLQ_MSG_ID: str(e.msg_id), DLQ_ATTEMPTS: str(e.attempts)}
        m = rec.Message(dlq, record.body, rec.RecordKind.NATIVE_MESSAGE, 0, False, "", self.now_ms(), props)
        self.counters["dead_lettered"] += 1
        log.warning("dead_letter queue=%s group=%r msg_id=%d attempts=%d to=%s", origin, c.group, e.msg_id,
                    e.attempts, dlq)
        waits = [self.store.put(m)]
        if dlq not in self._queues:
            waits.append(self._register_queue(dlq))

        def stored(results):
            if not results[0].ok:
                raise EngineError(f"dead-letter queue {dlq}: not stored: {results[0].reason}")

        return defer.gatherResults(waits, consumeErrors=True).addCallback(stored)

    def _read(self, cl_offset: int, size: int) -> rec.Record | None:
        if cl_offset < self.store.commit_log.min_offset:
            return None
        try:
            return _now_result(self.store.read(cl_offset, size))
        except Exception as exc:  # noqa: BLE001 - an unreadable record is skipped, not fatal
            log.error("native_read_failed offset=%d error=%s", cl_offset, exc)
            return None

    @staticmethod
    def _too_big(record: rec.Record, max_data_bytes: int | None) -> bool:
        return max_data_bytes is not None and len(record.body) * 4 // 3 + 4 > max_data_bytes

    @staticmethod
    def _too_big_reply(msg_id: int, record: rec.Record) -> dict:
        return {"code": -1, "msg_id": msg_id,
                "reason": f"message of {len(record.body)} bytes does not fit a UDP reply: consume it over TCP"}

    def _message_reply(self, req: Request, msg_id: int, record: rec.Record, attempts: int) -> dict:
        data, encoding = native_types.encode_data(record.body)
        reply: dict = {"code": 0, "msg_id": msg_id, "data": data}
        if encoding:
            reply["encoding"] = encoding
        if attempts > 1:
            reply["attempts"] = attempts
        if DLQ_QUEUE in record.properties:
            reply[DLQ_QUEUE] = record.properties[DLQ_QUEUE]
            reply[DLQ_MSG_ID] = int(record.properties.get(DLQ_MSG_ID, -1))
        if record.kind == rec.RecordKind.MQTT_PUBLISH:
            reply["msg_topic"] = record.topic
            reply["qos"] = record.qos
            reply["client_id"] = record.client_id
        return reply

    def _after(self, writes: list, reply: dict) -> defer.Deferred | dict | _AfterKV:
        """``reply`` once ``writes`` (staged KV writes and Deferreds) are durable."""
        if not writes:
            return reply
        deferreds = [w for w in writes if w is not _STAGED]
        if not deferreds:
            return _AfterKV(reply)
        if len(deferreds) != len(writes):
            deferreds.append(self.kv.barrier())
        return defer.gatherResults(deferreds, consumeErrors=True).addCallback(lambda _: reply)

    # -- ack / change invisible time -------------------------------------------------------------

    def _ack(self, req: Request) -> defer.Deferred:
        qname, group = self._source(req)
        c = self._cursors.get((qname, group))
        e = c.ack(req.msg_id) if c is not None else None
        if e is None:
            raise EngineError(f"msg_id {req.msg_id} is not in flight for this consumer (already confirmed, "
                              f"expired, or consumed at-most-once)")
        self.counters["confirmed"] += 1
        return self._after([self._drop_inflight(c, req.msg_id)], {"code": 0, "msg_id": req.msg_id})

    def _change_invisible(self, req: Request) -> defer.Deferred:
        qname, group = self._source(req)
        c = self._cursors.get((qname, group))
        now = self.now_ms()
        e = c.change_invisible(req.msg_id, now, req.invisible_time * 1000) if c is not None else None
        if e is None:
            raise EngineError(f"msg_id {req.msg_id} is not in flight for this consumer")
        return self._after([self._save_inflight(c, e)],
                           {"code": 0, "msg_id": req.msg_id, "visible_at": e.visible_at})

    # -- retention --------------------------------------------------------------------------------

    def owed(self):
        """Retention holder: per consumer group and queue, the lowest queue offset still owed.

        Every group that has read a queue (plain consume/confirm, a POP group, a
        topic consumer) owes from its oldest in-flight message (POP invisible
        time, ``retry``), else from its cursor; a native queue no group has read
        yet owes everything it holds. Expired messages at a cursor's head are
        skipped first (counted as expired), so a queue nobody reads holds the log
        no longer than its messages' ttl.
        """
        now = self.now_ms()
        index = self.store.queue_index
        if index is not None and self._topics:  # forget topic queues the index collected (it has them at 0)
            self._topics = {t for t in self._topics if index.max_offset(t)}
        read: set[str] = set()
        for (queue, group), c in list(self._cursors.items()):
            read.add(queue)
            if self._skip_expired_head(c, now):
                self._save_offset(c)
            low = c.offset
            for e in c.inflight.values():
                if e.queue_offset < low and not e.expired(now):
                    low = e.queue_offset
            yield Owed(f"native {queue} group {group!r}", queue, low)
        for q in self._queues:
            qname = native_queue_name(q)
            if qname not in read:
                lo = _now_result(self.store.min_offset(qname))
                probe = Cursor(qname, QUEUE_GROUP, lo)
                self._skip_expired_head(probe, now, count=False)
                counted = max(lo, self._expired_unread.get(qname, 0))  # each run sees the same head again
                if probe.offset > counted:
                    self.counters["expired"] += probe.offset - counted
                    self._expired_unread[qname] = probe.offset
                yield Owed(f"native {qname} (not read yet)", qname, probe.offset)

    def _skip_expired_head(self, c: Cursor, now: int, count: bool = True) -> bool:
        """Move ``c`` past the expired messages at its head (a bounded read); True if it moved."""
        start = c.offset
        for _ in range(MAX_SKIP // PREFETCH):
            got = _now_result(self.store.get(c.queue, c.offset, PREFETCH))
            for qm in got:
                expire_at = _expire_at(qm.record)
                if expire_at == NO_EXPIRY or expire_at > now or c.is_inflight(_msg_id(qm.record)):
                    break
                c.skip(qm.queue_offset)
                self.counters["expired"] += count
            else:
                if len(got) == PREFETCH:
                    continue
            break
        return c.offset != start

    # -- monitoring --------------------------------------------------------------------------------

    def _wait_status(self, size: int) -> int:
        mx = self.config.max_queue_size
        return 2 if size >= mx else 1 if size * 5 >= mx * 4 else 0

    def _queue_info(self, queue: str) -> dict:
        qname = native_queue_name(queue)
        hi = _now_result(self.store.max_offset(qname))
        size = self._size(queue)
        c = self._cursors.get((qname, QUEUE_GROUP))
        max_id = -1
        if hi:
            last = _now_result(self.store.get(qname, hi - 1, 1))
            if last:
                max_id = _msg_id(last[0].record)
        return {"queue": queue, "size": size, "max_size": self.config.max_queue_size, "max_id": max_id,
                "inflight": len(c.inflight) if c is not None else 0, "wait_status": self._wait_status(size)}

    def _monitor(self, req: Request) -> dict:
        if req.queue is None:
            qname = topic_queue_name(first_level(req.topic))
            c = self._cursors.get((qname, req.group or TOPIC_GROUP))
            hi = _now_result(self.store.max_offset(qname))
            size = max(0, hi - (c.offset if c is not None else 0)) + (len(c.inflight) if c is not None else 0)
            return {"code": 0, "size": size, "max_id": hi - 1, "node_id": self.config.node_id}
        if req.queue in self._virtual:
            infos = [self._queue_info(t) for t in self._virtual[req.queue]]
            size = max(i["size"] for i in infos)
            return {"code": 0, "size": size, "max_size": self.config.max_queue_size,
                    "wait_status": self._wait_status(size), "node_id": self.config.node_id, "queues": infos}
        info = self._queue_info(req.queue)
        info.pop("queue")
        info.update(code=0, node_id=self.config.node_id)
        return info

    def _cancel_timer(self, req: Request) -> defer.Deferred:
        """Cancel a delayed message by the ``msg_id`` its produce answered (its timer's id)."""
        if self.timers is None:
            raise EngineError("delay is not available (no timer service)")

        def missing(failure):
            failure.trap(LookupError)  # the timer service's TimerNotFound
            raise EngineError(str(failure.value))

        return self.timers.cancel(req.msg_id).addCallbacks(
            lambda cancelled: {"code": 0, "msg_id": req.msg_id, "cancelled": bool(cancelled)}, missing)

    def _queue_list(self) -> dict:
        queues = [self._queue_info(q) for q in sorted(self._queues)]
        topics = sorted(t[len("%TOPIC%"):] for t in self._topics)
        return {"code": 0, "node_id": self.config.node_id, "queues": queues,
                "virtual_queues": {k: list(v) for k, v in sorted(self._virtual.items())}, "topics": topics}

    def _node_monitor(self) -> dict:
        inflight = sum(len(c.inflight) for c in self._cursors.values())
        return {"code": 0, "node_id": self.config.node_id, "queue_count": len(self._queues),
                "consumer_count": len(self._cursors), "inflight": inflight,
                "trans_id": self.store.commit_log.max_offset, "uptime_s": int(time.time() - self._started),
                "requests": self.counters["requests"], "max_size": self.config.max_queue_size}

    def stats(self) -> dict[str, float]:
        """Counters for metrics."""
        out = {f"native_{k}_total": float(v) for k, v in self.counters.items()}
        out["native_queues"] = float(len(self._queues))
        out["native_cursors"] = float(len(self._cursors))
        out["native_inflight"] = float(sum(len(c.inflight) for c in self._cursors.values()))
        return out
