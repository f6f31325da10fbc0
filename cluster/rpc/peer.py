"""The client side: one connection per peer node, kept up with back-off, and calls to one peer or any.

``PeerClient`` runs a ``ClientService`` (reconnect with exponential back-off,
at most about a second apart, longer only after refused handshakes) to one peer and fails calls at once with ``NotConnected`` while no handshaken
connection is up, so a caller is never parked behind a dead peer. ``Peers``
holds one ``PeerClient`` per member and offers ``call_any``: a request without
a fixed target goes to a connected, healthy candidate (Turms' isHealthy) and,
if that one is unavailable, to the next; unhealthy candidates are avoided, and
with none left the call fails with ``Unavailable``. Use ``call_any`` only for
requests that are safe to repeat: a timed-out call may have been served.
"""

from __future__ import annotations

import logging
import random
from typing import Callable

from twisted.application import internet, service
from twisted.internet import defer, protocol

from cluster.rpc.frames import Hello
from cluster.rpc.protocol import NotConnected, RpcProtocol, RpcSettings
from store import api

log = logging.getLogger("twistmq.rpc")

MAX_RETRY_DELAY = 5.0
"""Longest wait between two connection attempts to a peer whose handshake refused this node (seconds)."""
REDIAL_MAX_DELAY = 1.0
"""Longest wait between two attempts to reach a peer that was down (seconds): well under one member lease
(3 s), the grace a new controllers' leader gives members and brokers before it counts them gone; a peer
restarted after a few seconds down (and often elected at once) is reached again within about a second."""
REDIAL_JITTER = 0.25
"""Up to this much is added to each such wait at random (seconds), so members do not redial in step."""


class _PeerFactory(protocol.Factory):
    def __init__(self, client: "PeerClient") -> None:
        self.client = client

    def buildProtocol(self, addr):
        c = self.client
        p = RpcProtocol(c.local, True, c.settings, c.clock, c.dispatcher, on_event=c._event, health=c.health)
        p.opened.addCallback(lambda peer: c._up(p) if peer is not None else c._refused(p))
        p.when_lost().addCallback(lambda _reason: c._down(p))
        return p


class PeerClient(service.Service):
    """``PeerClient(peer_id, endpoint, local, settings, clock)``: a service; start it to connect."""

    def __init__(self, peer_id: str, endpoint, local: Hello, settings: RpcSettings, clock, dispatcher=None,
                 health: Callable[[], bool] = lambda: True) -> None:
        self.setName(f"rpc-peer-{peer_id}")
        self.peer_id = peer_id
        self.local = local
        self.settings = settings
        self.clock = clock
        self.dispatcher = dispatcher
        self.health = health
        self.protocol: RpcProtocol | None = None
        self._event_listeners: list[Callable[[str, bytes], None]] = []
        self._up_listeners: list[Callable[[], None]] = []
        self._ready: list[defer.Deferred] = []
        self.last_refusal = ""
        """Why the last connection closed before its handshake was done (a wrong secret, cluster id, version)."""
        self._refusals = 0  # handshakes refused in a row
        self._service = self._client_service(endpoint)

    def _client_service(self, endpoint) -> internet.ClientService:
        redial = internet.backoffPolicy(initialDelay=0.1, maxDelay=REDIAL_MAX_DELAY, factor=2.0,
                                        jitter=lambda: random.random() * REDIAL_JITTER)
        refused = internet.backoffPolicy(initialDelay=0.1, maxDelay=MAX_RETRY_DELAY, factor=2.0)
        # ClientService counts a connection as a success even when its handshake is refused: back off on those
        # further, or a member with the wrong secret would redial (and log) several times a second.
        policy = lambda attempt: refused(max(attempt, self._refusals)) if self._refusals else redial(attempt)  # noqa: E731
        return internet.ClientService(endpoint, _PeerFactory(self), retryPolicy=policy, clock=self.clock)

    @property
    def connected(self) -> bool:
        return self.protocol is not None and self.protocol.is_open

    @property
    def healthy(self) -> bool:
        """Connected, and the peer's last heartbeat said it takes work."""
        return self.connected and self.protocol.peer_healthy

    def startService(self) -> None:
        service.Service.startService(self)
        self._service.startService()

    def stopService(self) -> defer.Deferred:
        service.Service.stopService(self)
        p, self.protocol = self.protocol, None
        goodbye = p.stop() if p is not None else defer.succeed(None)
        return defer.DeferredList([goodbye, self._service.stopService()])

    def retarget(self, endpoint) -> defer.Deferred:
        """Dial ``endpoint`` from now on (the peer moved): the open connection is closed and a new one made
        there; listeners hear of it as of any reconnect. Fires once the old connection is closed."""
        old, self._service = self._service, self._client_service(endpoint)
        p, self.protocol = self.protocol, None
        goodbye = p.stop() if p is not None else defer.succeed(None)
        stopped = defer.DeferredList([goodbye, old.stopService()]) if old.running else goodbye
        if self.running:
            self._service.startService()
        return stopped

    def when_connected(self) -> defer.Deferred:
        """Fires (with None) once a connection is open: at once if one is."""
        if self.connected:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        self._ready.append(d)
        return d

    def on_event(self, listener: Callable[[str, bytes], None]) -> None:
        """``listener(topic, body)`` for every event frame the peer sends."""
        self._event_listeners.append(listener)

    def on_connected(self, listener: Callable[[], None]) -> None:
        """``listener()`` each time a new connection opens (after a reconnect: re-register what it held)."""
        self._up_listeners.append(listener)

    def call(self, request_type: str, body: bytes, timeout: float | None = None) -> defer.Deferred:
        """Call the peer; fails at once with ``NotConnected`` when no connection is open."""
        if not self.connected:
            return defer.fail(NotConnected(f"not connected to {self.peer_id}"))
        return self.protocol.call(request_type, body, timeout)

    def _refused(self, p: RpcProtocol) -> None:
        self._refusals += 1
        self.last_refusal = p.close_reason

    def _up(self, p: RpcProtocol) -> None:
        self._refusals = 0
        self.last_refusal = ""
        if p.peer is not None and p.peer.node_id != self.peer_id:
            log.warning("rpc_peer_id_mismatch expected=%s got=%s", self.peer_id, p.peer.node_id)
        self.protocol = p
        log.info("rpc_peer_connected peer=%s role=%s", self.peer_id, p.peer.role)
        # What was held is taken again first (a proxy's filter interest, its watches), then the calls that waited
        # go: the broker serves one connection's frames in order, so no append is resolved before the interest.
        for listener in self._up_listeners:
            listener()
        ready, self._ready = self._ready, []
        for d in ready:
            d.callback(None)

    def _down(self, p: RpcProtocol) -> None:
        if self.protocol is p:
            self.protocol = None
            log.info("rpc_peer_disconnected peer=%s reason=%s", self.peer_id, p.close_reason)

    def _event(self, _protocol: RpcProtocol, topic: str, body: bytes) -> None:
        for listener in self._event_listeners:
            listener(topic, body)


