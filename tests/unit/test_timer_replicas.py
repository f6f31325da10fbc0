"""Timers on a broker group: a slave's timer state follows its replicated log; promoted, it delivers exactly the
timers its old master had not; a truncation rolls the timer state back with the log.

A master and a slave are two stores, each on its own task.Clock (``run`` advances them together; advancing one
alone makes the other's clock lag); replication is the master's raw log appended on the slave
(``append_replicated``, what the HA channel does); kill -9 drops objects unclosed (``Node.crash``).
"""

import os
from collections import Counter

from twisted.internet import task

import lightqueue
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.ha_connection import decode_records
from store.message_store import MessageStore
from store.record import Message, RecordKind
from store.timer import TimerEntry
from store.timer_ledger import TIMER_FROM, TimerLedger, consumed_mark, parse_mark
from store.timer_service import TimerService
from tests.unit.test_timer_service import T0, Node


class Broker(Node):
    """A Node that starts as a slave (``replica_of`` set before anything runs) or as a master."""

    def __init__(self, path, clock, slave: bool, **kw):
        self.path = str(path)
        self.clock = clock
        self.store = MessageStore(self.path, StoreConfig(segment_size=256 * 1024), clock, SynchronousExecutor())
        if slave:
            self.store.replica_of = "the master"
        self.index = lightqueue.attach(self.store)
        kw.setdefault("slot_count", 600)
        self.timers = TimerService(self.store, os.path.join(self.path, "timer"), clock, 100, **kw)
        self.store.open()
        self.timers.start()  # as a broker does: the timers start with the store ...
        if slave:
            self.timers.pause()  # ... and its replication role pauses them on a slave (cluster/roles/broker.py)

    def promote(self):
        self.store.replica_of = ""
        self.timers.start()

    def relaunch(self, slave: bool, **kw):
        self.crash()
        return Broker(self.path, self.clock, slave, **kw)

    def delivered(self, topic):
        """Bodies of the real (non-TIMER) records on ``topic`` in the log, in log order."""
        return [r.body for r in self.store.commit_log.iterate(0, self.store.commit_log.max_offset)
                if r.topic == topic and r.kind != RecordKind.TIMER and not r.topic.startswith("$")
                and r.kind == RecordKind.MQTT_PUBLISH]


def _clock():
    clock = task.Clock()
    clock.advance(T0)
    return clock


def replicate(master, slave, upto=None):
    """Append the master's log from the slave's end to ``upto`` (default: the master's end) on the slave."""
    start = slave.store.commit_log.max_offset
    end = master.store.commit_log.max_offset if upto is None else upto
    if end <= start:
        return
    raw = master.store.commit_log.read_raw(start, end - start)
    slave.store.append_replicated(start, raw, decode_records(raw, start))
    slave.clock.advance(0)


def _delivery_offset(node, body):
    return next(r.offset for r in node.store.commit_log.iterate(0, node.store.commit_log.max_offset)
                if r.body == body and r.kind != RecordKind.TIMER)


def _group(tmp_path, **kw):
    master = Broker(tmp_path / "m", _clock(), slave=False, **kw)
    slave = Broker(tmp_path / "s", _clock(), slave=True, **kw)
    return master, slave


def run(nodes, seconds, step=0.1):
    """Advance every node's clock together."""
    for _ in range(int(round(seconds / step))):
        for n in nodes:
            n.clock.advance(step)


def test_a_promoted_slave_delivers_exactly_what_its_master_had_not(tmp_path):
    """A delivered and replicated, B delivered by the master but not replicated (it died), C not due yet: the
    promoted slave delivers B and C, never A again; while a slave it wrote nothing."""
    master, slave = _group(tmp_path)
    now = master.now_ms()
    for body, delay in ((b"A", 300), (b"B", 2000), (b"C", 5000)):
        master.schedule(Message("t", body, qos=1), now + delay)
    replicate(master, slave)
    run([master, slave], 1.0)
    replicate(master, slave)
    assert master.delivered("t") == [b"A"]
    end = slave.store.commit_log.max_offset
    run([master, slave], 1.5)
    assert master.delivered("t") == [b"A", b"B"]  # B's delivery never reaches the slave
    assert slave.store.commit_log.max_offset == end  # the slave followed: not a byte of its own
    slave.promote()
    run([slave], 4.0)
    assert Counter(slave.delivered("t")) == {b"A": 1, b"B": 1, b"C": 1}


