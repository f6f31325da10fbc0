"""Unit tests of the durable key-value store: per-tick batches, reads of pending writes."""

from twisted.internet import task

from store.executor import DeferredExecutor
from store.kv import DurableKV


def test_writes_in_one_tick_are_one_batch(tmp_path):
    """Puts staged in one tick commit as one batch and fire their Deferreds together."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    fired = []
    for i in range(10):
        kv.put(b"k%d" % i, b"v").addCallback(fired.append)
    assert fired == [] and kv.get(b"k3") == b"v", "pending writes are readable at once"
    clock.advance(0)
    assert len(fired) == 10 and kv.batches == 1


def test_scan_merges_pending_and_deleted(tmp_path):
    """scan sees committed and pending keys under a prefix, minus pending deletions, in order."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    kv.put(b"s:a", b"1")
    kv.put(b"s:b", b"2")
    kv.put(b"t:x", b"3")
    clock.advance(0)
    kv.delete(b"s:a")
    kv.put(b"s:c", b"4")
    assert list(kv.scan(b"s:")) == [(b"s:b", b"2"), (b"s:c", b"4")]


def test_values_survive_reopen(tmp_path):
    """What was committed is there after closing and reopening."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    kv.put(b"offset", b"42")
    kv.close()
    kv = DurableKV(str(tmp_path), clock)
    assert kv.get(b"offset") == b"42"


def _sync_kv(tmp_path, executor):
    clock = task.Clock()
    return clock, DurableKV(str(tmp_path), clock, sync=True, executor=executor)


def test_kv_sync_answers_only_after_the_wal_fsync_off_the_reactor(tmp_path):
    """With kv_sync the tick's batch is written at once; its waiters fire only after the executor's WAL fsync."""
    executor = DeferredExecutor()
    clock, kv = _sync_kv(tmp_path, executor)
    fired = []
    kv.put(b"offset", b"7").addCallback(fired.append)
    clock.advance(0)
    assert kv.batches == 1 and kv.get(b"offset") == b"7", "the batch is in the WAL once the tick ends"
    assert fired == [] and len(executor.pending) == 1, "the fsync waits on the executor; nobody is answered yet"
    executor.run_pending()
    assert fired == [None]


def test_kv_sync_batches_written_during_an_fsync_share_the_next_one(tmp_path):
    """Batches committed while a WAL fsync runs wait for the next fsync, which covers them all (group commit)."""
    executor = DeferredExecutor()
    clock, kv = _sync_kv(tmp_path, executor)
    first, later = [], []
    kv.put(b"a", b"1").addCallback(first.append)
    clock.advance(0)
    for i in range(3):
        kv.put(b"b%d" % i, b"2").addCallback(later.append)
        clock.advance(0)
    assert kv.batches == 4 and kv.wal_syncs == 1 and len(executor.pending) == 1
    executor.run_pending()
    assert first == [None] and later == [], "the running fsync may have started before the later batches"
    assert kv.wal_syncs == 2 and len(executor.pending) == 1
    executor.run_pending()
    assert later == [None] * 3 and executor.pending == []


def test_kv_sync_barrier_waits_for_the_fsync_in_flight(tmp_path):
    """A barrier with nothing staged still waits until what was already written is fsynced."""
    executor = DeferredExecutor()
    clock, kv = _sync_kv(tmp_path, executor)
    kv.put(b"s/c1", b"{}")
    clock.advance(0)
    done = []
    kv.barrier().addCallback(done.append)
    executor.run_pending()
    assert done == [], "the barrier needs an fsync that starts after it"
    executor.run_pending()
    assert done == [None]
    assert kv.barrier().called, "nothing written since: the barrier is already passed"


def test_kv_sync_failed_fsync_fails_its_writers_and_the_next_batch_still_syncs(tmp_path):
    """An fsync error errbacks the writers it covered; later writes get a fresh fsync."""
    executor = DeferredExecutor()
    clock, kv = _sync_kv(tmp_path, executor)
    errors, fired = [], []
    kv.put(b"a", b"1").addErrback(lambda f: errors.append(f.value))
    clock.advance(0)
    fn, args, d = executor.pending.pop()
    d.errback(OSError("EIO"))
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    kv.put(b"b", b"2").addCallback(fired.append)
    clock.advance(0)
    executor.run_pending()
    assert fired == [None]


def test_kv_sync_close_fsyncs_what_an_unstarted_fsync_would_have(tmp_path):
    """close() fsyncs itself and answers the waiters; the fsync still queued on the executor then does nothing."""
    executor = DeferredExecutor()
    clock, kv = _sync_kv(tmp_path, executor)
    fired = []
    kv.put(b"a", b"1").addCallback(fired.append)
    clock.advance(0)
    kv.put(b"b", b"2").addCallback(fired.append)
    clock.advance(0)
    kv.close()
    assert len(fired) == 1, "the batch waiting for the next fsync is answered by close()"
    executor.run_pending()
    assert fired == [None, None]
    kv = DurableKV(str(tmp_path), clock)
    assert kv.get(b"a") == b"1" and kv.get(b"b") == b"2"


def test_without_kv_sync_the_executor_is_not_used(tmp_path):
    """kv_sync off: the waiters fire as soon as the batch is written, with no fsync."""
    executor = DeferredExecutor()
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock, executor=executor)
    fired = []
    kv.put(b"a", b"1").addCallback(fired.append)
    clock.advance(0)
    assert fired == [None] and executor.pending == [] and kv.wal_syncs == 0


def test_staged_writes_tell_on_durable_once_committed(tmp_path):
    """stage() writes join the tick's batch; on_durable runs once that batch is written, not before."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    told = []
    kv.stage(b"a", b"1")
    kv.stage(b"b", None)
    kv.on_durable(lambda: told.append("done"), told.append)
    assert told == [] and kv.get(b"a") == b"1"
    clock.advance(0)
    assert told == ["done"] and kv.batches == 1
    kv.on_durable(lambda: told.append("at once"), told.append)
    assert told == ["done", "at once"], "nothing pending: told on the spot"


def test_on_durable_waits_for_the_wal_fsync_when_sync(tmp_path):
    """With sync=True, on_durable runs only after the WAL fsync that covers the staged write."""
    clock = task.Clock()
    executor = DeferredExecutor()
    kv = DurableKV(str(tmp_path), clock, sync=True, executor=executor)
    told = []
    kv.stage(b"a", b"1")
    kv.on_durable(lambda: told.append("done"), told.append)
    clock.advance(0)
    assert told == []
    executor.run_pending()
    assert told == ["done"]
