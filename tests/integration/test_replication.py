"""Replication between two real stores in one reactor over real sockets (TCP and TLS): the slave's log
becomes the master's byte for byte with its light queues built, acks drive the confirm offset, an old
master rejoining is truncated, and a peer without the cluster secret is refused and logged."""

import logging
import os
import tempfile

from twisted.internet import defer, endpoints, protocol, reactor, task
from twisted.trial import unittest

import lightqueue
from cluster.replication.master import HAMaster
from cluster.replication.role import ReplicaRole
from cluster.replication.settings import HASettings
from cluster.replication.slave import HASlave
from cluster.tools.certs import make_ca, make_server_cert, write_issued
from store import ha_codec as codec
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore
from store.ha_epochs import EpochEntry as E
from store.record import Message, encode

SECRET = "group-secret"
SETTINGS = HASettings(secret=SECRET, heartbeat_s=0.2, timeout_s=3.0, check_interval_s=0.1, max_body=4096)


class _Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


async def _until(predicate, what, timeout=10.0):
    """Poll ``predicate`` on the reactor every 20 ms until it holds; fail naming ``what`` after ``timeout``."""
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await task.deferLater(reactor, 0.02, lambda: None)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


class _ScriptedMaster(protocol.Protocol):
    """A master that knows the secret but sends what ``script`` makes of the slave's first ACK (a buggy or
    hostile master): it passes the handshake, then misbehaves."""

    def __init__(self, epochs, script):
        self.decoder = codec.FrameDecoder()
        self.epochs, self.script = epochs, script
        self.nonce = b"M" * 16

    def dataReceived(self, data):
        for frame in self.decoder.feed(data):
            if isinstance(frame, codec.Hello):
                self.slave_nonce = frame.nonce
                mac = codec.master_mac(SECRET, frame.nonce, self.nonce)
                self.transport.write(codec.encode(codec.Challenge(self.nonce, mac)))
            elif isinstance(frame, codec.Proof):
                self.transport.write(codec.encode(codec.Epochs(10**6, 0, tuple(self.epochs))))
            elif isinstance(frame, codec.Ack):
                for f in self.script(frame.max_offset):
                    self.transport.write(codec.encode(f))
                self.script = lambda _offset: []


