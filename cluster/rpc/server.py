"""The RPC listener's factory: one ``RpcProtocol`` per accepted connection, served by one ``Dispatcher``.

It keeps the connections whose handshake succeeded (for ``/metrics`` and for a
clean stop: ``stop()`` says goodbye to each), counts refusals by kind, and
tells ``on_lost`` listeners when a connection goes (the store server drops that
connection's watches). A refused or broken connection never affects the others.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet import defer, protocol

from cluster.rpc.connection import Closed
from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import Hello
from cluster.rpc.protocol import RpcProtocol, RpcSettings


def refusal_kind(reason: str) -> str:
    """A stable word for a refusal's reason (the metric's label)."""
    for word, kind in (("cluster id", "wrong_cluster"), ("cluster secret", "wrong_secret"),
                       ("version", "wrong_version"), ("over the limit", "oversized"), ("handshake", "no_handshake"),
                       ("heartbeat", "heartbeat")):
        if word in reason:
            return kind
    return "bad_frame"


class _ServerProtocol(RpcProtocol):
    factory: "RpcServerFactory"

    def _opened(self, peer: Hello) -> None:
        super()._opened(peer)
        self.factory.opened(self)

    def _closed(self, closed: Closed) -> None:
        # our refusals, and a handshake the client broke off (it refused our proof of the secret)
        if not closed.clean and (not closed.by_peer or self.peer is None):
            self.factory.metrics.refuse(refusal_kind(closed.reason))
        super()._closed(closed)

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        super().connectionLost(reason)
        self.factory.lost(self)


class RpcServerFactory(protocol.Factory):
    """``RpcServerFactory(local, settings, clock, dispatcher, health)``: listen with it on the ``--rpc`` endpoint."""

    noisy = False

    def __init__(self, local: Hello, settings: RpcSettings, clock, dispatcher: Dispatcher,
                 health: Callable[[], bool] = lambda: True) -> None:
        self.local = local
        self.settings = settings
        self.clock = clock
        self.dispatcher = dispatcher
        self.metrics = dispatcher.metrics
        self.health = health
        self.connections: set[RpcProtocol] = set()
        self._lost_listeners: list[Callable[[RpcProtocol], None]] = []
        self._opened_listeners: list[Callable[[RpcProtocol], None]] = []
        self._closed_listeners: list[Callable[[RpcProtocol], None]] = []

    def buildProtocol(self, addr):
        p = _ServerProtocol(self.local, False, self.settings, self.clock, self.dispatcher, health=self.health)
        p.factory = self
        return p

    def on_lost(self, listener: Callable[[RpcProtocol], None]) -> None:
        """Call ``listener(protocol)`` whenever an accepted connection goes."""
        self._lost_listeners.append(listener)

    def on_opened(self, listener: Callable[[RpcProtocol], None]) -> None:
        """Call ``listener(protocol)`` when a connection's handshake is done (``protocol.peer`` is known)."""
        self._opened_listeners.append(listener)

    def on_closed(self, listener: Callable[[RpcProtocol], None]) -> None:
        """Call ``listener(protocol)`` when a connection that ``on_opened`` announced goes."""
        self._closed_listeners.append(listener)

    def opened(self, p: RpcProtocol) -> None:
        self.connections.add(p)
        self.metrics.connections = len(self.connections)
        self.metrics.connections_total += 1
        for listener in self._opened_listeners:
            listener(p)

    def lost(self, p: RpcProtocol) -> None:
        if p in self.connections:
            self.connections.discard(p)
            self.metrics.connections = len(self.connections)
            for listener in self._closed_listeners:
                listener(p)
        for listener in self._lost_listeners:
            listener(p)

    def stop(self) -> defer.Deferred:
        """Goodbye to every connection (a clean stop); fires once all are closed."""
        return defer.DeferredList([p.stop() for p in list(self.connections)])
