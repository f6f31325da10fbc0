"""The master's replication adapter over StringTransport and task.Clock: connections of one slave id, and ids."""

from __future__ import annotations

from twisted.internet import task
from twisted.internet.protocol import connectionDone
from twisted.internet.testing import StringTransport

from cluster.replication.master import HAMaster
from cluster.replication.settings import HASettings
from store import ha_codec as codec
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore

SECRET = "s"


def _master(tmp_path):
    clock = task.Clock()
    store = MessageStore(str(tmp_path), StoreConfig(), clock, SynchronousExecutor())
    store.open()
    master = HAMaster(store, "b1", HASettings(secret=SECRET), clock)
    master.begin_epoch(1)
    master.startService()
    return master, store, clock


def _handshake(master, slave_id):
    """A slave connection through its handshake; returns the protocol and its transport."""
    p = master.factory.buildProtocol(None)
    t = StringTransport()
    p.makeConnection(t)
    nonce = b"n" * 16
    p.dataReceived(codec.encode(codec.Hello(slave_id, nonce)))
    challenge = codec.FrameDecoder().feed(t.value())[0]
    t.clear()
    p.dataReceived(codec.encode(codec.Proof(codec.slave_mac(SECRET, nonce, challenge.nonce), 0)))
    t.clear()
    p.dataReceived(codec.encode(codec.Ack(0)))
    return p, t


def test_a_reconnected_slave_replaces_its_old_connection_and_stays_connected(tmp_path):
    """When a slave reconnects before its old connection is gone, the old one is dropped, and its end does not
    mark the slave disconnected (which would shrink it out of the SyncStateSet)."""
    master, store, clock = _master(tmp_path)
    old, old_t = _handshake(master, "b2")
    new, _new_t = _handshake(master, "b2")
    assert old_t.disconnecting and master.by_slave["b2"] is new
    old.connectionLost(None)
    assert master.sync.replicas["b2"].connected
    clock.advance(1.0)
    assert master.sync.members == {"b1", "b2"}
    master.stopService()
    store.close()


def test_a_slave_using_the_masters_own_id_is_refused(tmp_path):
    """A slave claiming the master's id is refused with the reason; the set is untouched."""
    master, store, _clock = _master(tmp_path)
    p, t = _handshake(master, "b1")
    assert codec.FrameDecoder().feed(t.value())[-1] == codec.Refused("slave id 'b1' is this master's own id")
    assert t.disconnecting and "b1" not in master.sync.replicas
    master.stopService()
    store.close()


def test_a_caught_up_slave_joins_the_set_in_the_next_turn_and_a_lost_one_leaves_it(tmp_path):
    """A slave whose ack reaches the confirm offset is proposed at once (reactor turn), not at the next check
    interval: a new master short of min_in_sync_replicas acknowledges nothing until then. A lost one leaves too."""
    master, store, clock = _master(tmp_path)
    p, _t = _handshake(master, "b2")
    clock.advance(0)
    assert master.sync.members == {"b1", "b2"}  # before the 0.5 s check
    p.connectionLost(connectionDone)
    clock.advance(0)
    assert master.sync.members == {"b1"}
    master.stopService()
    store.close()
