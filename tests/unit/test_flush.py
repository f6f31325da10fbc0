"""Unit tests of the flush policies, with an injected clock and executor: no sleeps."""

from twisted.internet import task

from store.executor import DeferredExecutor
from store.flush import AsyncFlush, SyncFlush


class FakeLog:
    """Stands in for CommitLog.sync: counts fsyncs and reports the written offset."""

    def __init__(self):
        self.written = 0
        self.fsyncs = 0

    def sync(self):
        self.fsyncs += 1
        return self.written


def test_async_acknowledges_at_once_and_fsyncs_on_interval():
    """Async flush fires the writer's Deferred immediately and fsyncs every interval."""
    clock, ex, fake = task.Clock(), DeferredExecutor(), FakeLog()
    policy = AsyncFlush(fake.sync, ex, clock, interval_ms=500)
    policy.start()
    fake.written = 100
    fired = []
    policy.written(100).addCallback(fired.append)
    assert fired == [100] and fake.fsyncs == 0
    clock.advance(0.5)
    assert ex.run_pending() == 1 and policy.synced_offset == 100
    clock.advance(0.5)
    assert ex.run_pending() == 0, "nothing new written: no fsync"


def test_sync_waits_for_fsync():
    """Sync flush fires only after an fsync covering the write completes."""
    ex, fake = DeferredExecutor(), FakeLog()
    policy = SyncFlush(fake.sync, ex)
    fake.written = 50
    fired = []
    policy.written(50).addCallback(fired.append)
    assert fired == []
    ex.run_pending()
    assert fired == [50]


def test_sync_group_commit_shares_fsyncs():
    """Writes that arrive while an fsync runs share the next one: 3 batches, 2 fsyncs."""
    ex, fake = DeferredExecutor(), FakeLog()
    policy = SyncFlush(fake.sync, ex)
    fired = []
    fake.written = 10
    policy.written(10).addCallback(fired.append)  # starts fsync #1
    fake.written = 20
    policy.written(20).addCallback(fired.append)  # waits
    fake.written = 30
    policy.written(30).addCallback(fired.append)  # waits, shares fsync #2
    ex.run_pending()  # fsync #1 returns 30 (it saw everything written so far)
    assert fired == [30, 30, 30]
    assert fake.fsyncs == 1


def test_sync_failure_fails_waiters():
    """A failed fsync errbacks every waiting writer instead of acknowledging it."""
    ex = DeferredExecutor()

    def broken():
        raise OSError(5, "I/O error")

    policy = SyncFlush(broken, ex)
    errors = []
    policy.written(10).addErrback(errors.append)
    ex.run_pending()
    assert errors and "I/O error" in errors[0].getErrorMessage()
