"""Unit tests of the message store with the light-queue index: put, dispatch, get, replay, GC."""

import dataclasses
import os
import shutil

import pytest
from twisted.internet import task

import lightqueue
import lightqueue.queue_index  # monkeypatched below: imported here, not only through attach()
from store.config import StoreConfig
from store.executor import DeferredExecutor, SynchronousExecutor
from store import dispatch, message_store
from store.message_store import MessageStore, PutStatus, StoreLockedError
from store.record import Message, RecordKind

T0 = 1_800_000_000.0


def _store(path, executor=None, observer=None, **cfg):
    clock = task.Clock()
    clock.advance(T0)
    store = MessageStore(str(path), StoreConfig(segment_size=64 * 1024, **cfg), clock, executor or SynchronousExecutor(),
                         observer)
    index = lightqueue.attach(store)
    store.open()
    return store, index, clock


def _put_all(store, clock, messages):
    results = [None] * len(messages)
    for i, m in enumerate(messages):
        store.put(m).addCallback(lambda r, i=i: results.__setitem__(i, r))
    clock.advance(0)
    return [r for r in results if r is not None]


def _got(store, queue, offset=0, n=100):
    out = []
    store.get(queue, offset, n).addCallback(out.append)
    return out[0]


def test_one_tick_is_one_write_and_one_event(tmp_path):
    """Puts made in one tick are appended together and raise one merged event per queue."""
    store, index, clock = _store(tmp_path)
    store.add_filter("dev/+/temp")
    events = []
    store.add_listener(events.append)
    results = _put_all(store, clock, [Message(topic=f"dev/{i}/temp", body=b"%d" % i) for i in range(5)])
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 5
    assert events == [{"%TOPIC%dev", "%LMQ%dev/+/temp"}]
    assert [m.record.body for m in _got(store, "%LMQ%dev/+/temp")] == [b"0", b"1", b"2", b"3", b"4"]


def test_message_is_stored_once_and_indexed_per_matching_filter(tmp_path):
    """One record, one entry in each light queue whose filter matches, pointing at the same offset."""
    store, index, clock = _store(tmp_path)
    for f in ("dev/#", "dev/+/temp", "dev/1/temp", "other/#"):
        store.add_filter(f)
    (result,) = _put_all(store, clock, [Message(topic="dev/1/temp", body=b"x")])
    assert len(list(store.commit_log.iterate(0))) == 1
    assert set(result.queues) == {"%TOPIC%dev", "%LMQ%dev/#", "%LMQ%dev/+/temp", "%LMQ%dev/1/temp"}
    for q in result.queues:
        assert [m.record.offset for m in _got(store, q)] == [result.offset]
    assert _got(store, "%LMQ%other/#") == []


def test_no_filter_means_topic_queue_only(tmp_path):
    """Without interest a publish lands only in its first-level topic queue."""
    store, index, clock = _store(tmp_path)
    (result,) = _put_all(store, clock, [Message(topic="a/b", body=b"x")])
    assert result.queues == ("%TOPIC%a",)


def test_illegal_message_fails_alone(tmp_path):
    """A message that cannot be encoded gets MESSAGE_ILLEGAL; the rest of the tick is stored."""
    store, index, clock = _store(tmp_path)
    results = _put_all(store, clock, [Message(topic="a", body=b"1"), Message(topic="a", body=b"2", qos=7),
                                      Message(topic="a", body=b"3")])
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
    assert "qos" in results[1].reason
    assert [m.record.body for m in _got(store, "%TOPIC%a")] == [b"1", b"3"]


def test_illegal_message_in_a_submitted_batch_fails_alone(tmp_path):
    """One message of a submit_batch that cannot be encoded gets MESSAGE_ILLEGAL at its place; the rest are stored."""
    store, index, clock = _store(tmp_path)
    results = []
    store.submit_batch([Message(topic="a", body=b"1"), Message(topic="a", body=b"2", qos=7),
                        Message(topic="a", body=b"3")], results.extend)
    store.submit_batch([Message(topic="a", body=b"4")], results.extend)
    clock.advance(0)
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK,
                                           PutStatus.PUT_OK]
    assert [m.record.body for m in _got(store, "%TOPIC%a")] == [b"1", b"3", b"4"]


