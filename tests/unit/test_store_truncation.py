"""Truncating a store to an offset (a replica's handshake) cuts the log and everything derived from it, on real
RocksDB; appending a master's records builds the same queues."""

import os

import pytest
from twisted.internet import task

import lightqueue
from lightqueue.retained_index import RetainedIndex
from store.commit_log import CommitLog, CommitLogError
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.ha_connection import decode_records
from store.message_store import MessageStore
from store.record import Message, encode

T0 = 1_800_000_000.0


def _store(path, segment_size=64 * 1024):
    clock = task.Clock()
    clock.advance(T0)
    store = MessageStore(str(path), StoreConfig(segment_size=segment_size), clock, SynchronousExecutor())
    index = lightqueue.attach(store)
    retained = RetainedIndex(os.path.join(str(path), "retained"))
    store.register_dispatcher(retained)
    store.open()
    return store, index, retained, clock


def _put_all(store, clock, messages):
    results = []
    for m in messages:
        store.put(m).addCallback(results.append)
    clock.advance(0)
    return results


def _bodies(store, queue):
    out = []
    store.get(queue, 0, 1000).addCallback(out.append)
    return [m.record.body for m in out[0]]


def test_truncate_to_the_middle_leaves_only_what_is_below(tmp_path):
    """Log, light queues, topic queues and retained index show only the records below the cut, also after a restart."""
    store, index, retained, clock = _store(tmp_path)
    store.add_filter("dev/+/t")
    first = _put_all(store, clock, [Message(topic=f"dev/{i}/t", body=b"a%d" % i, retain=True) for i in range(5)])
    cut = store.commit_log.max_offset
    _put_all(store, clock, [Message(topic=f"dev/{i}/t", body=b"b%d" % i, retain=True) for i in range(5)])
    _put_all(store, clock, [Message(topic="other", body=b"x")])
    assert _bodies(store, "%LMQ%dev/+/t")[-1] == b"b4"
    assert store.truncate(cut) > 0
    assert store.commit_log.max_offset == cut
    assert _bodies(store, "%LMQ%dev/+/t") == [b"a%d" % i for i in range(5)]
    assert _bodies(store, "%TOPIC%dev") == [b"a%d" % i for i in range(5)]
    assert _bodies(store, "%TOPIC%other") == []
    assert index.max_offset("%LMQ%dev/+/t") == 5
    assert retained.get("dev/3/t").cl_offset == first[3].offset  # rebuilt: the older retained value is back
    # New appends continue at the cut, at the queue offsets that follow.
    _put_all(store, clock, [Message(topic="dev/9/t", body=b"c")])
    assert _bodies(store, "%LMQ%dev/+/t") == [b"a%d" % i for i in range(5)] + [b"c"]
    store.close()
    store, index, retained, clock = _store(tmp_path)
    assert _bodies(store, "%LMQ%dev/+/t") == [b"a%d" % i for i in range(5)] + [b"c"]
    assert _bodies(store, "%TOPIC%other") == []
    store.close()


def test_truncate_across_segments_and_inside_a_run(tmp_path):
    """A cut in an earlier segment removes the later segment files and splits a queue's run of entries."""
    store, index, _retained, clock = _store(tmp_path, segment_size=4096)
    _put_all(store, clock, [Message(topic="r", body=bytes(300)) for _ in range(20)])  # one dispatch: one run
    offsets = [m.record.offset for m in store.get_now("%TOPIC%r", 0, 100)]
    assert len(store.commit_log.segments()) > 1
    store.truncate(offsets[3])
    assert len(store.commit_log.segments()) == 1
    assert [m.record.offset for m in store.get_now("%TOPIC%r", 0, 100)] == offsets[:3]
    assert index.max_offset("%TOPIC%r") == 3
    store.close()


def test_truncate_refuses_an_offset_that_is_not_a_record_boundary(tmp_path):
    """A cut inside a record, or past the end, is refused and the log is unchanged."""
    log = CommitLog(str(tmp_path), 4096)
    log.open()
    log.append([encode(Message(topic="t", body=b"x" * 10), 1) for _ in range(3)])
    end = log.max_offset
    with pytest.raises(CommitLogError, match="no record starts there"):
        log.truncate_to(5)
    with pytest.raises(CommitLogError, match="cannot truncate"):
        log.truncate_to(end + 1)
    assert log.max_offset == end
    log.close()


