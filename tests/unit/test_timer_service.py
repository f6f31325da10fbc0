"""Unit tests of the timer service: TIMER records in, real messages out, recovery after a crash.

Time is a task.Clock; blocking work runs inline (SynchronousExecutor) or when the
test says so (DeferredExecutor). A crash drops every object without closing it.
"""

import json
import os

import pytest
from twisted.internet import task

import lightqueue
from store.config import StoreConfig
from store.executor import DeferredExecutor, SynchronousExecutor
from store.message_store import MessageStore, PutStatus
from store.record import Message, RecordKind
from store.timer_service import CHECKPOINT_FILE, ORIGIN, TimerNotFound, TimerService

T0 = 1_800_000_000.0
T0_MS = int(T0 * 1000)


class Node:
    """A store + light-queue index + timer service on one clock, restartable as after kill -9."""

    def __init__(self, path, executor=None, clock=None, timer_executor=None, **kw):
        self.path = str(path)
        self.clock = clock or task.Clock()
        if clock is None:
            self.clock.advance(T0)
        cfg = kw.pop("store_cfg", {})
        self.store = MessageStore(self.path, StoreConfig(segment_size=256 * 1024, **cfg), self.clock,
                                  executor or SynchronousExecutor())
        self.index = lightqueue.attach(self.store)
        kw.setdefault("slot_count", 600)
        self.timers = TimerService(self.store, os.path.join(self.path, "timer"), self.clock, 100,
                                   executor=timer_executor, **kw)
        self.store.open()
        self.timers.start()

    def now_ms(self):
        return int(self.clock.seconds() * 1000)

    def put(self, message):
        out = []
        self.store.put(message).addCallback(out.append)
        self.clock.advance(0)
        return out[0]

    def schedule(self, message, at_ms):
        out = []
        self.timers.schedule(message, at_ms).addCallback(out.append)
        self.clock.advance(0)
        return out[0]

    def cancel(self, timer_id):
        """The cancel's result, or the exception it failed with."""
        out = []
        self.timers.cancel(timer_id).addBoth(out.append)
        self.clock.advance(0)
        result = out[0]
        return result.value if hasattr(result, "value") else result

    def bodies(self, queue):
        return [r.body for r in self.records(queue)]

    def records(self, queue):
        got = []
        while True:
            out = []
            self.store.get(queue, len(got), 1000).addCallback(out.append)
            if not out[0]:
                return got
            got.extend(m.record for m in out[0])

    def run_for(self, seconds, step=0.1):
        for _ in range(int(round(seconds / step))):
            self.clock.advance(step)

    def crash(self):
        """Drop everything as kill -9 would: buffered timer units are lost, nothing is flushed or saved."""
        tl = self.timers.timer.log
        os.close(tl._write_fd)
        for fd in tl._read_fds.values():
            os.close(fd)
        self.timers._closed = True
        self.index.close()
        self.store.commit_log.close()
        os.close(self.store._lock_fd)

    def restart(self, **kw):
        self.crash()
        clock = task.Clock()
        clock.advance(self.clock.seconds())
        return Node(self.path, clock=clock, **kw)


def test_message_comes_out_at_its_time_and_not_before(tmp_path):
    """A scheduled publish is invisible until due, then indexed in its topic queue with its ORIGIN."""
    n = Node(tmp_path)
    r = n.schedule(Message("dev/1/cmd", b"hello", qos=1, client_id="c1", properties={"k": "v"}), n.now_ms() + 1500)
    assert r.status is PutStatus.PUT_OK and r.queues == ()
    n.run_for(1.3)
    assert n.bodies("%TOPIC%dev") == []
    n.run_for(0.4)
    (rec,) = n.records("%TOPIC%dev")
    assert (rec.kind, rec.body, rec.qos, rec.client_id) == (RecordKind.MQTT_PUBLISH, b"hello", 1, "c1")
    assert rec.properties["k"] == "v" and rec.properties[ORIGIN] == str(r.offset)
    assert "TIMER_AT" not in rec.properties
    n.run_for(2)
    assert n.bodies("%TOPIC%dev") == [b"hello"]