def test_sync_flush_acknowledges_after_fsync(tmp_path):
    """With flush=sync a put resolves only when the executor's fsync has run."""
    ex = DeferredExecutor()
    store, index, clock = _store(tmp_path, executor=ex, flush="sync")
    results = []
    store.put(Message(topic="a", body=b"1")).addCallback(results.append)
    clock.advance(0)
    assert results == []
    ex.run_pending()
    assert results[0].ok and store.commit_log.synced_offset == store.commit_log.max_offset


def test_get_is_bounded_and_resumes_from_offset(tmp_path):
    """get returns at most max_count messages from the given queue offset."""
    store, index, clock = _store(tmp_path)
    _put_all(store, clock, [Message(topic="q", body=b"%d" % i) for i in range(10)])
    assert [m.queue_offset for m in _got(store, "%TOPIC%q", 4, 3)] == [4, 5, 6]
    assert _got(store, "%TOPIC%q", 10, 3) == []
    assert _got(store, "%TOPIC%nope", 0, 3) == []


def test_restart_replays_from_checkpoint_without_duplicates(tmp_path):
    """Killing the index's unflushed state and replaying yields each entry exactly once."""
    store, index, clock = _store(tmp_path)
    store.add_filter("s/#")
    _put_all(store, clock, [Message(topic="s/1", body=b"a")])
    index.flush()
    _put_all(store, clock, [Message(topic="s/2", body=b"b"), Message(topic="s/3", body=b"c")])
    store.close()
    store, index, clock = _store(tmp_path)
    assert [m.record.body for m in _got(store, "%LMQ%s/#")] == [b"a", b"b", b"c"]
    assert index.max_offset("%LMQ%s/#") == 3


def test_index_ahead_of_checkpoint_is_not_duplicated(tmp_path):
    """If entries were flushed past the stored checkpoint, replay skips what is already there."""
    store, index, clock = _store(tmp_path)
    _put_all(store, clock, [Message(topic="s/%d" % i, body=b"%d" % i) for i in range(4)])
    store.close()
    # Pretend the meta checkpoint lagged: rewind it to 0 behind the index's back.
    index2 = lightqueue.LightQueueIndex(os.path.join(tmp_path, "lightqueue"))
    index2._meta.put(b"checkpoint", (0).to_bytes(8, "big"))
    index2.close()
    store, index, clock = _store(tmp_path)
    assert [m.record.body for m in _got(store, "%TOPIC%s")] == [b"0", b"1", b"2", b"3"]


@pytest.mark.parametrize("ahead", ["meta", "entries"])
def test_crash_image_with_one_index_family_flushed_ahead_rebuilds_exactly(tmp_path, ahead):
    """The index flush runs on a worker while dispatch goes on, so after a crash either RocksDB family may hold
    more ticks than the other; replay rebuilds every entry once, at the queue offset it had."""
    live = tmp_path / "live"
    store, index, clock = _store(live)
    store.add_filter("dev/+/temp")
    batch = 0

    def put_batch():
        nonlocal batch
        _put_all(store, clock, [Message(topic=f"dev/{i}/temp", body=b"%d-%d" % (batch, i)) for i in range(5)])
        batch += 1

    put_batch()
    index.flush()
    # What a worker's flush interleaved with the reactor's dispatching leaves on disk: one family as of one
    # tick, the other as of a later one (the families are private: this is what flush() does in two steps).
    first, second = (index._entries, index._meta) if ahead == "meta" else (index._meta, index._entries)
    put_batch()
    first.flush(True)
    put_batch()
    second.flush(True)
    put_batch()  # in no family's flushed state: lost with the crash
    shutil.copytree(live, tmp_path / "crash")  # the files as a kill -9 now would leave them (WAL off)
    want = [(m.queue_offset, m.record.offset) for m in _got(store, "%LMQ%dev/+/temp")]
    store, index, clock = _store(tmp_path / "crash")
    got = [(m.queue_offset, m.record.offset) for m in _got(store, "%LMQ%dev/+/temp")]
    assert got == want and len(got) == 20
    assert index.max_offset("%LMQ%dev/+/temp") == 20


def test_second_store_on_same_dir_is_refused(tmp_path):
    """Two stores on one data dir: the second gets a clear error naming the directory."""
    _store(tmp_path)
    with pytest.raises(StoreLockedError, match=str(tmp_path)):
        _store(tmp_path)


