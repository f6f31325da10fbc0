"""A master's store with slaves: acknowledgements wait for the group (policy, hold, timeout), reads and notifies
stop at the confirm offset; a group of one and a node are unchanged."""

from __future__ import annotations

from twisted.internet import task
from twisted.internet.testing import StringTransport

import lightqueue
from cluster.replication.master import HAMaster
from cluster.replication.settings import HASettings
from store import ha_codec as codec
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.ha_sync import SyncStateSet
from store.message_store import MessageStore, PutStatus
from store.record import Message

SECRET = "s"


def _master(tmp_path, **settings):
    clock = task.Clock()
    clock.advance(1_800_000_000.0)
    store = MessageStore(str(tmp_path), StoreConfig(), clock, SynchronousExecutor())
    lightqueue.attach(store)
    store.open()
    heard: list[set] = []
    store.add_listener(heard.append)
    master = HAMaster(store, "b1", HASettings(secret=SECRET, **settings), clock)
    master.begin_epoch(1)
    master.startService()
    return master, store, clock, heard


def _slave(master, slave_id):
    """A slave connection through its handshake (acked from offset 0); returns the protocol."""
    p = master.factory.buildProtocol(None)
    t = StringTransport()
    p.makeConnection(t)
    nonce = b"n" * 16
    p.dataReceived(codec.encode(codec.Hello(slave_id, nonce)))
    challenge = codec.FrameDecoder().feed(t.value())[0]
    p.dataReceived(codec.encode(codec.Proof(codec.slave_mac(SECRET, nonce, challenge.nonce), 0)))
    p.dataReceived(codec.encode(codec.Ack(0)))
    return p


def _put(store, clock, topic="t/1"):
    got = []
    store.put(Message(topic, b"x", qos=1)).addCallback(got.append)
    clock.advance(0)
    return got


def _read(store, queue="%TOPIC%t"):
    out = []
    store.get(queue, 0, 100).addCallback(out.append)
    return [m.record.body for m in out[0]]


def _joined(master, clock, *slaves):
    ps = [_slave(master, s) for s in slaves]
    clock.advance(master.settings.check_interval_s)
    assert master.sync.members == {"b1", *slaves}
    return ps


def test_a_group_of_one_acknowledges_and_shows_at_once(tmp_path):
    """A master whose set is itself answers the put in the same tick and notifies: nothing waits."""
    master, store, clock, heard = _master(tmp_path)
    got = _put(store, clock)
    assert [r.status for r in got] == [PutStatus.PUT_OK]
    assert heard and _read(store) == [b"x"]
    master.stopService()
    store.close()


def test_a_publish_is_acknowledged_only_once_every_member_holds_it(tmp_path):
    """all_ack_in_sync_state_set: the put is answered once the slave's ack passed the record's end, not before."""
    master, store, clock, heard = _master(tmp_path)
    (slave,) = _joined(master, clock, "b2")
    got = _put(store, clock)
    assert got == []
    clock.advance(1.0)
    assert got == []
    slave.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    assert [r.status for r in got] == [PutStatus.PUT_OK]
    master.stopService()
    store.close()


def test_a_record_above_the_confirm_offset_is_neither_read_nor_notified(tmp_path):
    """Readers (light and topic queues) and watchers see a record only once the whole set holds it."""
    master, store, clock, heard = _master(tmp_path)
    (slave,) = _joined(master, clock, "b2")
    heard.clear()
    _put(store, clock)
    assert _read(store) == [] and heard == []
    assert store.gate.held == 1
    slave.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    assert _read(store) == [b"x"]
    assert heard and "%TOPIC%t" in heard[-1]
    master.stopService()
    store.close()


def test_an_acknowledgement_not_replicated_in_time_is_refused_as_unavailable(tmp_path):
    """A slave that stops acking: after ack_timeout_s the put answers FLUSH_SLAVE_TIMEOUT, never PUT_OK."""
    master, store, clock, heard = _master(tmp_path, ack_timeout_s=2.0, max_time_not_caught_up_s=60.0)
    _joined(master, clock, "b2")
    got = _put(store, clock)
    clock.advance(1.9)
    assert got == []
    clock.advance(0.2)
    assert [r.status for r in got] == [PutStatus.FLUSH_SLAVE_TIMEOUT]
    assert "not replicated" in got[0].reason
    master.stopService()
    store.close()


def test_a_set_below_min_in_sync_replicas_holds_then_answers_once_a_slave_joins(tmp_path):
    """min_in_sync_replicas 2 with the master alone: the put waits (no PUT_OK) until a slave joins and holds it."""
    master, store, clock, heard = _master(tmp_path, min_in_sync_replicas=2, ack_timeout_s=30.0)
    got = _put(store, clock)
    clock.advance(1.0)
    assert got == []
    slave = _slave(master, "b2")
    slave.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    clock.advance(master.settings.check_interval_s)  # the set expands
    assert master.sync.members == {"b1", "b2"}
    assert [r.status for r in got] == [PutStatus.PUT_OK]
    master.stopService()
    store.close()


def test_min_in_sync_replicas_copies_are_enough_without_all_ack(tmp_path):
    """all_ack false, min 2 in a set of 3: one slave's ack is enough to answer; the read still waits for both."""
    master, store, clock, heard = _master(tmp_path, all_ack=False, min_in_sync_replicas=2)
    s2, s3 = _joined(master, clock, "b2", "b3")
    got = _put(store, clock)
    assert got == []
    s2.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    assert [r.status for r in got] == [PutStatus.PUT_OK]
    assert _read(store) == []
    s3.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    assert _read(store) == [b"x"]
    master.stopService()
    store.close()


def test_stopping_as_master_answers_held_puts_and_lifts_the_gate(tmp_path):
    """A master that stops (it becomes a slave) answers its held puts unavailable and its store has no gate."""
    master, store, clock, heard = _master(tmp_path)
    _joined(master, clock, "b2")
    got = _put(store, clock)
    master.stopService()
    assert [r.status for r in got] == [PutStatus.FLUSH_SLAVE_TIMEOUT]
    assert store.gate.read_limit is None and store.gate.ack_wait is None
    store.close()


def test_ack_offset_follows_the_policy():
    """SyncStateSet.ack_offset: the confirm offset (all ack), the k-th copy (not all ack), None below the minimum."""
    s = SyncStateSet("m", {"a", "b"})
    for sid, off in (("a", 100), ("b", 40)):
        s.connected(sid, off, False, 0.0)
    assert s.ack_offset(150, True, 1) == 40
    assert s.ack_offset(150, False, 2) == 100
    assert s.ack_offset(150, False, 3) == 40
    assert s.ack_offset(150, True, 4) is None


def test_a_batch_acknowledged_by_the_group_tells_its_submitter_where_its_records_went(tmp_path):
    """With slaves, the confirm offset reaches readers before the acknowledgement fires: the batch's answer carries
    its entries in the watched queue (the proxy answers its own sessions' reads from them), not None."""
    master, store, clock, heard = _master(tmp_path)
    (slave,) = _joined(master, clock, "b2")
    answers = []
    store.submit_batch([Message("t/1", b"x", qos=1), Message("t/1", b"y", qos=1)],
                       lambda results, indexed: answers.append((results, indexed)), wanted={"%TOPIC%t": 1})
    clock.advance(0)
    assert answers == []
    slave.dataReceived(codec.encode(codec.Ack(store.commit_log.max_offset)))
    ((results, indexed),) = answers
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 2
    assert indexed is not None and indexed.firsts == {"%TOPIC%t": 0}
    master.stopService()
    store.close()