def test_epochs_past_the_cut_go_with_it(tmp_path):
    """The store's epoch file loses the epochs that started past the cut."""
    store, _index, _retained, clock = _store(tmp_path)
    store.epochs.begin_epoch(1, 0, 0)
    _put_all(store, clock, [Message(topic="r", body=b"1")])
    cut = store.commit_log.max_offset
    _put_all(store, clock, [Message(topic="r", body=b"2")])
    store.epochs.begin_epoch(2, 0, store.commit_log.max_offset)
    _put_all(store, clock, [Message(topic="r", body=b"3")])
    store.truncate(cut)
    assert [e.epoch for e in store.epochs.entries] == [1]
    store.close()


def test_replicated_records_build_the_same_queues(tmp_path):
    """A master's raw records appended on a replica land at the same offsets and fill the same queues."""
    master, _mi, _mr, mclock = _store(tmp_path / "m")
    master.add_filter("dev/#")
    _put_all(master, mclock, [Message(topic=f"dev/{i}", body=b"%d" % i) for i in range(20)])
    raw = master.commit_log.read_raw(0, master.commit_log.max_offset)
    replica, _ri, _rr, _rclock = _store(tmp_path / "r")
    done = []
    replica.append_replicated(0, raw, decode_records(raw, 0)).addCallback(done.append)
    assert done == [master.commit_log.max_offset]
    assert replica.commit_log.read_raw(0, 1 << 20) == raw
    assert _bodies(replica, "%LMQ%dev/#") == _bodies(master, "%LMQ%dev/#")
    assert _bodies(replica, "%TOPIC%dev") == [b"%d" % i for i in range(20)]
    master.close()
    replica.close()


def test_after_a_truncation_sync_flush_still_waits_for_the_fsync(tmp_path):
    """Under flush=sync, records replicated after a cut are acknowledged only once fsynced, though the log had
    been synced past their offsets before the cut."""
    from store.executor import DeferredExecutor

    clock = task.Clock()
    ex = DeferredExecutor()
    store = MessageStore(str(tmp_path / "s"), StoreConfig(flush="sync"), clock, ex)
    lightqueue.attach(store)
    store.open()
    records = [encode(Message(topic="t", body=b"%d" % i), 1) for i in range(10)]
    data = b"".join(records)
    store.append_replicated(0, data, decode_records(data, 0))
    ex.run_pending()
    assert store.commit_log.synced_offset == len(data)
    cut = len(records[0])
    store.truncate(cut)
    done = []
    again = b"".join(records[1:5])
    store.append_replicated(cut, again, decode_records(again, cut)).addCallback(done.append)
    assert done == []
    ex.run_pending()
    assert done == [cut + len(again)]
    store.close()
    ex.run_pending()


def test_an_fsync_that_started_before_a_cut_does_not_count_after_it():
    """SyncFlush: an fsync running while the log is cut reports the old end; it must not mark the new bytes
    at those offsets synced."""
    from store.executor import DeferredExecutor
    from store.flush import SyncFlush

    ex = DeferredExecutor()
    ends = iter([1000, 800])  # what each fsync reports: the log's end when it started
    policy = SyncFlush(lambda: next(ends), ex)
    first = []
    policy.written(1000).addCallback(first.append)  # the fsync starts (end 1000) ...
    policy.truncated(500)  # ... the log is cut to 500 meanwhile, and 300 new bytes are written
    second = []
    policy.written(800).addCallback(second.append)
    ex.run_pending()  # the first fsync ends reporting 1000: that proves nothing about the bytes after the cut
    assert second == [] and policy.synced_offset <= 500
    ex.run_pending()  # the fsync that started after the cut
    assert second == [800] and policy.synced_offset == 800


def test_native_cursors_and_in_flight_messages_forget_what_was_cut(tmp_path):
    """After a cut, a consumer group past the queue's new end reads the next new message (it is not skipped),
    and a message in flight whose record was cut is not handed out again."""
    from tests.unit.test_native_engine import Node

    n = Node(tmp_path)
    for body in ("a1", "a2", "a3"):
        assert n.call(action="produce", queue="jobs", data=body, retry=30)["code"] == 0
    cut = n.store.commit_log.max_offset
    for body in ("b1", "b2"):
        assert n.call(action="produce", queue="jobs", data=body, retry=30)["code"] == 0
    got = [n.call(action="consume", queue="jobs").get("data") for _ in range(4)]
    assert got == ["a1", "a2", "a3", "b1"]
    n.store.truncate(cut)
    assert n.call(action="produce", queue="jobs", data="c1", retry=30)["code"] == 0
    assert n.call(action="consume", queue="jobs").get("data") == "c1"
    n.run_for(31)  # every invisible time is over: what comes back is what was not cut
    back = [n.call(action="consume", queue="jobs").get("data") for _ in range(5)]
    assert sorted(b for b in back if b) == ["a1", "a2", "a3", "c1"] and back[-1] is None  # b1 never again