def test_retention_moves_queue_minimum(tmp_path):
    """Deleting old segments by quota moves queue minimum offsets past the deleted records."""
    store, index, clock = _store(tmp_path, disk_quota_mb=0)
    _put_all(store, clock, [Message(topic="r", body=bytes(2000)) for _ in range(100)])
    assert len(store.commit_log.segments()) > 2
    store.commit_log.delete_oldest(2, "test")
    store.log_truncated()
    lo = index.min_offset("%TOPIC%r")
    assert lo > 0
    first = _got(store, "%TOPIC%r", 0, 1)[0]
    assert first.queue_offset == lo and first.record.offset >= store.commit_log.min_offset


def test_idle_light_queues_are_collected(tmp_path):
    """A light queue with no subscriber and nothing recent is deleted; one with interest stays."""
    store, index, clock = _store(tmp_path)
    store.add_filter("gone/#")
    store.add_filter("kept/#")
    _put_all(store, clock, [Message(topic="gone/1", body=b"x"), Message(topic="kept/1", body=b"y")])
    store.remove_filter("gone/#")
    clock.advance(3600)
    removed = index.collect_idle(int(clock.seconds() * 1000) - 1000, owed={"%TOPIC%kept"})
    assert removed == 2  # the light queue and the topic queue nobody reads
    names = index.queue_names()
    assert "%LMQ%gone/#" not in names and "%LMQ%kept/#" in names
    assert "%TOPIC%gone" not in names and "%TOPIC%kept" in names


def test_topic_queues_beyond_the_cap_are_not_indexed_and_counted(tmp_path):
    """Past max_topic_queues a new first level gets no topic queue (counted); light queues still get it."""
    store, index, clock = _store(tmp_path, max_topic_queues=2)
    store.add_filter("+/x")
    _put_all(store, clock, [Message(topic=f"t{i}/x", body=b"x") for i in range(5)])
    topics = sorted(n for n in index.queue_names() if n.startswith("%TOPIC%"))
    assert topics == ["%TOPIC%t0", "%TOPIC%t1"]
    assert index.topic_queues == 2 and index.topic_queues_refused == 3
    assert len(_got(store, "%LMQ%+/x")) == 5  # MQTT subscribers lose nothing
    _put_all(store, clock, [Message(topic="t0/x", body=b"again")])  # a known first level is still indexed
    assert index.max_offset("%TOPIC%t0") == 2


def test_collected_topic_queues_make_room_under_the_cap(tmp_path):
    """An idle topic queue is collected, which lets a new first level be indexed again."""
    store, index, clock = _store(tmp_path, max_topic_queues=1)
    _put_all(store, clock, [Message(topic="old/1", body=b"x")])
    clock.advance(3600)
    assert index.collect_idle(int(clock.seconds() * 1000) - 1000) == 1
    assert index.topic_queues == 0
    _put_all(store, clock, [Message(topic="new/1", body=b"y")])
    assert [n for n in index.queue_names() if n.startswith("%TOPIC%")] == ["%TOPIC%new"]
    assert index.topic_queues_refused == 0


def test_native_messages_go_to_their_queue(tmp_path):
    """A native message lands in its named queue, or in each target of a virtual queue."""
    store, index, clock = _store(tmp_path)
    r1, r2 = _put_all(store, clock, [
        Message(topic="jobs", body=b"1", kind=RecordKind.NATIVE_MESSAGE),
        Message(topic="fan", body=b"2", kind=RecordKind.NATIVE_MESSAGE, properties={"TARGETS": "a,b"}),
    ])
    assert r1.queues == ("%QUEUE%jobs",) and r2.queues == ("%QUEUE%a", "%QUEUE%b")


def test_queue_name_with_nul_is_refused(tmp_path):
    """A hostile queue name is refused with a clear error and nothing else is lost."""
    store, index, clock = _store(tmp_path)
    results = _put_all(store, clock, [Message(topic="bad\x00q", body=b"1", kind=RecordKind.NATIVE_MESSAGE),
                                      Message(topic="good", body=b"2", kind=RecordKind.NATIVE_MESSAGE)])
    assert results[0].status is PutStatus.MESSAGE_ILLEGAL and "NUL" in results[0].reason
    assert results[1].ok