def test_ticks_further_apart_than_the_checkpoint_interval_still_deliver(tmp_path):
    """A reactor that runs the timer only every few seconds (busy or stalled) still gets messages out."""
    n = Node(tmp_path)
    n.schedule(Message("dev/1/cmd", b"late"), n.now_ms() + 20_000)
    for _ in range(8):
        n.clock.advance(5)  # one tick per 5 s: every tick also wants a checkpoint (interval 1 s)
    assert n.bodies("%TOPIC%dev") == [b"late"]


def test_native_message_with_targets_reaches_every_queue(tmp_path):
    """A delayed native message keeps its TARGETS property, so a virtual queue fans out when due."""
    n = Node(tmp_path)
    n.schedule(Message("v", b"x", RecordKind.NATIVE_MESSAGE, properties={"TARGETS": "a,b"}), n.now_ms() + 200)
    n.run_for(0.5)
    assert n.bodies("%QUEUE%a") == [b"x"] and n.bodies("%QUEUE%b") == [b"x"]


def test_order_follows_delivery_time(tmp_path):
    """Messages come out in delivery-time order, whatever order they were scheduled in."""
    n = Node(tmp_path)
    now = n.now_ms()
    for i, delay in enumerate([900, 300, 600, 100]):
        n.schedule(Message("o", b"%d" % i), now + delay)
    n.run_for(1.2)
    assert n.bodies("%TOPIC%o") == [b"3", b"1", b"2", b"0"]


def test_crash_before_checkpoint_loses_nothing(tmp_path):
    """TIMER records written after the last checkpoint are replayed from the commit log after kill -9."""
    n = Node(tmp_path, checkpoint_interval_s=1000)
    for i in range(5):
        n.schedule(Message("c", b"%d" % i), n.now_ms() + 3000 + i)
    n = n.restart(checkpoint_interval_s=1000)
    n.run_for(2.5)
    assert n.bodies("%TOPIC%c") == []
    n.run_for(1.0)
    assert n.bodies("%TOPIC%c") == [b"0", b"1", b"2", b"3", b"4"]


def test_crash_after_checkpoint_resumes_from_it(tmp_path):
    """A checkpoint then more schedules then kill -9: every message comes out exactly once."""
    n = Node(tmp_path, checkpoint_interval_s=0.5)
    n.schedule(Message("c", b"early"), n.now_ms() + 5000)
    n.run_for(1.0)
    assert n.timers.checkpoints >= 1
    n.schedule(Message("c", b"late"), n.now_ms() + 5000)
    n = n.restart(checkpoint_interval_s=0.5)
    n.run_for(6.0)
    assert sorted(n.bodies("%TOPIC%c")) == [b"early", b"late"]


def test_delivery_after_checkpoint_is_not_repeated_after_a_crash(tmp_path):
    """Delivered after the saved checkpoint, then kill -9: the replay finds the delivery in the log, so the entry
    the wheel hands out again is dropped (exactly once)."""
    n = Node(tmp_path, checkpoint_interval_s=1000)
    n.schedule(Message("d", b"m"), n.now_ms() + 300)
    n.run_for(0.5)
    assert n.bodies("%TOPIC%d") == [b"m"]
    n = n.restart(checkpoint_interval_s=1000)
    n.run_for(0.5)
    assert n.bodies("%TOPIC%d") == [b"m"]
    assert n.timers.skipped == 1


def test_delivery_before_saved_checkpoint_is_not_repeated(tmp_path):
    """Once a checkpoint covers a delivery, a restart does not deliver it again."""
    n = Node(tmp_path, checkpoint_interval_s=0.2)
    n.schedule(Message("d", b"m"), n.now_ms() + 300)
    n.run_for(1.0)
    n = n.restart(checkpoint_interval_s=0.2)
    n.run_for(1.0)
    assert n.bodies("%TOPIC%d") == [b"m"]


