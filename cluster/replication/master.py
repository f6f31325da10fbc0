"""The master's side of replication: the ``ha`` listener's protocol, the SyncStateSet and the confirm offset.

``HAMaster`` is a service: it owns one ``HAServerProtocol`` per connected slave
(each a thin adapter over ``store.ha_connection.MasterConnection``), hears of
every append (``MessageStore.add_append_listener``) and pumps the new bytes to
each slave, recomputes the confirm offset on every ack, and every
``check_interval_s`` runs the connections' timers and asks the SyncStateSet
whether it should shrink or expand. A change goes through ``alter`` (without
controllers it is applied here at once; with them ``set_alter`` plugs in the
replica agent, which proposes it to the controllers with their epoch checks)
and is applied only once ``alter`` succeeds.

The confirm offset's plug for the acknowledgement policy is ``wait_confirmed``:
a Deferred that fires once every member of the SyncStateSet holds the log up
to an offset. While it serves, the master holds its store's gate
(``store.ha_gate``): readers and notifies stop at the confirm offset, and a
put is acknowledged once ``SyncStateSet.ack_offset`` (all of the set, or
``min_in_sync_replicas`` copies) passes its end, or answered
``FLUSH_SLAVE_TIMEOUT`` after ``ack_timeout_s``.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.application import service
from twisted.internet import defer, protocol, task

from cluster.replication.settings import HASettings
from store.commit_log import CommitLogError
from store.ha_codec import Refused, encode
from store.ha_connection import Close, MasterConnection, Send, SlaveAcked, SlaveReady
from store.ha_epochs import EpochEntry
from store.ha_sync import ConfirmOffsetFile, ConfirmWaiters, SyncStateSet
from store.message_store import MessageStore

log = logging.getLogger("twistmq.ha")

Alter = Callable[[frozenset, int], defer.Deferred]
"""``alter(members, new_set_epoch)``: store a new SyncStateSet; fires True once it is the set, False if refused."""


class StoreLog:
    """The ``LogSource`` a master connection reads: the store's commit log and epoch file."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    @property
    def min_offset(self) -> int:
        return self.store.commit_log.min_offset

    @property
    def max_offset(self) -> int:
        return self.store.commit_log.max_offset

    def epochs(self) -> list[EpochEntry]:
        return self.store.epochs.entries

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        return self.store.commit_log.read_raw(offset, max_bytes)