def test_recent_records_equal_what_the_log_holds(tmp_path):
    """A record served from the recent-append cache equals the one decoded from the log, but for QUEUES."""
    clock = task.Clock()
    store = MessageStore(str(tmp_path), StoreConfig(), clock, SynchronousExecutor())
    store.open()
    results = []
    store.put(Message("a/b", b"body", qos=1, retain=True, client_id="c", properties={"k": "v"})).addCallback(
        results.append)
    clock.advance(0)
    clock.advance(1)
    offset = results[0].offset
    cached = []
    store.read(offset).addCallback(cached.append)
    from_log = store.commit_log.read(offset)
    assert cached[0].properties == {"k": "v"}  # served from memory: without the QUEUES bookkeeping
    assert cached[0] == dataclasses.replace(from_log, properties={
        k: v for k, v in from_log.properties.items() if k != "QUEUES"})
    store.close()


def test_a_queue_read_from_the_log_gives_what_the_recent_appends_give(tmp_path):
    """A queue's records read back from the log carry their properties without the QUEUES bookkeeping, as the
    recent-append cache serves them: a v5 subscriber's delivery sends each one the same way, from either."""

    class NoReaders(message_store.StoreObserver):
        def read_soon(self, queues):
            return False  # an offline subscriber's backlog: read back from the log

    store, index, clock = _store(tmp_path, observer=NoReaders())
    store.add_filter("dev/+/temp")
    _put_all(store, clock, [Message(topic="dev/1/temp", body=b"a"),
                            Message(topic="dev/1/temp", body=b"b", properties={"k": "v"})])
    got = _got(store, "%LMQ%dev/+/temp")
    assert [(m.record.body, m.record.properties) for m in got] == [(b"a", {}), (b"b", {"k": "v"})]
    got[0].record.properties["x"] = "y"  # each record its own dict: the decode cache is untouched
    assert [m.record.properties for m in _got(store, "%LMQ%dev/+/temp")] == [{}, {"k": "v"}]
    store.close()


def test_recent_appends_stay_within_their_byte_bound_however_big_the_tick(tmp_path, monkeypatch):
    """Ticks of 500 appends each never leave more than RECENT_BYTES of them in memory (the garbage collector walks
    every kept append, stopping the reactor meanwhile); the newest stay and still read back."""
    monkeypatch.setattr(message_store, "RECENT_BYTES", 100_000)
    store, index, clock = _store(tmp_path)
    for tick in range(6):
        results = _put_all(store, clock, [Message(topic="t", body=b"%d-%d" % (tick, i)) for i in range(500)])
        assert store._recent_bytes <= 100_000 and len(store._recent) > 100
    assert store._recent_bytes == sum(message_store._size(e) for e in store._recent.values())
    assert results[-1].offset in store._recent
    got = []
    store.read(results[-1].offset).addCallback(got.append)
    assert got[0].body == b"5-499"


def test_index_flush_runs_on_the_executor_and_close_waits_for_it(tmp_path):
    """The periodic index flush is handed to the executor (the tick returns at once, puts go on), and
    close() closes the indexes only once that flush has finished."""
    executor = DeferredExecutor()
    store, index, clock = _store(tmp_path, executor, index_flush_s=1.0, flush_interval_ms=60_000)
    store.add_filter("s/#")
    _put_all(store, clock, [Message(topic="s/1", body=b"a")])
    executor.run_pending()
    clock.advance(1.0)
    assert len(executor.pending) == 1, "the flush is queued, not run on the reactor"
    results = _put_all(store, clock, [Message(topic="s/2", body=b"b")])
    assert [r.status for r in results] == [PutStatus.PUT_OK], "dispatching goes on while the flush waits"
    clock.advance(1.0)
    assert len(executor.pending) == 1, "no second flush while one is in flight"
    closed = []
    store.close().addCallback(closed.append)
    flush_job = next(job for job in executor.pending if job[0].__name__ == "_call_each")
    executor.pending.remove(flush_job)
    executor.run_pending()  # the commit log's final fsync
    assert closed == [], "the indexes stay open while their flush runs"
    fn, args, d = flush_job
    d.callback(fn(*args))
    assert closed == [None]
    store, index, clock = _store(tmp_path)
    assert [m.record.body for m in _got(store, "%LMQ%s/#")] == [b"a", b"b"]


