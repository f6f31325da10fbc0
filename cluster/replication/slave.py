"""The slave's side of replication: a connection to the master's ``ha`` port, kept up with back-off.

``HASlave`` is a service around a ``ClientService``. Each connection runs a
``store.ha_connection.SlaveConnection``; its events are applied to the store in
order: ``Truncate`` cuts the log and its queues (``MessageStore.truncate``) and
the epochs after the common one, ``NewEpoch`` records an epoch, ``Append``
appends the master's records at their offsets through the same dispatch as
any append (so the light queues are built), then the ack goes out. Anything
the store refuses (a disk error, an epoch out of order) drops the connection;
the next one starts with a fresh handshake.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.application import internet, service
from twisted.internet import defer, protocol, task

from cluster.replication.settings import HASettings
from store.commit_log import CommitLogError
from store.ha_connection import Append, Close, ConfirmAdvanced, NewEpoch, Send, SlaveConnection, Truncate
from store.ha_epochs import EpochError
from store.ha_sync import ConfirmOffsetFile
from store.message_store import MessageStore
from store.record import RecordError

log = logging.getLogger("twistmq.ha")

MAX_RETRY_DELAY = 5.0
"""Longest wait between two attempts to reach the master (seconds)."""


class HAClientProtocol(protocol.Protocol):
    """The connection to the master: bytes to the machine, its events to the store and the transport."""

    def __init__(self, slave: "HASlave") -> None:
        self.slave = slave
        s = slave.settings
        self.machine = SlaveConnection(slave.node_id, s.secret, async_learner=slave.async_learner,
                                       timeout_s=s.timeout_s)
        self._loop: task.LoopingCall | None = None

    def connectionMade(self) -> None:
        store = self.slave.store
        cl = store.commit_log
        self.slave.protocol = self
        self._apply(self.machine.connection_made(self.slave.clock.seconds(), cl.max_offset, cl.min_offset,
                                                 store.epochs.entries, self.slave.confirm_offset))
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.slave.clock
        self._loop.start(self.slave.settings.check_interval_s, now=False)

    def dataReceived(self, data: bytes) -> None:
        self._apply(self.machine.receive(data, self.slave.clock.seconds()))

    def _tick(self) -> None:
        self.slave.save_confirm()
        self._apply(self.machine.tick(self.slave.clock.seconds()))

    def _apply(self, events) -> None:
        store = self.slave.store
        for ev in events:
            kind = type(ev)
            try:
                if kind is Send:
                    self.transport.write(ev.data)
                elif kind is Append:
                    store.append_replicated(ev.offset, ev.data, ev.records).addErrback(self._flush_failed)
                elif kind is NewEpoch:
                    store.epochs.append(ev.entry.epoch, ev.entry.start_offset)
                elif kind is ConfirmAdvanced:
                    self.slave.confirm_advanced(ev.offset)
                elif kind is Truncate:
                    cut = store.truncate(ev.offset)
                    if ev.keep_epoch is None:
                        store.epochs.replace([])
                    else:
                        store.epochs.keep_through(ev.keep_epoch)
                    log.warning("ha_truncated offset=%d bytes=%d epochs=%s", ev.offset, cut, store.epochs.entries)
                elif kind is Close:
                    if ev.refused:
                        log.warning("ha_refused master=%s reason=%s", self.slave.master, ev.reason)
                    else:
                        log.info("ha_closed master=%s reason=%s", self.slave.master, ev.reason)
                    self.transport.loseConnection()
                    return
            except (CommitLogError, EpochError, RecordError, OSError) as exc:
                log.error("ha_apply_failed master=%s event=%s error=%s", self.slave.master, kind.__name__, exc)
                self.machine.close(f"could not apply {kind.__name__}: {exc}")
                self.transport.loseConnection()
                return

    def _flush_failed(self, failure) -> None:
        log.error("ha_flush_failed master=%s error=%s", self.slave.master, failure.getErrorMessage())
        if self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self.slave.protocol is self:
            self.slave.protocol = None
        self.machine.close("connection lost")


class _Factory(protocol.Factory):
    def __init__(self, slave: "HASlave") -> None:
        self.slave = slave

    def buildProtocol(self, addr):
        return HAClientProtocol(self.slave)


class HASlave(service.Service):
    """A slave's replication from ``master`` (a client endpoint description, for the logs) over ``endpoint``."""

    def __init__(self, store: MessageStore, node_id: str, endpoint, master: str, settings: HASettings, clock,
                 async_learner: bool = False) -> None:
        self.setName("ha-slave")
        self.store = store
        self.node_id = node_id
        self.master = master
        self.settings = settings
        self.clock = clock
        self.async_learner = async_learner
        self.confirm_file = ConfirmOffsetFile(store.data_dir)
        self.confirm_offset = 0
        """The master's confirm offset as last heard (kept in ``DATA_DIR/confirm_offset`` across restarts)."""
        self.protocol: HAClientProtocol | None = None
        self._confirm_listeners: list[Callable[[int], None]] = []
        policy = internet.backoffPolicy(initialDelay=0.1, maxDelay=MAX_RETRY_DELAY, factor=2.0)
        self._service = internet.ClientService(endpoint, _Factory(self), retryPolicy=policy, clock=clock)

    def on_confirm(self, listener: Callable[[int], None]) -> None:
        """``listener(offset)`` each time the confirm offset the master sent moves."""
        self._confirm_listeners.append(listener)

    def confirm_advanced(self, offset: int) -> None:
        self.confirm_offset = offset
        for listener in self._confirm_listeners:
            listener(offset)

    def save_confirm(self) -> None:
        """Write the confirm offset to its file if it moved (every check interval, not every frame)."""
        try:
            self.confirm_file.write(self.confirm_offset)
        except OSError as exc:
            log.error("ha_confirm_file_failed path=%s error=%s", self.confirm_file.path, exc)

    @property
    def transferring(self) -> bool:
        """Past the handshake, receiving the master's log."""
        return self.protocol is not None and self.protocol.machine.state.name == "TRANSFER"

    def startService(self) -> None:
        service.Service.startService(self)
        # What this broker heard before a restart: its handshake never truncates below it.
        self.confirm_offset = max(self.confirm_offset, self.confirm_file.read() or 0)
        self._service.startService()

    def stopService(self) -> defer.Deferred:
        if not self.running:
            return defer.succeed(None)
        service.Service.stopService(self)
        self.save_confirm()
        return self._service.stopService()