class HAServerProtocol(protocol.Protocol):
    """One slave's connection on the master: bytes to the machine, its events to the transport and the set."""

    def __init__(self, master: "HAMaster") -> None:
        self.master = master
        s = master.settings
        self.machine = MasterConnection(StoreLog(master.store), s.secret, max_body=s.max_body, window=s.window,
                                        heartbeat_s=s.heartbeat_s, timeout_s=s.timeout_s)
        self.ready = False
        self.replaced = False  # a newer connection of the same slave took over

    def describe(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        return f"{self.machine.slave_id or '?'}@{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"

    def connectionMade(self) -> None:
        if not self.master.running:  # a slave's ha listener: it has no log of its own to serve
            log.info("ha_refused peer=%s reason=not master", self.describe())
            self.transport.write(encode(Refused("this broker is not its group's master")))
            self.transport.loseConnection()
            return
        self.master.connections.add(self)
        self._apply(self.machine.connection_made(self.master.clock.seconds()))

    def dataReceived(self, data: bytes) -> None:
        if self in self.master.connections:
            self._apply(self.machine.receive(data, self.master.clock.seconds()))

    def pump(self) -> None:
        try:
            events = self.machine.pump(self.master.clock.seconds(), self.master.confirm_offset)
        except (OSError, CommitLogError) as exc:  # the log could not be read: this slave waits for a new connection
            log.error("ha_read_failed peer=%s error=%s", self.describe(), exc)
            events = self.machine.close(f"this master could not read its log: {exc}")
        self._apply(events)

    def tick(self) -> None:
        self._apply(self.machine.tick(self.master.clock.seconds()))
        self.pump()

    def _apply(self, events) -> None:
        acked = False
        for ev in events:
            kind = type(ev)
            if kind is Send:
                self.transport.write(ev.data)
            elif kind is SlaveAcked:
                self.master.sync.acked(ev.slave_id, ev.offset, ev.caught_up_at)
                acked = True
                if ev.slave_id not in self.master.sync.members:
                    self.master.check_soon()  # it may have caught up: join it now, not at the next check
            elif kind is SlaveReady:
                if ev.slave_id == self.master.node_id:
                    self._apply(self.machine.refuse(f"slave id {ev.slave_id!r} is this master's own id"))
                    return
                old = self.master.by_slave.get(ev.slave_id)
                if old is not None and old is not self:  # a reconnect while the old connection lingers: the new wins
                    old.replaced = True
                    old.transport.loseConnection()
                self.master.by_slave[ev.slave_id] = self
                self.ready = True
                self.master.sync.connected(ev.slave_id, ev.offset, ev.async_learner, self.master.clock.seconds())
                log.info("ha_slave_connected slave=%s from_offset=%d async_learner=%s", self.describe(), ev.offset,
                         ev.async_learner)
                acked = True
                self.master.check_soon()
            elif kind is Close:
                if ev.refused:
                    log.warning("ha_refused peer=%s reason=%s", self.describe(), ev.reason)
                else:
                    log.info("ha_closed peer=%s reason=%s", self.describe(), ev.reason)
                self.transport.loseConnection()
        if acked:
            self.master.update_confirm()
            self.pump()  # the ack opened the window

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self.master.connections.discard(self)
        if self.ready and self.master.by_slave.get(self.machine.slave_id) is self:
            del self.master.by_slave[self.machine.slave_id]
            self.master.sync.disconnected(self.machine.slave_id)
            self.master.check_soon()  # a disconnected slave leaves the set at once
            log.info("ha_slave_disconnected slave=%s reason=%s", self.describe(),
                     self.machine.close_reason or reason.getErrorMessage())
        self.machine.close("connection lost")


class HAServerFactory(protocol.Factory):
    """The ``ha`` listener's factory."""

    def __init__(self, master: "HAMaster") -> None:
        self.master = master

    def buildProtocol(self, addr):
        p = HAServerProtocol(self.master)
        p.factory = self
        return p


class HAMaster(service.Service):
    """The master's replication: connections, SyncStateSet, confirm offset."""

    def __init__(self, store: MessageStore, node_id: str, settings: HASettings, clock,
                 members: frozenset[str] | set[str] = frozenset(), set_epoch: int = 0,
                 alter: Alter | None = None) -> None:
        self.setName("ha-master")
        self.store = store
        self.node_id = node_id
        self.settings = settings
        self.clock = clock
        self.sync = SyncStateSet(node_id, members, set_epoch, settings.max_time_not_caught_up_s)
        self.waiters = ConfirmWaiters()
        self.acks = ConfirmWaiters()  # the acknowledgement policy's offset (ack_offset), not the confirm offset
        self.connections: set[HAServerProtocol] = set()
        self.by_slave: dict[str, HAServerProtocol] = {}  # the current connection of each slave id
        self.factory = HAServerFactory(self)
        self._alter = alter or self._apply_here
        self._altering = False
        self._pump_call = None
        self._soon = None
        self._loop: task.LoopingCall | None = None
        self.confirm_file = ConfirmOffsetFile(store.data_dir)
        # A group of one keeps no file (its readers see the whole log, as a node's); once a slave joined, the file
        # is kept up to date for good.
        self._keep_file = self.confirm_file.read() is not None
        store.add_append_listener(self._appended)

    # -- the confirm offset ----------------------------------------------------------------------

    @property
    def confirm_offset(self) -> int:
        """The smallest max offset across the SyncStateSet."""
        return self.waiters.confirm_offset

    def update_confirm(self) -> int:
        """Recompute the confirm offset and fire the waiters it passed."""
        master_max = self.store.commit_log.max_offset
        confirm = max(self.waiters.confirm_offset, self.sync.confirm_offset(master_max))
        if self.running:  # readers first: an append acknowledged below it then tells its submitter where it went
            self.store.set_confirm_offset(confirm)
        self.waiters.advance(confirm)
        s = self.settings
        ack = self.sync.ack_offset(master_max, s.all_ack, s.min_in_sync_replicas)
        if ack is not None:
            self.acks.advance(ack)
        return self.waiters.confirm_offset

    def _ack_wait(self, log_end: int) -> defer.Deferred | None:
        """The store's acknowledgement wait (``store.ha_gate.AckWait``): None once the policy's offset passed."""
        if log_end <= self.acks.confirm_offset:
            return None
        return self.acks.wait(log_end).addTimeout(self.settings.ack_timeout_s, self.clock)

    def wait_confirmed(self, offset: int) -> defer.Deferred:
        """Fires with the confirm offset once it reaches ``offset`` (the end of a record to acknowledge)."""
        return self.waiters.wait(offset)

    def reset_sync_state_set(self, members: frozenset[str] = frozenset(), epoch: int = 0) -> None:
        """Start over with ``members`` (this broker alone by default): a new mastership's set."""
        self.sync = SyncStateSet(self.node_id, members, epoch, self.settings.max_time_not_caught_up_s)

    # -- epochs -------------------------------------------------------------------------------------

    def next_epoch(self) -> int:
        """The epoch a start as master takes without controllers: one past the newest this broker has seen."""
        last = self.store.epochs.last
        return 1 if last is None else last.epoch + 1

    def begin_epoch(self, epoch: int) -> EpochEntry:
        """This broker is master of ``epoch`` from now on: record where its writes start."""
        log_ = self.store.commit_log
        entry = self.store.epochs.begin_epoch(epoch, log_.min_offset, log_.max_offset)
        log.info("ha_master_epoch epoch=%d start_offset=%d", entry.epoch, entry.start_offset)
        return entry

    # -- pumping ------------------------------------------------------------------------------------

    def _appended(self, _log_end: int) -> None:
        self.update_confirm()
        if self._pump_call is None and self.connections:
            # Once per tick, after the tick's appends: one frame for all of them.
            self._pump_call = self.clock.callLater(0, self._pump_all)

    def _pump_all(self) -> None:
        self._pump_call = None
        for c in list(self.connections):
            c.pump()

    def _check(self) -> None:
        for c in list(self.connections):
            c.tick()
        self._write_confirm_file(self.update_confirm())
        if self._altering:
            return
        proposal = self.sync.proposal(self.clock.seconds(), self.store.commit_log.max_offset)
        if proposal is None:
            return
        epoch = self.sync.epoch + 1
        self._altering = True
        d = defer.maybeDeferred(self._alter, proposal, epoch)

        def done(ok):
            self._altering = False
            if ok:
                old = self.sync.members
                self.sync.apply(proposal, epoch)
                log.info("ha_sync_state_set epoch=%d members=%s was=%s", epoch, sorted(proposal), sorted(old))
                # At once: a Spark reader must not read past the confirm offset of a set that has just grown.
                self._write_confirm_file(self.update_confirm())

        def failed(f):
            self._altering = False
            log.warning("ha_sync_state_set_alter_failed members=%s error=%s", sorted(proposal), f.getErrorMessage())

        d.addCallbacks(done, failed)

    def check_soon(self) -> None:
        """Propose a SyncStateSet change in the next reactor turn if one is due (a slave caught up or went),
        rather than at the next ``check_interval_s``: a new master whose set is below ``min_in_sync_replicas``
        acknowledges nothing until its slaves rejoin, so that wait is part of a failover's RTO."""
        if self._soon is None and self.running:
            self._soon = self.clock.callLater(0, self._check_if_due)

    def _check_if_due(self) -> None:
        self._soon = None
        if self.running and not self._altering and \
                self.sync.proposal(self.clock.seconds(), self.store.commit_log.max_offset) is not None:
            self._check()

    def _write_confirm_file(self, confirm: int) -> None:
        if self._keep_file or len(self.sync.members) > 1:
            self._keep_file = True
            try:
                self.confirm_file.write(confirm)
            except OSError as exc:
                log.error("ha_confirm_file_failed path=%s error=%s", self.confirm_file.path, exc)

    @staticmethod
    def _apply_here(members: frozenset, epoch: int) -> bool:
        return True

    def set_alter(self, alter: Alter) -> None:
        """Store SyncStateSet changes through ``alter`` from now on (the controllers, once they decide roles)."""
        self._alter = alter

    @property
    def altering(self) -> bool:
        """A proposed SyncStateSet change is waiting for its answer."""
        return self._altering

    def startService(self) -> None:
        service.Service.startService(self)
        # A new mastership counts from its own set: what an earlier one confirmed may have been truncated since.
        self.waiters, self.acks = ConfirmWaiters(), ConfirmWaiters()
        self.store.gate.ack_wait = self._ack_wait
        self.update_confirm()
        self._loop = task.LoopingCall(self._check)
        self._loop.clock = self.clock
        self._loop.start(self.settings.check_interval_s, now=False)

    def stopService(self) -> defer.Deferred:
        if not self.running:
            return defer.succeed(None)
        service.Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._pump_call is not None and self._pump_call.active():
            self._pump_call.cancel()
        self._pump_call = None
        if self._soon is not None and self._soon.active():
            self._soon.cancel()
        self._soon = None
        for c in list(self.connections):
            c.transport.loseConnection()
        self.waiters.fail_all(defer.CancelledError("this broker stopped being master"))
        self.acks.fail_all(defer.CancelledError("this broker stopped being master"))
        self.store.open_gate()
        return defer.succeed(None)