def _entries_from_rocksdb(index, queue, offset, n):
    """What RocksDB alone holds for ``queue`` (the in-memory tail bypassed)."""
    qid = index._ids[queue]
    return index._read_entries(qid, offset, min(index.max_offset(queue), offset + n))


def test_a_read_queue_tail_is_served_from_memory_and_equals_rocksdb(tmp_path, monkeypatch):
    """Entries of a queue being read come from its in-memory tail, identical to RocksDB's, across trims."""
    monkeypatch.setattr(lightqueue.queue_index, "TAIL_ENTRIES", 8)
    monkeypatch.setattr(lightqueue.queue_index, "TAIL_BUDGET", 8)
    store, index, clock = _store(tmp_path)
    queue = store.queue_index.add_filter("t/+")
    _put_all(store, clock, [Message(topic="t/1", body=b"%d" % i) for i in range(5)])
    assert [e.queue_offset for e in index.entries(queue, 0, 100)] == list(range(5))  # starts the tail at 5
    reads = []
    for tick in range(6):
        _put_all(store, clock, [Message(topic="t/1", body=b"%d" % i) for i in range(3)])
        reads.append(index.entries(queue, 0, 100))  # spans RocksDB and the tail once the tail was trimmed
    assert index._tails[index._ids[queue]].base > 5, "the tail was trimmed"
    assert reads[-1] == _entries_from_rocksdb(index, queue, 0, 100)
    assert [e.queue_offset for e in reads[-1]] == list(range(23))
    tail_only = index.entries(queue, 20, 100)
    assert tail_only == _entries_from_rocksdb(index, queue, 20, 100)
    assert [m.record.body for m in _got(store, queue, 21)] == [b"1", b"2"]


def test_retention_and_collection_drop_a_queue_tail(tmp_path):
    """Retention and idle-queue collection forget a queue's tail, so reads never return deleted entries."""
    store, index, clock = _store(tmp_path, disk_quota_mb=0)
    queue = store.queue_index.add_filter("r/#")
    index.entries(queue, 0, 1)
    _put_all(store, clock, [Message(topic="r/1", body=bytes(2000)) for _ in range(100)])
    assert index._ids[queue] in index._tails
    store.commit_log.delete_oldest(2, "test")
    store.log_truncated()
    assert index._ids[queue] not in index._tails
    lo = index.min_offset(queue)
    assert lo > 0 and index.entries(queue, 0, 1)[0].queue_offset == lo


def test_submit_batch_answers_once_in_order_with_puts_of_the_same_tick(tmp_path):
    """submit_batch calls back once with a result per message in order, an illegal one failing alone in its slot."""
    store, index, clock = _store(tmp_path)
    answers, single = [], []
    store.put(Message(topic="a", body=b"0")).addCallback(single.append)
    store.submit_batch([Message(topic="a", body=b"1"), Message(topic="a", body=b"2", qos=7),
                        Message(topic="a", body=b"3")], answers.append)
    assert answers == []  # stored with the tick, not before
    clock.advance(0)
    (results,) = answers
    assert [r.status for r in results] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
    assert single[0].offset < results[0].offset < results[2].offset
    assert [m.record.body for m in _got(store, "%TOPIC%a")] == [b"0", b"1", b"3"]


def test_submit_batch_of_nothing_or_on_a_closed_store_answers_at_once(tmp_path):
    """An empty batch answers [] and a closed store answers SERVICE_NOT_AVAILABLE per message, both at once."""
    store, index, clock = _store(tmp_path)
    answers = []
    store.submit_batch([], answers.append)
    store.close()
    store.submit_batch([Message(topic="a", body=b"1")] * 2, answers.append)
    assert answers[0] == []
    assert [r.status for r in answers[1]] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2


def test_tails_share_one_budget_so_a_lone_read_queue_keeps_a_long_tail(tmp_path, monkeypatch):
    """One read queue keeps up to TAIL_BUDGET entries in memory; with two, each keeps about half."""
    monkeypatch.setattr(lightqueue.queue_index, "TAIL_ENTRIES", 4)
    monkeypatch.setattr(lightqueue.queue_index, "TAIL_BUDGET", 40)
    store, index, clock = _store(tmp_path)
    a = store.queue_index.add_filter("a/+")
    index.entries(a, 0, 100)  # a reader at the end: its tail starts
    for _ in range(5):
        _put_all(store, clock, [Message(topic="a/1", body=b"x")] * 6)
    assert len(index._tails[index._ids[a]].values) == 30, "under the budget nothing is dropped"
    b = store.queue_index.add_filter("b/+")
    index.entries(b, 0, 100)
    for _ in range(2):
        _put_all(store, clock, [Message(topic="a/1", body=b"x")] * 6 + [Message(topic="b/1", body=b"y")] * 6)
    tail_a = index._tails[index._ids[a]]
    assert len(tail_a.values) <= 20, "two tails: each within half the budget"
    assert index.entries(a, tail_a.base, 100) == _entries_from_rocksdb(index, a, tail_a.base, 100)


