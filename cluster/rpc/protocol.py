"""The Twisted adapter of one RPC connection: owns the transport, the call Deferreds, timeouts and heartbeats.

Both ends run ``RpcProtocol``: the client side (``cluster.rpc.peer``) makes
calls, the server side (``cluster.rpc.server``) answers them through a
``Dispatcher``; either may do both. Every call has a timeout (``CallTimeout``);
calls made while the connection is not open fail at once (``NotConnected``);
when it drops, every call still waiting fails with ``NotConnected``. Both ends
send a heartbeat carrying their health flag every ``heartbeat_interval``; a
peer silent for ``HEARTBEATS_MISSED`` intervals is dropped. The state
(handshake, ids, refusals) is ``cluster.rpc.connection``'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Callable

from twisted.internet import defer, protocol, task

from cluster.rpc import connection as conn_mod
from cluster.rpc.connection import Closed, Connection, Opened
from cluster.rpc.frames import Call, Error, Event, Heartbeat, Hello, Result
from store import api

log = logging.getLogger("twistmq.rpc")

HEARTBEATS_MISSED = 3
CALL_SWEEP = 0.25  # seconds between checks for calls past their timeout while any is pending
"""Heartbeat intervals without a byte from the peer after which its connection is dropped."""


class NotConnected(api.Unavailable):
    """No open connection to the peer: the call was not sent (safe to retry elsewhere)."""

    code = "not_connected"


class CallTimeout(api.Unavailable):
    """No answer within the call timeout: the call may or may not have been served."""

    code = "timeout"


class RemoteError(api.StoreError):
    """The peer answered a call with an error frame: ``code`` as it sent it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RpcSettings:
    """Timing and limits of RPC connections (from ``[cluster]``)."""

    call_timeout: float = 5.0
    heartbeat_interval: float = 1.0
    max_frame: int = 16 << 20
    secret: str = field(default="", repr=False)
    """``[cluster] secret``: the key of the handshake's challenge (never in a repr, so never in a log)."""


