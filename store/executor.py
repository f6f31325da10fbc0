"""Where blocking work (fsync, big reads) runs: a thread pool, or inline in tests."""

from __future__ import annotations

from typing import Any, Callable, Protocol

from twisted.internet import defer, threads
from twisted.python.threadpool import ThreadPool


class Executor(Protocol):
    """Runs a blocking callable and returns a Deferred with its result."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred: ...


class SynchronousExecutor:
    """Runs the callable at once, on the caller's thread (unit tests)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred:
        return defer.maybeDeferred(fn, *args)


class DeferredExecutor:
    """Holds submitted calls until ``run_pending()``: tests control when blocking work finishes."""

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[..., Any], tuple, defer.Deferred]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.pending.append((fn, args, d))
        return d

    def run_pending(self) -> int:
        """Run every call submitted so far; return how many ran."""
        batch, self.pending = self.pending, []
        for fn, args, d in batch:
            try:
                d.callback(fn(*args))
            except Exception:  # noqa: BLE001 - handed to the Deferred, as a pool would
                d.errback()
        return len(batch)


class ThreadPoolExecutor:
    """Runs callables on a Twisted thread pool; results come back on the reactor thread."""

    def __init__(self, reactor, min_threads: int = 1, max_threads: int = 4, name: str = "twistmq-io") -> None:
        self._reactor = reactor
        self._pool = ThreadPool(min_threads, max_threads, name=name)

    def start(self) -> None:
        self._pool.start()

    def stop(self) -> None:
        self._pool.stop()

    def submit(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred:
        return threads.deferToThreadPool(self._reactor, self._pool, fn, *args)