def test_after_drain_runs_once_per_drain_after_the_batch(tmp_path):
    """The observer's drained runs once per drain, after its messages are stored (and once more after a failed drain)."""
    calls, stores = [], []

    class Drains(dispatch.StoreObserver):
        def drained(self):
            calls.append(stores[0].puts)

    store, index, clock = _store(tmp_path, observer=Drains())
    stores.append(store)
    _put_all(store, clock, [Message(topic="a", body=b"1"), Message(topic="a", body=b"2")])
    assert calls == [2]
    clock.advance(0)
    assert calls == [2], "no drain without submissions"
    store.commit_log.close()  # the next append fails
    store.put(Message(topic="a", body=b"3"))
    clock.advance(0)
    assert calls == [2, 2]


def test_tail_entries_match_rocksdb_and_stop_at_the_tail(tmp_path):
    """tail_entries gives what RocksDB holds for a read inside the tail, and None for one reaching below it."""
    store, index, clock = _store(tmp_path)
    queue = store.queue_index.add_filter("t/+")
    _put_all(store, clock, [Message(topic="t/1", body=b"%d" % i) for i in range(5)])
    assert index.tail_entries(queue, 0, 100) is None, "nobody read it yet: no tail"
    index.entries(queue, 0, 100)  # a reader near the end: the tail starts at 5
    _put_all(store, clock, [Message(topic="t/1", body=b"%d" % i) for i in range(5, 12)])
    first, values = index.tail_entries(queue, 6, 4)
    assert [(first + i, *v) for i, v in enumerate(values)] == [tuple(e) for e in _entries_from_rocksdb(index, queue, 6, 4)]
    assert index.tail_entries(queue, 4, 100) is None, "offset 4 is below the tail"
    first, values = index.tail_entries(queue, 12, 100)
    assert (first, list(values)) == (12, [])
    assert [m.record.body for m in _got(store, queue, 5)] == [b"%d" % i for i in range(5, 12)]


def test_resolve_many_is_resolve_of_each(tmp_path):
    """resolve_many answers what resolve answers per message, across runs of a topic, other topics and kinds."""
    store, index, clock = _store(tmp_path)
    store.add_filter("a/+")
    topic = "a/1"
    messages = [Message(topic=topic, body=b"1"), Message(topic=topic, body=b"2"), Message(topic="b", body=b"3"),
                Message(topic="".join(["a", "/1"]), body=b"4"), Message(topic=topic, body=b"5"),
                Message(topic="q1", body=b"6", kind=RecordKind.NATIVE_MESSAGE), Message(topic=topic, body=b"7")]
    assert index.resolve_many(messages) == [index.resolve(m) for m in messages]
    assert index.resolve_many(messages)[0] == ("%TOPIC%a", "%LMQ%a/+")


def test_sync_flush_shows_nothing_before_the_fsync(tmp_path):
    """Under flush = sync no reader is notified of, or reads, a message before the fsync its publisher waits for."""
    executor = DeferredExecutor()
    store, index, clock = _store(tmp_path, executor, flush="sync")
    executor.run_pending()  # whatever opening the store submitted
    store.add_filter("dev/#")
    events, acked = [], []
    store.add_listener(events.append)
    store.put(Message(topic="dev/1", body=b"x")).addCallback(acked.append)
    clock.advance(0)  # the tick's drain: written, not yet fsynced
    assert (acked, events, _got(store, "%LMQ%dev/#")) == ([], [], [])
    executor.run_pending()  # the fsync
    assert [r.status for r in acked] == [PutStatus.PUT_OK]
    assert events == [{"%TOPIC%dev", "%LMQ%dev/#"}]
    assert [m.record.body for m in _got(store, "%LMQ%dev/#")] == [b"x"]