def test_a_slave_that_sees_the_delivery_before_its_own_clock_says_due_drops_it(tmp_path):
    """The master's delivery replicates before the slave's wheel reaches the slot (its clock lags): the copy is
    remembered consumed and dropped when it comes out; promoted, the slave never delivers it."""
    master, slave = _group(tmp_path)
    master.schedule(Message("t", b"A"), master.now_ms() + 300)
    replicate(master, slave)
    run([master], 1.0)
    replicate(master, slave)
    slave.promote()
    run([master, slave], 1.0)
    assert slave.delivered("t") == [b"A"]
    assert slave.timers.skipped == 1 and not slave.timers.ledger.done


def test_what_a_slave_holds_for_its_master_survives_its_kill(tmp_path):
    """B came due on the slave (held for the master), a checkpoint saved it, kill -9, relaunch as slave, then
    promotion: B is delivered once and A, delivered by the old master, not again."""
    master, slave = _group(tmp_path, checkpoint_interval_s=0.2)
    now = master.now_ms()
    master.schedule(Message("t", b"A"), now + 300)
    master.schedule(Message("t", b"B"), now + 1500)
    replicate(master, slave)
    run([master, slave], 1.0)
    replicate(master, slave)
    run([master, slave], 1.0)  # B delivered on the master only
    slave = slave.relaunch(slave=True, checkpoint_interval_s=0.2)
    run([slave], 1.0)
    assert slave.delivered("t") == [b"A"]  # a slave delivers nothing itself
    slave.promote()
    run([slave], 1.0)
    assert Counter(slave.delivered("t")) == {b"A": 1, b"B": 1}


def _truncated_slave(tmp_path, checkpoint_interval_s):
    """A slave that holds A's and B's deliveries; the cut goes between them (B's delivery is not the new
    master's)."""
    master, slave = _group(tmp_path, checkpoint_interval_s=checkpoint_interval_s)
    now = master.now_ms()
    master.schedule(Message("t", b"A"), now + 300)
    master.schedule(Message("t", b"B"), now + 1500)
    master.schedule(Message("t", b"C"), now + 4000)
    replicate(master, slave)
    run([master, slave], 1.0)
    replicate(master, slave)
    cut = slave.store.commit_log.max_offset
    run([master, slave], 1.0)  # B comes due on both; the slave checkpoints (if due) below the cut
    replicate(master, slave)
    assert slave.delivered("t") == [b"A", b"B"] and _delivery_offset(slave, b"B") >= cut
    return slave, cut


def test_truncation_back_to_the_saved_checkpoint_rearms_the_cut_delivery(tmp_path):
    """The cut removes B's delivery; the slave's checkpoint below the cut is taken back and the log replayed to
    the cut: promoted, it delivers B (and C) once, A never again."""
    slave, cut = _truncated_slave(tmp_path, checkpoint_interval_s=0.3)
    slave.store.truncate(cut)
    assert 0 < slave.timers.dispatched_offset <= cut  # taken back, not rebuilt from offset 0
    run([slave], 0.2)
    slave.promote()
    run([slave], 3.0)
    assert Counter(slave.delivered("t")) == {b"A": 1, b"B": 1, b"C": 1}


def test_truncation_past_every_checkpoint_rebuilds_from_the_log_exactly(tmp_path):
    """No checkpoint below the cut: the timer state is rebuilt from the whole log, which says A was delivered;
    promoted, the slave delivers B (whose delivery was cut) and C once, A never again."""
    slave, cut = _truncated_slave(tmp_path, checkpoint_interval_s=1000)
    slave.timers.checkpoint()  # a checkpoint past the cut: useless to roll back to
    assert slave.timers.dispatched_offset > cut
    slave.store.truncate(cut)
    run([slave], 0.2)
    slave.promote()
    run([slave], 3.0)
    assert Counter(slave.delivered("t")) == {b"A": 1, b"B": 1, b"C": 1}


def test_a_truncated_slave_restarted_keeps_its_rolled_back_state(tmp_path):
    """After a truncation and a kill -9, the relaunched slave promoted still owes B once and A never."""
    slave, cut = _truncated_slave(tmp_path, checkpoint_interval_s=0.3)
    slave.store.truncate(cut)
    run([slave], 0.5)
    slave = slave.relaunch(slave=True, checkpoint_interval_s=0.3)
    slave.promote()
    run([slave], 3.0)
    assert Counter(slave.delivered("t")) == {b"A": 1, b"B": 1, b"C": 1}


