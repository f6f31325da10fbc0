"""The process's one MongoDB client, used only off the reactor: ``MongoPool``.

Every ``pymongo`` call blocks, so none runs on the reactor thread: ``call(fn, *args)``
runs ``fn(database, *args)`` on a bounded thread pool (``twisted.python.threadpool``
through ``threads.deferToThreadPool``) and returns a Deferred fired on the reactor.
Calls beyond ``max_pending`` waiting fail at once with ``MongoUnavailable`` instead
of queueing without bound. One ``MongoClient`` per process (``pymongo`` pools its
connections and monitors the servers itself); it is made on a pool thread at the
first call, since a ``mongodb+srv://`` URI resolves DNS when the client is built.

Outages: a call failing with ``pymongo``'s ``ConnectionFailure`` (server selection
timed out, connection refused or reset, a network timeout) marks MongoDB down and
errbacks with ``MongoUnavailable``; the first such failure logs one
``mongodb_unreachable`` line with the reason, and the first success after it one
``mongodb_reachable`` line, so an outage costs two lines whatever the traffic.
``stats()`` (``twistmq_mongodb_*`` on ``/metrics``) counts outages, calls and
failed calls. Other ``pymongo`` errors (a refused operation) pass through as they are.

``watch(names, on_change, on_restart)`` follows a change stream on the database's
collections *names* on a thread of its own (one long-lived thread per watch, not a
pool slot): each change is handed to the reactor with ``callFromThread``. After an
error it resumes, with back-off, after the last event it reported; when a stream
opens anew (at first, or when resuming fails) ``on_restart(since)`` says from which
operation time on changes are reported. A server without change streams (a
standalone ``mongod``) answers with an ``OperationFailure``: the watch logs it once
and gives up; its users then rely on their cache's TTL.

The URI is never logged: it holds credentials.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from twisted.application import service
from twisted.internet import defer, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from cluster.mongodb.config import MongoConfig

__all__ = ["MongoPool", "MongoUnavailable"]

log = logging.getLogger("twistmq.mongodb")

WATCH_BACKOFF = (0.5, 1.0, 2.0, 5.0)
"""Seconds before reopening a failed change stream (the last repeats)."""


class MongoUnavailable(Exception):
    """MongoDB could not be reached (or too many calls wait for it); the message says why, never the URI."""


class MongoPool(service.Service):
    """Runs ``pymongo`` calls on a bounded thread pool over one client; tracks outages."""

    def __init__(self, reactor, config: MongoConfig, max_threads: int = 4, max_pending: int = 1000,
                 client_factory: Callable[..., Any] | None = None) -> None:
        self.name = "mongodb"
        self.reactor = reactor
        self.config = config
        self.max_pending = max_pending
        self._pool = ThreadPool(minthreads=0, maxthreads=max_threads, name="twistmq-mongodb")
        self._client_factory = client_factory
        self._client = None
        self._client_lock = threading.Lock()
        self._stop = threading.Event()
        self._watchers: list[threading.Thread] = []
        self.pending = 0
        self.up: bool | None = None
        """None until the first call answers; then whether the last call reached MongoDB."""
        self.outages = 0
        self.calls = 0
        self.failed_calls = 0
        self.reason = ""

    # -- service ------------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._stop.clear()
        self._pool.start()

    def stopService(self) -> defer.Deferred:
        super().stopService()
        self._stop.set()
        # Joining the pool waits for calls under way (each bounded by [mongodb] timeout): off the reactor.
        return threads.deferToThread(self._shutdown)

    def _shutdown(self) -> None:
        self._pool.stop()
        for watcher in self._watchers:
            watcher.join(self.config.timeout + 2)
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- calls --------------------------------------------------------------------------------

    def database(self):
        """The ``pymongo`` Database (made with the client at first use). Blocking: call it on a pool thread."""
        with self._client_lock:
            if self._client is None:
                factory = self._client_factory
                if factory is None:
                    from pymongo import MongoClient
                    factory = MongoClient
                ms = self.config.timeout_ms
                self._client = factory(self.config.uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms,
                                       socketTimeoutMS=ms, appname="twistmq")
            return self._client[self.config.database]

    def call(self, fn: Callable[..., Any], *args: Any) -> defer.Deferred:
        """Run ``fn(database, *args)`` on the pool; the Deferred fires on the reactor with its result, or
        fails with ``MongoUnavailable`` (unreachable, or more than ``max_pending`` calls waiting)."""
        if self.pending >= self.max_pending:
            self.failed_calls += 1
            return defer.fail(MongoUnavailable(f"{self.pending} MongoDB calls already waiting"))
        self.pending += 1
        self.calls += 1
        d = threads.deferToThreadPool(self.reactor, self._pool, self._run, fn, args)
        d.addBoth(self._done)
        return d

    def _run(self, fn, args):
        return fn(self.database(), *args)

    def _done(self, result):
        self.pending -= 1
        if isinstance(result, Failure):
            self.failed_calls += 1
            if _is_outage(result.value):
                self.mark_down(_reason(result.value))
                raise MongoUnavailable(_reason(result.value))
            return result
        self.mark_up()
        return result

    def mark_down(self, reason: str) -> None:
        """Record that MongoDB is unreachable: one log line per outage."""
        self.reason = reason
        if self.up is not False:
            self.up = False
            self.outages += 1
            log.warning("mongodb_unreachable database=%s reason=%s", self.config.database, reason)

    def mark_up(self) -> None:
        """Record that MongoDB answered: one log line when an outage ends."""
        if self.up is False:
            log.warning("mongodb_reachable database=%s (was down: %s)", self.config.database, self.reason)
        self.up = True
        self.reason = ""

    def stats(self) -> dict[str, float]:
        """The gauges of ``/metrics`` (``twistmq_mongodb_*``)."""
        return {"up": 1 if self.up is not False else 0, "outages": self.outages, "calls": self.calls,
                "failed_calls": self.failed_calls, "pending_calls": self.pending}

    # -- change streams -----------------------------------------------------------------------

    def watch(self, names: tuple[str, ...], on_change: Callable[[dict], None],
              on_restart: Callable[[Any], None]) -> None:
        """Follow the changes of collections *names* on a thread of its own until the service stops.

        ``on_change(event)`` gets each change-stream event; ``on_restart(since)`` is called when a stream opens
        that reports the changes after operation time *since* (a read at or after it misses none). After an
        error the stream resumes after the last event it reported; only when that fails does it open anew.
        """
        thread = threading.Thread(target=self._watch_loop, args=(tuple(names), on_change, on_restart),
                                  name="twistmq-mongodb-watch", daemon=True)
        self._watchers.append(thread)
        thread.start()

    def _watch_loop(self, names, on_change, on_restart) -> None:
        from pymongo.errors import OperationFailure, PyMongoError

        failures, token = 0, None
        pipeline = [{"$match": {"ns.coll": {"$in": list(names)}}}]
        while not self._stop.is_set():
            try:
                database = self.database()
                if token is None:
                    with database.client.start_session(causal_consistency=False) as session:
                        database.command("ping", session=session)
                        since = session.operation_time
                    where = {"start_at_operation_time": since} if since is not None else {}
                else:
                    where = {"resume_after": token}
                with database.watch(pipeline, full_document="updateLookup", max_await_time_ms=500,
                                    **where) as stream:
                    failures = 0
                    if token is None:
                        self.reactor.callFromThread(on_restart, since)
                    self.reactor.callFromThread(self.mark_up)
                    while not self._stop.is_set() and stream.alive:
                        change = stream.try_next()
                        if change is not None:
                            self.reactor.callFromThread(on_change, change)
                        token = stream.resume_token
            except OperationFailure as exc:
                if token is not None:
                    token = None  # could not resume there (history gone): open anew, and the user re-reads
                    continue
                log.warning("mongodb_change_stream_unavailable collections=%s reason=%s: cached entries "
                            "live for their TTL", ",".join(names), _reason(exc))
                return
            except PyMongoError as exc:
                if _is_outage(exc):
                    self.reactor.callFromThread(self.mark_down, _reason(exc))
                else:
                    log.warning("mongodb_change_stream_error collections=%s reason=%s", ",".join(names),
                                _reason(exc))
                self._stop.wait(WATCH_BACKOFF[min(failures, len(WATCH_BACKOFF) - 1)])
                failures += 1


def _is_outage(exc: BaseException) -> bool:
    try:
        from pymongo.errors import ConnectionFailure
    except ImportError:  # pragma: no cover - a MongoPool is only built with pymongo installed
        return False
    return isinstance(exc, (ConnectionFailure, MongoUnavailable))


def _reason(exc: BaseException) -> str:
    """A short, one-line reason (pymongo's topology descriptions run to several lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = text.split(", Timeout:")[0]  # the topology description after it repeats what came before
    return f"{type(exc).__name__}: {text[:300]}"
