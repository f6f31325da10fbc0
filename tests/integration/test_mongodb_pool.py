"""The process's MongoDB client (MongoPool) against a real wire-protocol server process: calls off the reactor,
change streams, an outage logged once and counted, and recovery when the server is back."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading

import pytest
from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from cluster.mongodb.client import MongoPool, MongoUnavailable
from cluster.mongodb.config import MongoConfig
from tests.mongo_server import MongoServer

pytestmark = pytest.mark.slow


def sleep(seconds: float) -> defer.Deferred:
    return task.deferLater(reactor, seconds, lambda: None)


@defer.inlineCallbacks
def until(predicate, timeout: float = 10.0, what: str = "the condition"):
    """Poll *predicate* on the reactor every 50 ms; fail naming *what* after *timeout* seconds."""
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        yield sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


class MongoPoolTest(unittest.TestCase):
    """One server process per test (each test kills or changes it)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mongo-pool-")
        self.server = MongoServer(os.path.join(self.dir, "db")).start()
        self.pool = MongoPool(reactor, MongoConfig(uri=self.server.uri, database="pooltest", timeout=1.0),
                              max_threads=2)
        self.pool.startService()
        self.log = _Lines()
        logging.getLogger("twistmq.mongodb").addHandler(self.log)

    @defer.inlineCallbacks
    def tearDown(self):
        logging.getLogger("twistmq.mongodb").removeHandler(self.log)
        yield self.pool.stopService()
        self.server.remove()
        shutil.rmtree(self.dir, ignore_errors=True)

    @defer.inlineCallbacks
    def test_calls_run_off_the_reactor_thread(self):
        """fn(database) runs on a pool thread and its result comes back on the reactor."""
        reactor_thread = threading.current_thread()

        def insert(db, doc):
            assert threading.current_thread() is not reactor_thread
            db.things.insert_one(dict(doc))
            return db.things.count_documents({})

        count = yield self.pool.call(insert, {"a": 1})
        self.assertEqual(count, 1)
        self.assertEqual(self.pool.stats()["up"], 1)

    @defer.inlineCallbacks
    def test_change_stream_reports_inserts_and_deletes(self):
        """watch() hands each change of the named collections to the reactor; other collections are ignored."""
        changes, restarts = [], []
        self.pool.watch(("users",), changes.append, restarts.append)
        yield until(lambda: restarts, what="the change stream to open")
        yield self.pool.call(lambda db: (db.other.insert_one({"x": 1}), db.users.insert_one({"username": "u1"}),
                                         db.users.delete_one({"username": "u1"})))
        yield until(lambda: len(changes) >= 2, what="two changes")
        self.assertEqual([c["operationType"] for c in changes], ["insert", "delete"])
        self.assertEqual(changes[0]["fullDocument"]["username"], "u1")

    @defer.inlineCallbacks
    def test_change_stream_resumes_after_the_server_is_killed(self):
        """A watch survives a SIGKILL of the server: it resumes after the last event, reporting the changes made
        once the server is back, without opening anew (which would make its user re-read everything)."""
        changes, restarts = [], []
        self.pool.watch(("users",), changes.append, restarts.append)
        yield until(lambda: restarts, what="the change stream to open")
        yield self.pool.call(lambda db: db.users.insert_one({"username": "before"}))
        yield until(lambda: changes, what="the first change")
        self.server.kill()
        yield sleep(1.5)  # the watch notices the outage (a timeout of 1 s) and backs off
        self.server.start()
        yield self.pool.call(lambda db: db.users.insert_one({"username": "after"}))
        yield until(lambda: len(changes) >= 2, timeout=15, what="the change made after the restart")
        self.assertEqual([c["fullDocument"]["username"] for c in changes], ["before", "after"])
        self.assertEqual(len(restarts), 1)

    @defer.inlineCallbacks
    def test_outage_is_logged_once_counted_and_ends_when_the_server_is_back(self):
        """Killed: every call fails with MongoUnavailable, one log line for the outage; back: one line, calls work."""
        yield self.pool.call(lambda db: db.command("ping"))
        self.server.kill()
        for _ in range(3):
            with self.assertRaises(MongoUnavailable):
                yield self.pool.call(lambda db: db.command("ping"))
        down = [line for line in self.log.lines if line.startswith("mongodb_unreachable")]
        self.assertEqual(len(down), 1, self.log.lines)
        self.assertNotIn(self.server.uri, down[0])
        self.assertEqual(self.pool.stats()["outages"], 1)
        self.assertEqual(self.pool.stats()["up"], 0)
        self.server.start()
        yield self.pool.call(lambda db: db.command("ping"))
        self.assertEqual([line for line in self.log.lines if line.startswith("mongodb_reachable")].__len__(), 1)
        self.assertEqual(self.pool.stats()["up"], 1)

    @defer.inlineCallbacks
    def test_too_many_waiting_calls_fail_at_once(self):
        """Past max_pending, a call fails with MongoUnavailable instead of queueing without bound."""
        self.pool.max_pending = 1
        blocker = threading.Event()
        first = self.pool.call(lambda db: blocker.wait(5))
        with self.assertRaises(MongoUnavailable):
            yield self.pool.call(lambda db: None)
        blocker.set()
        yield first
