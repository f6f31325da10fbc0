"""Light-queue entries stored as runs (one RocksDB key per queue per tick): reads, old single-entry keys, retention."""

from twisted.internet import task

import lightqueue
from lightqueue import queue_index
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore
from store.record import Message

T0 = 1_800_000_000.0


def _store(path, segment_size=1 << 20):
    clock = task.Clock()
    clock.advance(T0)
    store = MessageStore(str(path), StoreConfig(segment_size=segment_size), clock, SynchronousExecutor())
    index = lightqueue.attach(store)
    store.open()
    return store, index, clock


def _tick(store, clock, messages):
    results = []
    store.submit_batch(messages, results.extend)
    clock.advance(0)
    assert all(r.ok for r in results)
    return results


def _keys_of(index, queue):
    qid = index._ids[queue]
    return [k for k, _v in index._entries.items() if len(k) == 16 and int.from_bytes(k[:8], "big") == qid]


def _from_rocksdb(index, queue, start, stop):
    return index._read_entries(index._ids[queue], start, stop)


def test_a_tick_writes_one_key_per_run_and_any_offset_reads_back(tmp_path, monkeypatch):
    """A tick of 600 messages is 3 keys of at most 256 entries; RocksDB reads from any offset give those entries."""
    monkeypatch.setattr(queue_index, "RUN_ENTRIES", 256)
    store, index, clock = _store(tmp_path)
    queue = store.queue_index.add_filter("d/+")
    results = _tick(store, clock, [Message(topic=f"d/{i % 3}", body=b"%d" % i) for i in range(600)])
    assert len(_keys_of(index, queue)) == 3
    for start, stop in ((0, 600), (255, 257), (300, 301), (511, 600), (599, 600)):
        got = _from_rocksdb(index, queue, start, stop)
        assert [e.queue_offset for e in got] == list(range(start, stop))
        assert [e.cl_offset for e in got] == [r.offset for r in results[start:stop]]
    assert _from_rocksdb(index, queue, 600, 700) == []


def test_single_entry_keys_and_runs_read_as_one_queue(tmp_path, monkeypatch):
    """Entries stored one per key (replay, data written before runs) and runs after them read as one sequence."""
    store, index, clock = _store(tmp_path)
    queue = store.queue_index.add_filter("d/#")
    monkeypatch.setattr(queue_index, "RUN_ENTRIES", 1)
    first = _tick(store, clock, [Message(topic="d/a", body=b"%d" % i) for i in range(5)])
    monkeypatch.setattr(queue_index, "RUN_ENTRIES", 256)
    second = _tick(store, clock, [Message(topic="d/b", body=b"%d" % i) for i in range(7)])
    assert len(_keys_of(index, queue)) == 5 + 1
    got = _from_rocksdb(index, queue, 3, 12)
    assert [e.cl_offset for e in got] == [r.offset for r in (first + second)[3:12]]


def test_restart_continues_a_queue_after_the_last_entry_of_its_last_run(tmp_path):
    """After a restart the queue's end is the last entry inside its last run: nothing is indexed twice."""
    store, index, clock = _store(tmp_path)
    queue = store.queue_index.add_filter("d/#")
    _tick(store, clock, [Message(topic="d/a", body=b"%d" % i) for i in range(40)])
    store.close()
    store, index, clock = _store(tmp_path)
    store.queue_index.add_filter("d/#")  # a subscriber comes back
    assert index.max_offset(queue) == 40
    assert index._last_entry(index._ids[queue])[0] == 39
    _tick(store, clock, [Message(topic="d/a", body=b"x")])
    got = []
    store.get(queue, 0, 100).addCallback(got.extend)
    assert [m.queue_offset for m in got] == list(range(41))
    assert got[-1].record.body == b"x"


def test_retention_inside_a_run_keeps_the_entries_above_the_new_minimum(tmp_path):
    """Retention moving a queue's minimum into the middle of a run deletes only runs wholly below it."""
    store, index, clock = _store(tmp_path, segment_size=64 * 1024)
    queue = store.queue_index.add_filter("r/#")
    results = _tick(store, clock, [Message(topic="r/1", body=bytes(2000)) for _ in range(100)])
    store.commit_log.delete_oldest(1, "test")
    store.log_truncated()
    lo = index.min_offset(queue)
    assert 0 < lo < 100
    assert results[lo].offset >= store.commit_log.min_offset > results[lo - 1].offset
    got = _from_rocksdb(index, queue, lo, 100)
    assert [e.cl_offset for e in got] == [r.offset for r in results[lo:]]
    assert len(_keys_of(index, queue)) == 1  # the one run holds the new minimum: kept
