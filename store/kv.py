"""The durable key-value store for state that is not derived from the log.

Sessions, subscriptions, consumer offsets, in-flight QoS state and POP
checkpoints live here, in RocksDB with its write-ahead log on. Writes made in
one reactor tick are committed as one batch; the Deferred a writer gets fires
only after that batch is in the WAL (in the operating system, so it survives
kill -9; with ``sync=True`` also fsynced, so it survives power loss).

The batch itself is written on the reactor thread without ``sync``: rocksdict
holds the GIL for the whole of ``write()``, so a sync write on any thread would
stop the reactor for the fsync. With ``sync=True`` the fsync is a separate
``flush_wal(True)`` (which releases the GIL) on the executor; batches written
while one runs share the next (group commit), and their Deferreds fire only
once it has returned.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Iterator

from rocksdict import Options, Rdict, WriteBatch, WriteOptions
from twisted.internet import defer

from store.executor import SynchronousExecutor

log = logging.getLogger("twistmq.store.kv")


class _Waiter:
    """A writer waiting with plain callbacks: fired where the Deferreds are (``callback``/``errback``)."""

    __slots__ = ("_on_done", "_on_error")

    def __init__(self, on_done: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
        self._on_done = on_done
        self._on_error = on_error

    def callback(self, _result) -> None:
        self._on_done()

    def errback(self, failure) -> None:
        self._on_error(getattr(failure, "value", failure))


class DurableKV:
    """Bytes to bytes, batched per tick, readable at once (pending writes included)."""

    def __init__(self, path: str, clock, sync: bool = False, executor=None) -> None:
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(path, opts)
        self._clock = clock
        self._write_opts = WriteOptions()  # never sync=True: see the module docstring
        self._sync = sync
        self._executor = executor if executor is not None else SynchronousExecutor()
        self._pending: dict[bytes, bytes | None] = {}
        self._waiters: list[defer.Deferred] = []
        self._scheduled = None
        self._unsynced: list[defer.Deferred] = []  # written, waiting for the next WAL fsync
        self._syncing = False  # a WAL fsync is running on the executor
        self._db_lock = threading.Lock()  # a worker's fsync against close()
        self._closed = False
        self.batches = 0
        self.wal_syncs = 0

    def put(self, key: bytes, value: bytes) -> defer.Deferred:
        """Stage ``key=value``; the Deferred fires once it is durable."""
        self._pending[key] = value
        return self._wait()

    def delete(self, key: bytes) -> defer.Deferred:
        """Stage the deletion of ``key``; the Deferred fires once it is durable."""
        self._pending[key] = None
        return self._wait()

    def stage(self, key: bytes, value: bytes | None) -> None:
        """Stage ``key=value`` (``None``: delete) without a Deferred; ``on_durable`` tells when it is durable.

        For hot paths where a Deferred per write (and its callbacks) is a
        measurable share of a request: several writes, one notification.
        """
        self._pending[key] = value
        if self._scheduled is None:
            self._scheduled = self._clock.callLater(0, self.commit)

    def on_durable(self, on_done: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
        """``on_done()`` once every write staged so far is durable (``on_error(exc)`` if it cannot be).

        ``barrier`` with plain callbacks: may call ``on_done`` before returning when nothing is pending.
        """
        waiter = _Waiter(on_done, on_error)
        if self._pending:
            self._waiters.append(waiter)
            if self._scheduled is None:
                self._scheduled = self._clock.callLater(0, self.commit)
        elif self._sync and (self._syncing or self._unsynced):
            self._unsynced.append(waiter)
            self._kick_sync()
        else:
            on_done()

    def get(self, key: bytes) -> bytes | None:
        """The latest value of ``key``, including writes not yet committed."""
        if key in self._pending:
            return self._pending[key]
        return self._db.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Committed and pending pairs whose key starts with ``prefix``, in key order."""
        merged: dict[bytes, bytes | None] = {}
        for k, v in self._db.items(from_key=prefix):
            if not k.startswith(prefix):
                break
            merged[k] = v
        for k, v in self._pending.items():
            if k.startswith(prefix):
                merged[k] = v
        for k in sorted(merged):
            v = merged[k]
            if v is not None:
                yield k, v

    def barrier(self) -> defer.Deferred:
        """Fires once every write staged so far is durable."""
        if self._pending:
            return self._wait()
        if not self._sync or (not self._syncing and not self._unsynced):
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()  # written but not yet fsynced: wait for the next fsync
        self._unsynced.append(d)
        self._kick_sync()
        return d

    def _wait(self) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self._waiters.append(d)
        if self._scheduled is None:
            self._scheduled = self._clock.callLater(0, self.commit)
        return d

    def commit(self) -> None:
        """Write every staged change as one batch; fire the waiters once it is durable."""
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
        pending, self._pending = self._pending, {}
        waiters, self._waiters = self._waiters, []
        if pending:
            wb = WriteBatch(raw_mode=True)
            for k, v in pending.items():
                if v is None:
                    wb.delete(k)
                else:
                    wb.put(k, v)
            try:
                self._db.write(wb, self._write_opts)
            except Exception as exc:  # noqa: BLE001 - a disk error fails the writers, not the broker
                log.error("kv_write_failed keys=%d error=%s", len(pending), exc)
                for d in waiters:
                    d.errback(exc)
                return
            self.batches += 1
        if not self._sync:
            for d in waiters:
                d.callback(None)
            return
        self._unsynced.extend(waiters)
        self._kick_sync()

    def _kick_sync(self) -> None:
        """Start a WAL fsync for everything written so far, unless one is running (it re-kicks when done)."""
        if self._syncing or not self._unsynced or self._closed:
            return
        self._syncing = True
        waiters, self._unsynced = self._unsynced, []
        self.wal_syncs += 1
        self._executor.submit(self._sync_wal).addCallbacks(self._synced, self._sync_failed,
                                                           callbackArgs=(waiters,), errbackArgs=(waiters,))

    def _sync_wal(self) -> None:
        """On a worker thread: fsync the WAL (rocksdict releases the GIL for it)."""
        with self._db_lock:
            if not self._closed:  # close() has fsynced everything already
                self._db.flush_wal(True)

    def _synced(self, _, waiters: list[defer.Deferred]) -> None:
        self._syncing = False
        for d in waiters:
            d.callback(None)
        self._kick_sync()

    def _sync_failed(self, failure, waiters: list[defer.Deferred]) -> None:
        self._syncing = False
        log.error("kv_wal_sync_failed waiters=%d error=%s", len(waiters), failure.getErrorMessage())
        for d in waiters:
            d.errback(failure)
        self._kick_sync()

    def close(self) -> None:
        """Commit what is staged, fsync the WAL if asked to, and close the database."""
        self.commit()
        with self._db_lock:  # waits for a worker's fsync in progress
            self._closed = True
            if self._sync:
                self._db.flush_wal(True)
            self._db.close()
        waiters, self._unsynced = self._unsynced, []
        for d in waiters:
            d.callback(None)
