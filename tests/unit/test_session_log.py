"""Unit tests of the session log: session state as commit-log records, the KV rebuilt from them.

A real MessageStore and session KV in a temp dir on a task.Clock, blocking work
inline (SynchronousExecutor). A "crash" drops every object without closing it.
"""

from __future__ import annotations

import os
import shutil

from twisted.internet import task

from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.kv import DurableKV
from store.message_store import MessageStore
from store.record import Message, RecordKind
from store import session_log
from store.session_log import CHECKPOINT, SessionLog
from store.session_store import SessionStore, StoredSubscription

T0 = 1_800_000_000.0


class Broker:
    """A store, a session KV and its session log on one clock; ``crash()`` drops them, ``close()`` closes."""

    def __init__(self, path, clock=None, segment_size=64 * 1024, session_log=True, settle=True, **cfg) -> None:
        self.path = str(path)
        self.clock = clock or task.Clock()
        if clock is None:
            self.clock.advance(T0)
        self.store = MessageStore(self.path, StoreConfig(segment_size=segment_size, retention_hours=1.0, **cfg),
                                  self.clock, SynchronousExecutor())
        self.kv = DurableKV(os.path.join(self.path, "sessions"), self.clock)
        self.log = SessionLog(self.store, self.kv, self.clock, position_log_s=1.0) if session_log else None
        self.store.open()
        self.opened = []
        if self.log is not None:
            self.log.open().addBoth(self.opened.append)
        self.sessions = SessionStore(self.log if self.log is not None else self.kv)
        if settle:
            self.clock.advance(0)

    def settle(self, d=None):
        """Run the ticks that append, dispatch and commit; the result of ``d`` (a write's Deferred)."""
        out = []
        if d is not None:
            d.addBoth(out.append)
        self.clock.advance(0)
        self.clock.advance(0)
        return out[0] if out else None

    def publish(self, n, size=1000):
        for i in range(n):
            self.store.put(Message("dev/t", b"x" * size, qos=1))
        self.settle()

    def crash(self) -> None:
        """kill -9: what the KV staged is never written (its committed batches are in its WAL, as a killed
        process's are); the files are let go as the kernel lets a killed process's go."""
        if self.kv._scheduled is not None and self.kv._scheduled.active():
            self.kv._scheduled.cancel()
        self.kv._db.close()
        self.store.commit_log.close()
        os.close(self.store._lock_fd)

    def close(self) -> None:
        if self.log is not None:
            self.log.stop()
        self.store.close()
        self.settle()
        self.kv.close()


def _fill(sessions: SessionStore) -> None:
    sessions.save_session("c1", 3600, 5, None, owner="alice")
    sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1, next_offset=0))
    sessions.save_subscription("c1", "$share/g/b", StoredSubscription("b", 2, share_group="g"))
    sessions.save_inbound_qos2("c1", 7)
    sessions.save_outbound("c1", 9, "a/+", 0, 2)
    sessions.save_released("c1", 10)
    sessions.save_claim("c1", "proxy-1", 5, "alice")
    sessions.save_epoch_mark(1024)
    sessions.save_session("c2", 60, 4, 123)
    sessions.save_subscription("c2", "x/#", StoredSubscription("x/#", 0, next_offset=0))


def _snapshot(sessions: SessionStore):
    return sessions.load_all(), sessions.load_claims(), sessions.load_claim_owners(), sessions.load_epoch_mark()


def test_writes_are_session_records_and_acknowledged_once_appended(tmp_path):
    """A session write is answered only once its SESSION record is in the commit log."""
    b = Broker(tmp_path)
    d = b.sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1))
    assert not d.called  # the record waits for the tick's append
    assert b.settle(d) is None
    kinds = [r.kind for r in b.store.commit_log.iterate(0, b.store.commit_log.max_offset)]
    assert RecordKind.SESSION in kinds
    assert b.sessions.load_all() == {}  # no session meta: load_all shows none, but the key is there
    assert b.sessions.kv.get(b"u/c1\x00a/+") is not None
    b.close()


def test_kv_rebuilt_from_the_log_when_it_is_lost(tmp_path):
    """Deleting the session KV loses nothing: the next start rebuilds every key from the log."""
    b = Broker(tmp_path)
    _fill(b.sessions)
    b.sessions.delete_inbound_qos2("c1", 7)
    b.settle()
    before = _snapshot(b.sessions)
    b.close()
    shutil.rmtree(os.path.join(str(tmp_path), "sessions"))
    b = Broker(tmp_path)
    assert _snapshot(b.sessions) == before
    assert b.log.migrated == 0  # the checkpoint came back with the rest: no second upgrade
    b.close()


def test_crash_after_append_before_kv_commit_replays_the_change(tmp_path):
    """A kill between a subscribe's log append and its KV update: the restart applies it from the log."""
    b = Broker(tmp_path)
    d = b.sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1, next_offset=0))
    b.sessions.save_session("c1", 60, 5, None)
    b.store.drain()  # appended and dispatched: the KV has it staged, not committed
    assert d.called
    b.crash()
    b = Broker(tmp_path, clock=b.clock)
    assert b.sessions.load("c1").subscriptions["a/+"].qos == 1
    b.close()