def test_a_hop_replicated_consumes_the_copy_it_replaced(tmp_path):
    """A long delay hops on the master; the slave, promoted after the hop replicated, delivers the message once
    (from the hop), not the first copy as well."""
    master, slave = _group(tmp_path, hop_ms=1000)
    master.schedule(Message("t", b"far"), master.now_ms() + 2500)
    replicate(master, slave)
    run([master, slave], 1.5)
    replicate(master, slave)
    assert master.timers.hops >= 1
    slave.promote()
    run([slave], 2.0)
    assert slave.delivered("t") == [b"far"]


def test_a_cancel_on_the_master_drops_what_the_slave_holds(tmp_path):
    """The slave's clock runs ahead: B comes due there first; the master cancels it before its own slot; the
    cancel replicates and the promoted slave does not deliver B."""
    master, slave = _group(tmp_path)
    r = master.schedule(Message("t", b"B"), master.now_ms() + 1000)
    replicate(master, slave)
    run([slave], 1.5)
    assert master.cancel(r.offset) is True
    replicate(master, slave)
    slave.promote()
    run([slave], 1.0)
    assert slave.delivered("t") == []


def test_ledger_tracks_consumed_pending_and_inflight_copies():
    """Pure ledger: a follower's due entries wait until consumed; a consumed copy not yet handed out is dropped
    when it comes; one's own deliveries leave nothing behind; collect forgets what the wheel passed."""
    ledger = TimerLedger(100)
    a, b, c = TimerEntry(10, 5, 1_050, 0), TimerEntry(20, 5, 1_100, 0), TimerEntry(30, 5, 2_000, 0)
    assert ledger.follow([a, b]) == 2
    assert ledger.consumed(consumed_mark(a), read_time_ms=1_200)
    assert list(ledger.pending) == [20]
    ledger.consumed(consumed_mark(c), read_time_ms=1_200)  # not handed out here yet
    assert ledger.done == {30: 2_000}
    assert ledger.follow([c]) == 0 and not ledger.done
    ledger.inflight.add("40:2100")
    ledger.consumed("40:2100", read_time_ms=2_200)
    assert not ledger.inflight and not ledger.done
    ledger.consumed("50:1950", read_time_ms=2_200)
    assert ledger.done == {50: 2_200}
    assert not ledger.consumed("garbage", read_time_ms=2_200)
    assert ledger.collect(2_200) == 0 and ledger.collect(2_300) == 1
    saved = ledger.to_json()
    other = TimerLedger(100)
    other.load(saved)
    assert other.pending == {20: b} and other.take_pending() == [b] and not other.pending
    assert parse_mark(consumed_mark(b)) == (20, 1_100) and parse_mark("x") is None and parse_mark("1:y") is None
    assert TIMER_FROM == "TIMER_FROM"


def test_a_delivery_written_but_not_replicated_in_time_is_not_put_again(tmp_path):
    """The group does not confirm a delivery within the timeout (FLUSH_SLAVE_TIMEOUT): the record is in the log
    all the same, so the timer counts it delivered instead of appending it again and again."""
    from twisted.internet import defer

    master = Broker(tmp_path / "m", _clock(), slave=False)
    master.store.gate.ack_wait = lambda log_end: defer.fail(RuntimeError("no quorum"))
    master.schedule(Message("t", b"A"), master.now_ms() + 300)  # its own ack fails too: written all the same
    run([master], 1.5)
    assert master.delivered("t") == [b"A"]


def test_a_delivery_from_before_the_marks_is_known_by_its_origin(tmp_path):
    """An upgraded data directory: the log holds a delivery written before deliveries named their copy (only
    ``ORIGIN``). Rebuilt from the log (its timer directory gone), the timer does not deliver it again."""
    import shutil

    from store.timer_service import ORIGIN

    node = Broker(tmp_path / "n", _clock(), slave=False)
    node.timers.pause()  # the old code's delivery is written by hand below
    timer = node.schedule(Message("t", b"A"), node.now_ms() + 300)
    node.put(Message("t", b"A", properties={ORIGIN: str(timer.offset)}))
    node.crash()
    shutil.rmtree(os.path.join(node.path, "timer"))
    node = Broker(node.path, node.clock, slave=False)
    run([node], 1.0)
    assert node.delivered("t") == [b"A"]