def call_each(peers: list, request_type: str, body: bytes, timeout: float, unanswered: set[int],
              answered: Callable[[bytes, int], None], failed: Callable[[object, int], None]) -> None:
    """The same call to every peer at once, skipping a peer whose previous one is still out (``unanswered``
    holds their indexes and is kept up to date here); ``answered(body, index)`` or ``failed(failure, index)``
    for each, and an error in either is logged.

    For heartbeats to the controllers: whichever of them leads hears it in this beat, however often the lead
    moved, and one that does not answer (stopped, its connection open) holds up no beat and piles up no calls.
    """
    for index, peer in enumerate(peers):
        if index in unanswered:
            continue
        unanswered.add(index)
        d = peer.call(request_type, body, timeout)
        d.addCallbacks(answered, failed, callbackArgs=(index,), errbackArgs=(index,))
        d.addBoth(lambda result, index=index: unanswered.discard(index) or result)
        d.addErrback(lambda failure: log.error("call_each_handler_failed type=%s error=%s", request_type,
                                               failure.getTraceback()))


class Peers(service.MultiService):
    """One ``PeerClient`` per peer; ``call`` one of them, or ``call_any`` of several."""

    def __init__(self) -> None:
        super().__init__()
        self.clients: dict[str, PeerClient] = {}
        self._turn = 0

    def add(self, client: PeerClient) -> PeerClient:
        self.clients[client.peer_id] = client
        client.setServiceParent(self)
        return client

    def call(self, peer_id: str, request_type: str, body: bytes, timeout: float | None = None) -> defer.Deferred:
        client = self.clients.get(peer_id)
        if client is None:
            return defer.fail(NotConnected(f"unknown peer {peer_id!r}"))
        return client.call(request_type, body, timeout)

    def call_any(self, candidates, request_type: str, body: bytes, timeout: float | None = None) -> defer.Deferred:
        """Call a connected, healthy one of ``candidates`` (ids), taking turns; on ``Unavailable`` the next one."""
        order = [c for c in candidates if c in self.clients]
        if order:
            self._turn = (self._turn + 1) % len(order)
            order = order[self._turn:] + order[:self._turn]
        return self._try(order, request_type, body, timeout, [])

    def _try(self, order: list[str], request_type: str, body: bytes, timeout, tried: list[str]) -> defer.Deferred:
        for i, peer_id in enumerate(order):
            if self.clients[peer_id].healthy:
                rest = order[i + 1:]
                d = self.clients[peer_id].call(request_type, body, timeout)
                d.addErrback(self._next, rest, request_type, body, timeout, tried + [peer_id])
                return d
        why = f"tried {', '.join(tried)}" if tried else "none is connected and healthy"
        return defer.fail(api.Unavailable(f"{request_type}: no node can take it ({why})"))

    def _next(self, failure, rest, request_type, body, timeout, tried):
        failure.trap(api.Unavailable)
        log.info("rpc_call_retried type=%s failed_on=%s reason=%s", request_type, tried[-1], failure.getErrorMessage())
        return self._try(rest, request_type, body, timeout, tried)