class ReplicationTest(unittest.TestCase):
    """Two stores, a master and a slave, in this process."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="twistmq-ha-")
        self.stores = []
        self.captured = _Captured()
        logging.getLogger("twistmq.ha").addHandler(self.captured)
        logging.getLogger("twistmq.ha").setLevel(logging.INFO)

    async def _cleanup(self):
        logging.getLogger("twistmq.ha").removeHandler(self.captured)
        for s in reversed(self.stores):
            await s.close()

    def tearDown(self):
        return defer.ensureDeferred(self._cleanup())

    def _store(self, name):
        store = MessageStore(os.path.join(self.tmp, name), StoreConfig(segment_size=64 * 1024), reactor,
                             SynchronousExecutor())
        lightqueue.attach(store)
        store.open()
        self.stores.append(store)
        return store

    async def _master(self, store, node_id="b1", epoch=1, description="tcp:0:interface=127.0.0.1", settings=SETTINGS):
        master = HAMaster(store, node_id, settings, reactor)
        master.begin_epoch(epoch)
        master.startService()
        self.addCleanup(master.stopService)
        port = await endpoints.serverFromString(reactor, description).listen(master.factory)
        self.addCleanup(port.stopListening)
        return master, port.getHost().port

    def _slave(self, store, port, node_id="b2", secret=SECRET, client="tcp:127.0.0.1:{port}", async_learner=False):
        description = client.format(port=port)
        slave = HASlave(store, node_id, endpoints.clientFromString(reactor, description), description,
                        HASettings(**{**SETTINGS.__dict__, "secret": secret}), reactor, async_learner=async_learner)
        slave.startService()
        self.addCleanup(slave.stopService)
        return slave

    async def _put(self, store, messages):
        await defer.gatherResults([store.put(m) for m in messages])

    def _raw(self, store):
        return store.commit_log.read_raw(0, store.commit_log.max_offset) if store.commit_log.max_offset else b""

    async def test_records_arrive_byte_identical_and_acks_drive_the_confirm_offset(self):
        """Records appended on the master appear byte-identical on the slave, queues included; its acks move
        the master's confirm offset once it joins the SyncStateSet, and a waiter on an offset fires then."""
        m_store, s_store = self._store("m"), self._store("s")
        m_store.add_filter("dev/#")
        await self._put(m_store, [Message(topic=f"dev/{i}", body=b"early %d" % i) for i in range(50)])
        master, port = await self._master(m_store)
        self._slave(s_store, port)
        await _until(lambda: master.sync.members == {"b1", "b2"}, "the slave to join the SyncStateSet")
        await self._put(m_store, [Message(topic=f"dev/{i}", body=b"late %d" % i * 20) for i in range(200)])
        end = m_store.commit_log.max_offset
        confirmed = master.wait_confirmed(end)
        await _until(lambda: s_store.commit_log.max_offset == end, "the slave to catch up")
        self.assertEqual(self._raw(s_store), self._raw(m_store))
        self.assertEqual(await confirmed, end)
        await _until(lambda: master.confirm_file.read() == end, "the master's confirm-offset file")
        self.assertEqual(s_store.epochs.entries, m_store.epochs.entries)
        got = s_store.get_now("%LMQ%dev/#", 0, 1000)
        self.assertEqual([m.record.body for m in got], [m.record.body for m in m_store.get_now("%LMQ%dev/#", 0, 1000)])
        self.assertEqual(len(got), 250)

    async def test_a_member_whose_connection_goes_leaves_the_set_at_once(self):
        """A member of the SyncStateSet whose connection goes is dropped in the next reactor turn, not at the next
        check (the config's promise: a disconnected slave is dropped at once), so a put after it is answered by
        the set that stays. (A member still connected but behind holds puts: test_replication_ack.py.)"""
        m_store, s_store = self._store("m"), self._store("s")
        settings = HASettings(**{**SETTINGS.__dict__, "max_time_not_caught_up_s": 60.0, "check_interval_s": 60.0})
        master, port = await self._master(m_store, settings=settings)
        slave = self._slave(s_store, port)
        await _until(lambda: master.sync.members == {"b1", "b2"}, "the slave to join the SyncStateSet")
        await slave.stopService()
        await _until(lambda: master.sync.members == {"b1"}, "the SyncStateSet to shrink (with 60 s checks)")
        self.assertTrue((await m_store.put(Message(topic="t", body=b"x"))).ok)
        self.assertEqual(master.confirm_offset, m_store.commit_log.max_offset)

    async def test_old_master_rejoins_as_slave_and_is_truncated(self):
        """A master's records its slave never got are cut when it rejoins the slave it was, now master of a
        newer epoch: the common part stays, the rest goes from its log and its light queue, the new epoch's
        records follow."""
        a, b = self._store("a"), self._store("b")
        a.add_filter("t/#")
        master_a, port_a = await self._master(a, node_id="a", epoch=1)
        slave_b = self._slave(b, port_a, node_id="b")
        await self._put(a, [Message(topic="t/1", body=b"shared %d" % i) for i in range(10)])
        common = a.commit_log.max_offset
        await _until(lambda: b.commit_log.max_offset == common, "b to replicate epoch 1")
        await slave_b.stopService()
        await master_a.stopService()
        await self._put(a, [Message(topic="t/1", body=b"lost %d" % i) for i in range(5)])  # b never gets these
        master_b, port_b = await self._master(b, node_id="b", epoch=2)
        b.add_filter("t/#")  # the subscription, session state the log does not carry yet
        await self._put(b, [Message(topic="t/1", body=b"new %d" % i) for i in range(3)])
        self._slave(a, port_b, node_id="a")
        await _until(lambda: self._raw(a) == self._raw(b), "the old master's log to equal the new one's")
        self.assertEqual([(e.epoch, e.start_offset) for e in a.epochs.entries], [(1, 0), (2, common)])
        bodies = [m.record.body for m in a.get_now("%LMQ%t/#", 0, 100)]
        self.assertEqual(bodies, [b"shared %d" % i for i in range(10)] + [b"new %d" % i for i in range(3)])
        self.assertTrue(any("ha_truncated offset=%d" % common in line for line in self.captured.lines))

    async def test_a_fake_slave_with_the_wrong_secret_is_refused_and_logged(self):
        """A slave that does not know the secret gets nothing, and both sides log why."""
        m_store, s_store = self._store("m"), self._store("s")
        await self._put(m_store, [Message(topic="t", body=b"secret data")])
        master, port = await self._master(m_store)
        self._slave(s_store, port, secret="wrong")
        await _until(lambda: any("ha_refused" in line for line in self.captured.lines), "a refusal in the log")
        self.assertEqual(s_store.commit_log.max_offset, 0)
        self.assertEqual(master.sync.members, {"b1"})
        self.assertIsNone(master.confirm_file.read())  # a group of one keeps no confirm-offset file
        self.assertTrue(any("failed the cluster secret" in line for line in self.captured.lines))

    async def test_replication_over_tls(self):
        """``ssl:`` endpoints on both ends carry the same replication."""
        pki = os.path.join(self.tmp, "pki")
        os.makedirs(pki)
        ca = make_ca()
        write_issued(ca, os.path.join(pki, "ca.pem"), os.path.join(self.tmp, "ca.key"))
        write_issued(make_server_cert(ca, ["127.0.0.1"]), os.path.join(self.tmp, "server.pem"),
                     os.path.join(self.tmp, "server.key"))
        m_store, s_store = self._store("m"), self._store("s")
        await self._put(m_store, [Message(topic="t", body=b"over tls %d" % i) for i in range(20)])
        server = (f"ssl:0:interface=127.0.0.1:privateKey={os.path.join(self.tmp, 'server.key')}"
                  f":certKey={os.path.join(self.tmp, 'server.pem')}")
        master, port = await self._master(m_store, description=server)
        self._slave(s_store, port, client="tls:127.0.0.1:{port}:trustRoots=" + pki)
        await _until(lambda: s_store.commit_log.max_offset == m_store.commit_log.max_offset, "the slave over TLS")
        self.assertEqual(self._raw(s_store), self._raw(m_store))

    async def _against_scripted_master(self, store, epochs, script):
        factory = protocol.Factory.forProtocol(lambda: _ScriptedMaster(epochs, script))
        port = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(factory)
        slave = self._slave(store, port.getHost().port)
        try:
            await _until(lambda: any("ha_refused" in line for line in self.captured.lines), "the slave to refuse")
            return [line for line in self.captured.lines if "ha_refused" in line]
        finally:  # before the next case: no retry of this slave may log into it
            await slave.stopService()
            await port.stopListening()

    async def test_bad_transfers_from_a_master_are_refused_logged_and_change_nothing(self):
        """A transfer beyond the slave's end, in an older epoch, or with a corrupt body is refused and logged;
        the slave's log and epochs stay as they were."""
        good = codec.Transfer  # the frames below differ from a good one in one field each
        record = encode(Message(topic="t", body=b"payload"), 1)
        cases = [
            (lambda end: [good(end + 100, 1, 0, 0, record)], "beyond this log's end"),
            (lambda end: [good(end, 0, 0, 0, record)], "older than this log's epoch"),
            (lambda end: [good(end, 1, 0, 0, record[:-1] + bytes([record[-1] ^ 1]))], "corrupt body"),
        ]
        store = self._store("s")
        store.epochs.begin_epoch(1, 0, 0)
        store.replica_of = "scripted"
        for frames, reason in cases:
            end = store.commit_log.max_offset
            self.captured.lines.clear()
            refused = await self._against_scripted_master(store, [E(1, 0)], frames)
            self.assertIn(reason, refused[0])
            self.assertEqual(store.commit_log.max_offset, end)
            self.assertEqual(store.epochs.entries, [E(1, 0)])

    async def test_a_master_that_would_truncate_below_the_confirm_offset_is_refused(self):
        """Epochs that would cut what the SyncStateSet confirmed are refused, also after the slave restarted (the
        confirm offset is kept in its data dir): the slave's log stays whole."""
        master_store, store = self._store("m"), self._store("s")
        master, port = await self._master(master_store)
        slave = self._slave(store, port)
        await self._put(master_store, [Message(topic="t", body=b"confirmed %d" % i) for i in range(10)])
        end = master_store.commit_log.max_offset
        await _until(lambda: slave.confirm_offset == end, "the slave to hear the confirm offset")
        await slave.stopService()
        self.captured.lines.clear()
        # A master claiming epoch 1 ended at 100 and epoch 2 began there: the walk would cut to 100 < confirmed.
        factory = protocol.Factory.forProtocol(lambda: _ScriptedMaster([E(1, 0), E(2, 100)], lambda _end: []))
        port2 = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(factory)
        self.addCleanup(port2.stopListening)
        # A new slave service, as after a restart: it knows the confirm offset from the data dir's file.
        with open(os.path.join(store.data_dir, "confirm_offset")) as f:
            self.assertEqual(int(f.read()), end)
        client = HASlave(store, "b2", endpoints.clientFromString(reactor, f"tcp:127.0.0.1:{port2.getHost().port}"),
                         "scripted", SETTINGS, reactor)
        client.startService()
        self.addCleanup(client.stopService)
        await _until(lambda: any("ha_refused" in line for line in self.captured.lines), "the slave to refuse")
        self.assertTrue(any(f"below the confirm offset {end}" in line for line in self.captured.lines))
        self.assertEqual(store.commit_log.max_offset, end)

    async def test_an_async_learner_replicates_but_never_joins_the_set(self):
        """A learner gets the whole log, yet the SyncStateSet stays the master alone and the confirm offset
        never waits for it."""
        m_store, s_store = self._store("m"), self._store("s")
        master, port = await self._master(m_store)
        self._slave(s_store, port, async_learner=True)
        await _until(lambda: master.sync.replicas.get("b2") is not None, "the learner's handshake")
        await self._put(m_store, [Message(topic="t", body=b"learn %d" % i) for i in range(20)])
        end = m_store.commit_log.max_offset
        self.assertEqual(master.confirm_offset, end)
        await _until(lambda: s_store.commit_log.max_offset == end, "the learner to catch up")
        await task.deferLater(reactor, 3 * SETTINGS.check_interval_s, lambda: None)  # checks that could expand
        self.assertEqual(master.sync.members, {"b1"})

    async def test_a_manual_switch_makes_the_slave_master_and_the_master_its_slave(self):
        """become_master on the slave and become_slave on the master swap them: the new master takes writes in
        epoch 2, the old one refuses writes, truncates what it wrote alone, and follows the new one."""
        a_store, b_store = self._store("a"), self._store("b")
        roles = {"a": [], "b": []}
        a = ReplicaRole(a_store, "a", SETTINGS, reactor, on_role=roles["a"].append)
        b = ReplicaRole(b_store, "b", SETTINGS, reactor, on_role=roles["b"].append)
        self.addCleanup(a.stop)
        self.addCleanup(b.stop)
        a_port = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(a.master.factory)
        b_port = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(b.master.factory)
        self.addCleanup(a_port.stopListening)
        self.addCleanup(b_port.stopListening)
        await a.become_master(1)
        await b.become_slave(f"tcp:127.0.0.1:{a_port.getHost().port}")
        await self._put(a_store, [Message(topic="t", body=b"one %d" % i) for i in range(5)])
        refused = await b_store.put(Message(topic="t", body=b"to the slave"))
        self.assertEqual(refused.status.name, "SERVICE_NOT_AVAILABLE")
        await _until(lambda: b_store.commit_log.max_offset == a_store.commit_log.max_offset, "b to catch up")
        await b.become_master(2)
        # a is not told yet (no controllers here): a write it takes alone is what the switch must cut
        await self._put(a_store, [Message(topic="t", body=b"alone")])
        await a.become_slave(f"tcp:127.0.0.1:{b_port.getHost().port}")
        await self._put(b_store, [Message(topic="t", body=b"two %d" % i) for i in range(3)])
        await _until(lambda: self._raw(a_store) == self._raw(b_store), "a to follow b")
        self.assertEqual([e.epoch for e in a_store.epochs.entries], [1, 2])
        self.assertNotIn(b"alone", self._raw(a_store))
        self.assertFalse(a.is_master)
        self.assertTrue(b.is_master)
        self.assertEqual(roles, {"a": ["master", "slave"], "b": ["slave", "master"]})  # what starts/pauses timers

