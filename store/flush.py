"""Flush policies: when the commit log's written bytes are fsynced.

Both policies run after the bytes have reached the operating system, so a
killed process never loses an acknowledged record; they differ in what a power
loss may take:

- ``AsyncFlush`` (default): acknowledge at once, fsync every ``interval_ms``.
- ``SyncFlush``: acknowledge only after an fsync covers the record. Appends
  that arrive while an fsync runs share the next one (group commit).

The fsync itself runs on the executor, never on the reactor thread.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer, task

log = logging.getLogger("twistmq.store.flush")


class AsyncFlush:
    """Acknowledge writes at once; fsync in the background every ``interval_ms``."""

    def __init__(self, sync: Callable[[], int], executor, clock, interval_ms: int = 500) -> None:
        self._sync = sync
        self._executor = executor
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = clock
        self._interval = interval_ms / 1000.0
        self._running: defer.Deferred | None = None
        self._dirty = False
        self.synced_offset = 0

    def start(self) -> None:
        self._loop.start(self._interval, now=False)

    def stop(self) -> defer.Deferred:
        """Stop the timer and run one last fsync."""
        if self._loop.running:
            self._loop.stop()
        return self.flush_now()

    def written(self, end_offset: int) -> defer.Deferred:
        """Called after each batch write; the batch is acknowledged at once."""
        self._dirty = True
        return defer.succeed(end_offset)

    def _tick(self) -> None:
        if self._dirty and self._running is None:
            self.flush_now()

    def truncated(self, offset: int) -> None:
        """The log was cut back to ``offset``: what lies past it is not synced."""
        self.synced_offset = min(self.synced_offset, offset)

    def flush_now(self) -> defer.Deferred:
        """Fsync what is written so far (joins a running fsync if there is one)."""
        if self._running is not None:
            return self._running.addCallback(lambda _: self.flush_now())
        self._dirty = False
        d = self._executor.submit(self._sync)
        self._running = d

        def done(offset):
            self._running = None
            self.synced_offset = offset
            return offset

        def failed(f):
            self._running = None
            self._dirty = True
            log.error("commitlog_fsync_failed error=%s", f.getErrorMessage())
            return f

        d.addCallbacks(done, failed)
        return d


class SyncFlush:
    """Acknowledge a write only once an fsync covers it; concurrent writes share fsyncs."""

    def __init__(self, sync: Callable[[], int], executor, clock=None, interval_ms: int = 0) -> None:
        self._sync = sync
        self._executor = executor
        self._waiters: list[tuple[int, defer.Deferred]] = []
        self._running = False
        self.synced_offset = 0
        self.fsyncs = 0  # how many fsyncs ran (group commit shows as fsyncs < batches)
        self._generation = 0  # bumped by a truncation: an fsync started before it proves nothing after it

    def start(self) -> None:
        pass

    def stop(self) -> defer.Deferred:
        if not self._waiters and not self._running:
            return self._executor.submit(self._sync)
        d: defer.Deferred = defer.Deferred()
        self._waiters.append((0, d))
        self._kick()
        return d

    def written(self, end_offset: int) -> defer.Deferred:
        """Return a Deferred that fires once ``end_offset`` is on disk."""
        if end_offset <= self.synced_offset:
            return defer.succeed(end_offset)
        d: defer.Deferred = defer.Deferred()
        self._waiters.append((end_offset, d))
        self._kick()
        return d

    def truncated(self, offset: int) -> None:
        """The log was cut back to ``offset``: what lies past it is not synced, whatever an fsync running now says."""
        self.synced_offset = min(self.synced_offset, offset)
        self._generation += 1

    def _kick(self) -> None:
        if self._running or not self._waiters:
            return
        self._running = True
        self.fsyncs += 1
        self._executor.submit(self._sync).addCallbacks(self._synced, self._failed,
                                                       callbackArgs=(self._generation,))

    def _synced(self, offset: int, generation: int = 0) -> None:
        self._running = False
        if generation == self._generation:
            self.synced_offset = max(self.synced_offset, offset)
        ready = [d for end, d in self._waiters if end <= self.synced_offset]
        self._waiters = [(end, d) for end, d in self._waiters if end > self.synced_offset]
        for d in ready:
            d.callback(self.synced_offset)
        self._kick()

    def _failed(self, failure) -> None:
        self._running = False
        log.error("commitlog_fsync_failed error=%s", failure.getErrorMessage())
        waiters, self._waiters = self._waiters, []
        for _, d in waiters:
            d.errback(failure)


def make_flush_policy(name: str, sync, executor, clock, interval_ms: int):
    """Build the policy named in config (``async`` or ``sync``)."""
    if name == "async":
        return AsyncFlush(sync, executor, clock, interval_ms)
    if name == "sync":
        return SyncFlush(sync, executor, clock, interval_ms)
    raise ValueError(f"unknown flush policy {name!r} (expected 'async' or 'sync')")
