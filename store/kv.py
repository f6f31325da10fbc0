"""The durable key-value store for state that is not derived from the log.

Sessions, subscriptions, consumer offsets, in-flight QoS state and POP
checkpoints live here, in RocksDB with its write-ahead log on. Writes made in
one reactor tick are committed as one batch; the Deferred a writer gets fires
only after that batch is in the WAL (in the operating system, so it survives
kill -9; with ``sync=True`` also fsynced, so it survives power loss).
"""

from __future__ import annotations

import logging
import os
from typing import Iterator

from rocksdict import Options, Rdict, WriteBatch, WriteOptions
from twisted.internet import defer

log = logging.getLogger("twistmq.store.kv")


class DurableKV:
    """Bytes to bytes, batched per tick, readable at once (pending writes included)."""

    def __init__(self, path: str, clock, sync: bool = False) -> None:
        os.makedirs(path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(path, opts)
        self._clock = clock
        self._write_opts = WriteOptions()
        self._write_opts.sync = sync
        self._pending: dict[bytes, bytes | None] = {}
        self._waiters: list[defer.Deferred] = []
        self._scheduled = None
        self.batches = 0

    def put(self, key: bytes, value: bytes) -> defer.Deferred:
        """Stage ``key=value``; the Deferred fires once it is durable."""
        self._pending[key] = value
        return self._wait()

    def delete(self, key: bytes) -> defer.Deferred:
        """Stage the deletion of ``key``; the Deferred fires once it is durable."""
        self._pending[key] = None
        return self._wait()

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
        if not self._pending:
            return defer.succeed(None)
        return self._wait()

    def _wait(self) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self._waiters.append(d)
        if self._scheduled is None:
            self._scheduled = self._clock.callLater(0, self.commit)
        return d

    def commit(self) -> None:
        """Write every staged change as one batch and fire the waiters."""
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
        for d in waiters:
            d.callback(None)

    def close(self) -> None:
        """Commit what is staged and close the database."""
        self.commit()
        self._db.close()
