"""Which side of replication a broker is on, and the switch between the two (RocketMQ's changeToMaster/Slave).

A broker always has an ``HAMaster`` (its ``ha`` listener's factory refuses
slaves while it is not running) and, while it is a slave, an ``HASlave``.
``become_master(epoch)`` stops replicating, begins ``epoch`` at the log's end,
opens the store to writes and serves slaves; ``become_slave(endpoint)`` stops
serving (its confirm waiters fail), closes the store to writes and replicates
from ``endpoint``, whose handshake truncates whatever this broker wrote that
the new master does not hold. Who decides is not this module's business: the
launcher's config at the first start, the controllers later (they hand out the
epochs; without them a master takes one past the newest it has seen).
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer, endpoints

from cluster.replication.master import HAMaster
from cluster.replication.settings import HASettings
from cluster.replication.slave import HASlave
from store.ha_epochs import EpochEntry
from store.message_store import MessageStore

log = logging.getLogger("twistmq.ha")


class ReplicaRole:
    """The replication side of one broker: ``master`` always, ``slave`` while it replicates."""

    def __init__(self, store: MessageStore, node_id: str, settings: HASettings, reactor,
                 async_learner: bool = False, on_role: Callable[[str], None] | None = None) -> None:
        """``on_role("master" | "slave")`` runs at each switch: the broker starts or pauses what only a master
        runs (timers)."""
        self.on_role = on_role or (lambda role: None)
        self.store = store
        self.node_id = node_id
        self.settings = settings
        self.reactor = reactor
        self.async_learner = async_learner
        self.master = HAMaster(store, node_id, settings, reactor)
        self.slave: HASlave | None = None

    @property
    def is_master(self) -> bool:
        return self.master.running

    def become_master(self, epoch: int | None = None, members: frozenset[str] = frozenset(),
                      set_epoch: int = 0) -> defer.Deferred:
        """Serve as master of ``epoch`` (None: one past the newest epoch this broker has seen) with the SyncStateSet
        ``members`` at ``set_epoch`` (the controllers'; none: this broker alone); fires with its epoch entry."""
        d = self._stop_slave()

        def switch(_) -> EpochEntry:
            last = self.store.epochs.last
            if epoch is not None and last is not None and last.epoch == epoch:
                entry = last  # its own epoch still (the whole group restarted): its writes go on in it
            else:
                entry = self.master.begin_epoch(self.master.next_epoch() if epoch is None else epoch)
            self.store.replica_of = ""
            if not self.master.running:
                self.master.reset_sync_state_set(members, set_epoch)
                self.master.startService()
            elif epoch is not None:
                self.master.reset_sync_state_set(members, set_epoch)
            self.on_role("master")
            log.info("ha_role role=master epoch=%d start_offset=%d", entry.epoch, entry.start_offset)
            return entry

        return d.addCallback(switch)

    def become_slave(self, master_endpoint: str) -> defer.Deferred:
        """Replicate from ``master_endpoint`` (a client endpoint string); writes are refused from now on."""
        self.store.replica_of = master_endpoint
        self.on_role("slave")
        stopping = [self._stop_slave()]
        if self.master.running:
            stopping.append(self.master.stopService())

        def switch(_) -> HASlave:
            self.slave = HASlave(self.store, self.node_id, endpoints.clientFromString(self.reactor, master_endpoint),
                                 master_endpoint, self.settings, self.reactor, async_learner=self.async_learner)
            self.slave.startService()
            log.info("ha_role role=slave master=%s", master_endpoint)
            return self.slave

        return defer.gatherResults(stopping).addCallback(switch)

    def stop(self) -> defer.Deferred:
        """Stop whichever side runs (the broker stops)."""
        return defer.gatherResults([self._stop_slave(), self.master.stopService()])

    def _stop_slave(self) -> defer.Deferred:
        slave, self.slave = self.slave, None
        return slave.stopService() if slave is not None else defer.succeed(None)