def test_clean_stop_saves_a_final_checkpoint(tmp_path):
    """stop() then store.close(): a new service resumes with nothing lost and nothing repeated."""
    n = Node(tmp_path, checkpoint_interval_s=1000)
    n.schedule(Message("s", b"done"), n.now_ms() + 100)
    n.schedule(Message("s", b"pending"), n.now_ms() + 5000)
    n.run_for(0.5)
    done = []
    n.timers.stop().addCallback(done.append)
    assert done == [None]
    n.store.close()
    with open(os.path.join(tmp_path, "timer", CHECKPOINT_FILE)) as f:
        assert json.load(f)["dispatched_offset"] == n.store.commit_log.max_offset
    clock = task.Clock()
    clock.advance(n.clock.seconds())
    n2 = Node(tmp_path, clock=clock)
    n2.run_for(5.0)
    assert n2.bodies("%TOPIC%s") == [b"done", b"pending"]


def test_checkpoint_waits_for_delivery_puts(tmp_path):
    """With sync flush, no checkpoint is saved while a delivered message's put is still unacknowledged."""
    ex = DeferredExecutor()
    n = Node(tmp_path, executor=ex, store_cfg={"flush": "sync"}, checkpoint_interval_s=0.1)
    n.timers.schedule(Message("b", b"x"), n.now_ms() + 100)
    n.clock.advance(0)
    ex.run_pending()
    n.run_for(0.3)
    assert n.timers.stats()["timer_puts_in_flight"] == 1
    before = n.timers.checkpoints
    n.run_for(0.5)
    assert n.timers.checkpoints == before
    ex.run_pending()
    assert n.timers.checkpoints == before + 1
    assert n.timers.delivered == 1


def test_long_delay_hops_and_keeps_its_identity(tmp_path):
    """A delay longer than hop_ms re-parks a copy; the message comes out once, on time, with its first ORIGIN."""
    n = Node(tmp_path, hop_ms=1000)
    r = n.schedule(Message("h", b"far"), n.now_ms() + 3500)
    n.run_for(3.3)
    assert n.bodies("%TOPIC%h") == [] and n.timers.hops >= 2
    n.run_for(0.4)
    (rec,) = n.records("%TOPIC%h")
    assert rec.properties[ORIGIN] == str(r.offset)


def test_past_due_time_comes_out_at_once(tmp_path):
    """A delivery time already in the past is delivered on the next tick."""
    n = Node(tmp_path)
    n.schedule(Message("p", b"x"), n.now_ms() - 10_000)
    n.run_for(0.2)
    assert n.bodies("%TOPIC%p") == [b"x"]


def test_timer_record_cannot_be_scheduled(tmp_path):
    """Scheduling a TIMER-kind message is refused as illegal."""
    n = Node(tmp_path)
    r = n.schedule(Message("x", b"", RecordKind.TIMER), n.now_ms())
    assert r.status is PutStatus.MESSAGE_ILLEGAL


def test_created_after_open_is_refused(tmp_path):
    """The service must be registered before the store replays, so creating it late is an error."""
    clock = task.Clock()
    store = MessageStore(str(tmp_path), StoreConfig(), clock, SynchronousExecutor())
    lightqueue.attach(store)
    store.open()
    with pytest.raises(RuntimeError, match="before store.open"):
        TimerService(store, str(tmp_path / "timer"), clock)


def test_many_messages_each_delivered_once(tmp_path):
    """Two thousand messages over two seconds, with checkpoints along the way, each come out exactly once."""
    n = Node(tmp_path, checkpoint_interval_s=0.3, max_per_tick=300)
    now = n.now_ms()
    msgs = [Message("m", b"%d" % i) for i in range(2000)]
    for i, m in enumerate(msgs):
        n.timers.schedule(m, now + (i * 7919) % 2000)
    n.clock.advance(0)
    n.run_for(3.0)
    got = n.bodies("%TOPIC%m")
    assert sorted(got) == sorted(m.body for m in msgs)
    assert n.timers.stats()["timer_delivered_total"] == 2000