class RpcProtocol(protocol.Protocol):
    """One connection. ``dispatcher`` serves incoming calls (None: every call is an unknown request type);
    ``on_event(protocol, topic, body)`` receives events; ``health()`` is our flag for heartbeats."""

    def __init__(self, local: Hello, client: bool, settings: RpcSettings, clock, dispatcher=None,
                 on_event: Callable | None = None, health: Callable[[], bool] = lambda: True) -> None:
        self.local = local
        self.client = client
        self.settings = settings
        self.clock = clock
        self.dispatcher = dispatcher
        self.on_event = on_event
        self.health = health
        self.conn: Connection | None = None
        self.peer: Hello | None = None
        self.peer_healthy = False
        self.opened: defer.Deferred = defer.Deferred()  # fires with the peer's Hello, or None if it closed before
        self._lost_waiters: list[defer.Deferred] = []
        self.gone = False  # the transport is closed
        self.close_reason = ""
        # request id -> (Deferred, deadline, request type, timeout): one sweep timer for all of them, not a
        # callLater and a cancel per call (a third of a proxy's RPC overhead in fan-out)
        self._pending: dict[int, tuple[defer.Deferred, float, str, float]] = {}
        self._sweep = None
        self._heartbeat: task.LoopingCall | None = None
        self._handshake_timer = None
        self._last_heard = 0.0
        self._registered = False  # as the transport's producer
        self.write_paused = False
        """The transport's write buffer is past its high-water mark: a sender that may send less (a broker's news
        without its entries) does."""

    @property
    def is_open(self) -> bool:
        return self.conn is not None and self.conn.state is conn_mod.State.OPEN

    def describe(self) -> str:
        peer = self.transport.getPeer() if self.transport is not None else None
        where = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        return f"peer={self.peer.node_id if self.peer else '-'} addr={where}"

    # -- transport ---------------------------------------------------------------------------------------

    def connectionMade(self) -> None:
        # Calls and answers are small writes waiting on each other: Nagle would hold each one back for the
        # peer's delayed ACK (tens of ms per round trip). The native protocol does the same.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        register = getattr(self.transport, "registerProducer", None)
        if register is not None:
            register(self, True)  # pauseProducing/resumeProducing tell write_paused
            self._registered = True
        self.conn = Connection(self._local_now(), self.client, self.settings.max_frame,
                               self.settings.secret.encode("utf-8"))
        self._last_heard = self.clock.seconds()
        self._handshake_timer = self.clock.callLater(self.settings.call_timeout, self._handshake_overdue)
        self._flush()

    def _local_now(self) -> Hello:
        me = self.local
        return replace(me, healthy=self.health())  # the rest as given (its boot too)

    def dataReceived(self, data: bytes) -> None:
        self._last_heard = self.clock.seconds()
        for event in self.conn.receive(data):
            self._event(event)
        self._flush()

    def _event(self, event) -> None:
        if isinstance(event, Opened):
            self._opened(event.peer)
        elif isinstance(event, Call):
            self._serve(event)
        elif isinstance(event, Result):
            self._settle(event.request_id).callback(event.body)
        elif isinstance(event, Error):
            self._error(event)
        elif isinstance(event, Event):
            if self.on_event is not None:
                self.on_event(self, event.topic, event.body)
        elif isinstance(event, Heartbeat):
            self.peer_healthy = event.healthy
        elif isinstance(event, Closed):
            self._closed(event)

    def _opened(self, peer: Hello) -> None:
        self.peer = peer
        self.peer_healthy = peer.healthy
        self._cancel_handshake_timer()
        self._heartbeat = task.LoopingCall(self._beat)
        self._heartbeat.clock = self.clock
        self._heartbeat.start(self.settings.heartbeat_interval, now=False)
        log.debug("rpc_open %s role=%s", self.describe(), peer.role)
        self.opened.callback(peer)

    def _error(self, error: Error) -> None:
        d = self._settle(error.request_id)
        if error.request_id == 0:
            return
        d.errback(RemoteError(error.code, error.message))

    def _closed(self, closed: Closed) -> None:
        self.close_reason = closed.reason
        if not closed.by_peer:
            log.warning("rpc_refused %s reason=%s", self.describe(), closed.reason)
        elif not closed.clean:
            log.warning("rpc_closed_by_peer %s reason=%s", self.describe(), closed.reason)
        self._flush()
        self._lose()
        if not self.opened.called:
            self.opened.callback(None)

    def _flush(self) -> None:
        data = self.conn.data_to_send() if self.conn is not None else b""
        if data and self.transport is not None:
            self.transport.write(data)

    def _lose(self) -> None:
        # A transport does not close while the producer registered on it is paused: it is unregistered first.
        if self._registered:
            self._registered = False
            self.transport.unregisterProducer()
        self.transport.loseConnection()

    def pauseProducing(self) -> None:
        self.write_paused = True

    def resumeProducing(self) -> None:
        self.write_paused = False

    def stopProducing(self) -> None:
        self.write_paused = True

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self._cancel_handshake_timer()
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        if self.conn is not None and self.conn.state is not conn_mod.State.CLOSED:
            self.conn.state = conn_mod.State.CLOSED
            self.close_reason = self.close_reason or reason.getErrorMessage()
        pending, self._pending = self._pending, {}
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
        for d, *_ in pending.values():
            d.errback(NotConnected(f"connection lost: {self.close_reason or 'closed'}"))
        if not self.opened.called:
            self.opened.callback(None)
        self.gone = True
        waiters, self._lost_waiters = self._lost_waiters, []
        for d in waiters:
            d.callback(self.close_reason)

    def when_lost(self) -> defer.Deferred:
        """Fires with the close reason once the transport is gone (at once if it is)."""
        if self.gone:
            return defer.succeed(self.close_reason)
        d: defer.Deferred = defer.Deferred()
        self._lost_waiters.append(d)
        return d

    # -- timers --------------------------------------------------------------------------------------------

    def _cancel_handshake_timer(self) -> None:
        if self._handshake_timer is not None and self._handshake_timer.active():
            self._handshake_timer.cancel()
        self._handshake_timer = None

    def _handshake_overdue(self) -> None:
        self._handshake_timer = None
        self._close_with(self.conn.goodbye("no handshake within the call timeout"))

    def _beat(self) -> None:
        silent = self.clock.seconds() - self._last_heard
        if silent > HEARTBEATS_MISSED * self.settings.heartbeat_interval:
            self._close_with(self.conn.goodbye(f"no heartbeat for {silent:.1f} s"))
            return
        self.conn.heartbeat(self.health())
        self._flush()

    def _close_with(self, closed: Closed | None) -> None:
        if closed is not None:
            self._closed(closed)

    # -- calls out --------------------------------------------------------------------------------------

    def call(self, request_type: str, body: bytes, timeout: float | None = None) -> defer.Deferred:
        """Send a call; fires with the answer's body bytes, or fails (NotConnected, CallTimeout, RemoteError)."""
        if not self.is_open:
            return defer.fail(NotConnected(f"not connected to {self.peer.node_id if self.peer else 'the peer'}"))
        request_id = self.conn.call(request_type, body)
        d: defer.Deferred = defer.Deferred()
        timeout = self.settings.call_timeout if timeout is None else timeout
        self._pending[request_id] = (d, self.clock.seconds() + timeout, request_type, timeout)
        if self._sweep is None:
            self._sweep = self.clock.callLater(min(timeout, CALL_SWEEP), self._sweep_due)
        self._flush()
        return d

    def _settle(self, request_id: int) -> defer.Deferred:
        entry = self._pending.pop(request_id, None)
        return entry[0] if entry is not None else defer.Deferred()

    def _sweep_due(self) -> None:
        """Fail the calls whose timeout passed (late by at most ``CALL_SWEEP``); sweep again while any is pending."""
        self._sweep = None
        now = self.clock.seconds()
        due = [(rid, entry) for rid, entry in self._pending.items() if entry[1] <= now]
        for request_id, (d, _deadline, request_type, timeout) in due:
            del self._pending[request_id]
            self.conn.forget(request_id)
            d.errback(CallTimeout(f"{request_type}: no answer from {self.peer.node_id} within {timeout:g} s"))
        if self._pending and self._sweep is None and not self.gone:
            soonest = min(entry[1] for entry in self._pending.values())
            self._sweep = self.clock.callLater(min(max(soonest - now, 0.0), CALL_SWEEP), self._sweep_due)

    def send_event(self, topic: str, body: bytes) -> None:
        """Send an event frame (dropped if the connection is no longer open)."""
        if self.is_open:
            self.conn.event(topic, body)
            self._flush()

    def stop(self, reason: str = conn_mod.CLEAN_STOP) -> defer.Deferred:
        """Say goodbye and close; fires once the transport is gone."""
        if self.conn is not None and not self.gone:
            self.conn.goodbye(reason)
            self._flush()
            if self.transport is not None:
                self._lose()
        return self.when_lost()

    # -- calls in ---------------------------------------------------------------------------------------

    def _serve(self, call: Call) -> None:
        if self.dispatcher is None:
            self.conn.fail(call.request_id, "unknown_request", f"unknown request type {call.request_type!r}")
            return
        self.dispatcher.dispatch(self, call).addCallback(self._answer, call.request_id)

    def _answer(self, outcome: tuple[bool, object], request_id: int) -> None:
        ok, value = outcome
        if self.conn is None:
            return
        if ok:
            self.conn.answer(request_id, value)
        else:
            code, message = value
            self.conn.fail(request_id, code, message)
        self._flush()