def test_positions_go_to_the_kv_at_once_and_to_the_log_later(tmp_path):
    """A send mark's move is in the KV at once and in the log after position_log_s: a rebuild sees it then."""
    b = Broker(tmp_path)
    _fill(b.sessions)
    b.settle()
    appended = b.log.appended
    b.sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1, next_offset=42))
    b.settle()
    assert b.log.appended == appended  # a position: not logged yet
    assert b.sessions.load("c1").subscriptions["a/+"].next_offset == 42
    b.clock.advance(1.0)
    b.settle()
    assert b.log.appended == appended + 1
    b.close()
    shutil.rmtree(os.path.join(str(tmp_path), "sessions"))
    b = Broker(tmp_path)
    assert b.sessions.load("c1").subscriptions["a/+"].next_offset == 42
    b.close()


def test_qos1_in_flight_lags_and_qos2_in_flight_does_not(tmp_path):
    """QoS 1 in flight is a position (logged later, and not at all if acknowledged meanwhile); QoS 2 is logged."""
    b = Broker(tmp_path)
    b.settle()
    appended = b.log.appended
    b.sessions.save_outbound("c1", 1, "a/+", 5, 1)
    b.sessions.save_outbound("c1", 2, "a/+", 6, 2)
    b.settle()
    assert b.log.appended == appended + 1
    b.sessions.delete_outbound("c1", 1)
    b.sessions.delete_outbound("c1", 2)
    b.settle()
    assert b.log.appended == appended + 2
    b.clock.advance(1.0)
    b.settle()
    assert b.log.appended == appended + 2  # pid 1 came and went between two rounds: nothing to log
    b.close()


def test_sessions_survive_retention_deleting_their_original_segments(tmp_path):
    """Retention deletes every segment that held the original records; a KV rebuilt from the log has them all."""
    b = Broker(tmp_path)
    _fill(b.sessions)
    b.settle()
    before = _snapshot(b.sessions)
    originals = [r.offset for r in b.store.commit_log.iterate(0, b.store.commit_log.max_offset)
                 if r.kind is RecordKind.SESSION]
    for _ in range(4):  # several segments of messages after them
        b.publish(100)
    for seg in b.store.commit_log.segments():
        os.utime(seg.path, (T0, T0))
    b.clock.advance(2 * 3600)  # past retention_hours: the retention loop runs
    b.store.apply_retention()
    b.settle()
    carried = [r for r in b.store.commit_log.iterate(b.store.commit_log.min_offset, b.store.commit_log.max_offset)
               if r.kind is RecordKind.SYSTEM and "CARRIED" in r.properties]
    assert len(carried) >= len(originals)
    assert b.store.commit_log.min_offset > max(originals)
    assert _snapshot(b.sessions) == before
    b.close()
    shutil.rmtree(os.path.join(str(tmp_path), "sessions"))
    b = Broker(tmp_path)
    assert _snapshot(b.sessions) == before
    b.close()


def test_old_data_dir_is_upgraded_once(tmp_path):
    """A KV written without the session log (sessions only there) is appended to the log once, then rebuildable."""
    old = Broker(tmp_path, session_log=False)
    _fill(old.sessions)
    old.settle()
    before = _snapshot(old.sessions)
    old.close()
    b = Broker(tmp_path)
    assert b.log.migrated > 0 and b.opened == [None]
    assert b.kv.get(CHECKPOINT) is not None
    assert _snapshot(b.sessions) == before
    b.close()
    b = Broker(tmp_path)
    assert b.log.migrated == 0  # once
    b.close()
    shutil.rmtree(os.path.join(str(tmp_path), "sessions"))
    b = Broker(tmp_path)
    assert _snapshot(b.sessions) == before and b.log.migrated == 0
    b.close()


def test_upgrade_cut_short_by_a_crash_is_done_again(tmp_path, monkeypatch):
    """A kill before the upgrade's records are appended leaves the KV unmarked, even when replaying the old log
    moved the checkpoint on the way: the next start upgrades it."""
    old = Broker(tmp_path, session_log=False)
    _fill(old.sessions)
    old.publish(20)  # an old log with messages, no session records
    before = _snapshot(old.sessions)
    old.close()
    monkeypatch.setattr(session_log, "CHECKPOINT_EVERY", 1)  # the replay of those messages wants a checkpoint
    b = Broker(tmp_path, settle=False)
    assert b.log.migrated > 0
    b.kv.commit()  # the KV's turn comes first (its commit was scheduled during the replay) ...
    b.crash()  # ... and the kill before the store's, which appends the upgrade
    b = Broker(tmp_path, clock=b.clock)
    assert b.log.migrated > 0
    b.close()
    shutil.rmtree(os.path.join(str(tmp_path), "sessions"))
    b = Broker(tmp_path)
    assert _snapshot(b.sessions) == before
    b.close()


def test_position_written_while_a_carry_is_on_its_way_is_kept(tmp_path):
    """A send mark moved after retention queued the carried copy of its subscription stays moved."""
    b = Broker(tmp_path, retention_check_s=1e6)  # retention runs when the test says
    b.sessions.save_session("c1", 3600, 5, None)
    b.sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1, next_offset=0))
    b.settle()
    for _ in range(4):
        b.publish(100)
    for seg in b.store.commit_log.segments():
        os.utime(seg.path, (T0, T0))
    b.clock.advance(2 * 3600)
    b.store.apply_retention()  # the carried copies are queued: appended on the next tick
    b.sessions.save_subscription("c1", "a/+", StoredSubscription("a/+", 1, next_offset=99))
    b.settle()
    assert any("CARRIED" in r.properties for r in b.store.commit_log.iterate(b.store.commit_log.min_offset))
    assert b.sessions.load("c1").subscriptions["a/+"].next_offset == 99
    b.close()
    b = Broker(tmp_path)
    assert b.sessions.load("c1").subscriptions["a/+"].next_offset == 99
    b.close()