def test_cancel_before_due_is_never_delivered(tmp_path):
    """A timer cancelled before its time answers True and never comes out; its neighbour still does."""
    n = Node(tmp_path)
    r = n.schedule(Message("x", b"cancelled"), n.now_ms() + 1000)
    n.schedule(Message("x", b"kept"), n.now_ms() + 1000)
    n.run_for(0.5)
    assert n.cancel(r.offset) is True
    n.run_for(1.0)
    assert n.bodies("%TOPIC%x") == [b"kept"]
    assert n.timers.stats()["timer_cancelled_total"] == 1


def test_cancel_after_delivery_answers_false(tmp_path):
    """Cancelling a timer that already came out answers False and changes nothing."""
    n = Node(tmp_path)
    r = n.schedule(Message("x", b"m"), n.now_ms() + 200)
    n.run_for(0.5)
    assert n.cancel(r.offset) is False
    n.run_for(0.5)
    assert n.bodies("%TOPIC%x") == [b"m"]


def test_cancel_of_what_is_no_timer_fails(tmp_path):
    """An id outside the log, or of a record that is not a TIMER record, fails with TimerNotFound."""
    n = Node(tmp_path)
    plain = n.put(Message("x", b"plain"))
    assert isinstance(n.cancel(plain.offset), TimerNotFound)
    assert isinstance(n.cancel(10**9), TimerNotFound)
    assert isinstance(n.cancel(plain.offset + 1), TimerNotFound)  # inside a record: no record starts there


def test_cancel_of_a_hopping_message_stops_every_copy(tmp_path):
    """A long delay re-parks copies of itself; cancelling by its first id stops the copies too."""
    n = Node(tmp_path, hop_ms=1000)
    r = n.schedule(Message("h", b"far"), n.now_ms() + 3500)
    n.run_for(1.5)
    assert n.timers.hops >= 1
    assert n.cancel(r.offset) is True
    n.run_for(3.0)
    assert n.bodies("%TOPIC%h") == []


def test_cancel_survives_a_crash_before_checkpoint(tmp_path):
    """kill -9 after the cancel but before any checkpoint: replaying the log cancels it again."""
    n = Node(tmp_path, checkpoint_interval_s=1000)
    r = n.schedule(Message("c", b"m"), n.now_ms() + 2000)
    assert n.cancel(r.offset) is True
    n = n.restart(checkpoint_interval_s=1000)
    n.run_for(3.0)
    assert n.bodies("%TOPIC%c") == []


def test_cancel_survives_a_crash_after_checkpoint(tmp_path):
    """A checkpoint taken after the cancel carries it (the log is not replayed from before it)."""
    n = Node(tmp_path, checkpoint_interval_s=0.2)
    r = n.schedule(Message("c", b"m"), n.now_ms() + 3000)
    assert n.cancel(r.offset) is True
    n.run_for(1.0)
    with open(os.path.join(tmp_path, "timer", CHECKPOINT_FILE)) as f:
        assert json.load(f)["cancelled"] == {str(r.offset): T0_MS + 3000}
    n = n.restart(checkpoint_interval_s=0.2)
    n.run_for(3.0)
    assert n.bodies("%TOPIC%c") == []
    with open(os.path.join(tmp_path, "timer", CHECKPOINT_FILE)) as f:
        assert json.load(f)["cancelled"] == {}  # forgotten once its slot was read past


def test_checkpoint_is_written_off_the_reactor_and_counts_only_once_saved(tmp_path, monkeypatch):
    """The tick takes the checkpoint and returns without an fsync; until the executor has written it, the file and
    dispatched_offset stay as they were, delivery goes on, and no second checkpoint starts."""
    store_ex, timer_ex = DeferredExecutor(), DeferredExecutor()
    n = Node(tmp_path, store_ex, checkpoint_interval_s=1.0, wheel_snapshot_s=0.5, timer_executor=timer_ex)
    path = os.path.join(n.path, "timer", CHECKPOINT_FILE)
    n.schedule(Message("c", b"x"), n.now_ms() + 1500)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    n.run_for(1.2)
    assert len(timer_ex.pending) == 1 and fsyncs == [], "checkpoint taken; its fsyncs wait on the executor"
    assert not os.path.exists(path) and n.timers.dispatched_offset == 0 and n.timers.checkpoints == 0
    n.run_for(1.3)  # due at 1.5 s; the next checkpoint falls due at 2.2 s
    assert n.bodies("%TOPIC%c") == [b"x"], "the wheel goes on while the checkpoint is being saved"
    assert len(timer_ex.pending) == 1 and fsyncs == [], "the next checkpoint waits for this one"
    timer_ex.run_pending()
    assert len(fsyncs) >= 4, "timer log, wheel snapshot and its directory, checkpoint file and its directory"
    with open(path) as f:
        saved = json.load(f)
    assert n.timers.checkpoints == 1 and n.timers.dispatched_offset == saved["dispatched_offset"] > 0
    assert os.path.exists(os.path.join(n.path, "timer", "timer", "wheel"))


def test_stop_waits_for_the_checkpoint_being_saved_then_saves_the_last(tmp_path):
    """stop() lets a checkpoint in flight finish before the final, synchronous one, which is the one on disk."""
    timer_ex = DeferredExecutor()
    n = Node(tmp_path, checkpoint_interval_s=1.0, timer_executor=timer_ex)
    n.schedule(Message("c", b"x"), n.now_ms() + 60_000)
    n.run_for(1.2)
    assert len(timer_ex.pending) == 1
    stopped = []
    n.timers.stop().addCallback(stopped.append)
    assert stopped == [], "the checkpoint being saved is waited for"
    timer_ex.run_pending()
    assert stopped == [None] and n.timers.checkpoints == 2
    with open(os.path.join(n.path, "timer", CHECKPOINT_FILE)) as f:
        assert json.load(f)["dispatched_offset"] == n.store.commit_log.max_offset


def test_entries_come_out_within_a_tick_of_their_time_not_a_slot(tmp_path):
    """With 10 ms ticks inside 100 ms slots, each entry goes out on the first tick at or after its time."""
    n = Node(tmp_path)
    start = n.now_ms()
    lateness = []
    n.timers.on_deliver = lambda at, now: lateness.append(now - at)
    dues = [start + 1000 + d for d in (1, 17, 33, 49, 71, 99, 101, 150)]
    for i, at in enumerate(dues):
        n.schedule(Message("x", b"%d" % i), at)
    n.run_for(1.4, step=0.01)
    assert len(lateness) == len(dues)
    assert min(lateness) >= 0 and max(lateness) <= 10  # a tick, not up to a whole slot (100 ms) plus a tick


def test_cancel_while_its_slot_is_read_ahead_is_honoured(tmp_path):
    """A timer whose slot has been read ahead but which is not due yet can still be cancelled."""
    n = Node(tmp_path)
    start = n.now_ms()
    r = n.schedule(Message("x", b"cancelled"), start + 1095)
    n.schedule(Message("x", b"early"), start + 1005)
    n.run_for(1.02, step=0.01)  # the slot ending at +1100 is read; "early" is out, "cancelled" waits
    assert n.bodies("%TOPIC%x") == [b"early"]
    assert n.cancel(r.offset) is True
    n.run_for(0.5, step=0.01)
    assert n.bodies("%TOPIC%x") == [b"early"]


def test_a_burst_due_at_once_goes_out_a_budget_per_tick(tmp_path):
    """A thousand messages due at the same time go out at most max_per_tick per tick (short reactor turns), all of them."""
    n = Node(tmp_path, max_per_tick=100)
    at = n.now_ms() + 500
    for i in range(1000):
        n.timers.schedule(Message("burst", b"%d" % i), at)
    n.clock.advance(0)
    handed_out = []
    while n.timers.stats()["timer_delivered_total"] < 1000 and len(handed_out) < 200:
        before = n.timers.stats()["timer_delivered_total"]
        n.clock.advance(0.01)
        handed_out.append(n.timers.stats()["timer_delivered_total"] - before)
        if handed_out[-1] and len([k for k in handed_out if k]) == 1:
            assert n.now_ms() >= at, "handed out before its time"
    assert sum(handed_out) == 1000
    assert max(handed_out) <= 100 and len([k for k in handed_out if k]) >= 10
    assert sorted(n.bodies("%TOPIC%burst")) == sorted(b"%d" % i for i in range(1000))
