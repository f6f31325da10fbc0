"""MQTT over WebSocket: an autobahn WebSocket server that carries the byte stream of any inner protocol.

``websocket_factory(inner_factory, url_path="/mqtt", clock=reactor)`` wraps any
``IProtocolFactory``; listen on a ``tcp:`` endpoint for ``ws://`` or on a TLS
endpoint (``mqtt_proxy.tls.server_endpoint``) for ``wss://``.

- Opening handshake: the request path must equal *url_path* (else HTTP 404)
  and the client must offer the ``mqtt`` subprotocol (``mqttv3.1`` is accepted
  too, for MQTT 3.1 clients); else HTTP 400 (MQTT-6.0.0-3/4).
- Once open, the inner protocol is built with ``buildProtocol(peer address)``
  and connected to a ``WebSocketTransport``. Every binary message received is
  passed to its ``dataReceived`` as is: WebSocket framing and MQTT framing are
  independent, the inner protocol reassembles packets itself, so a packet may
  span frames and messages and a message may hold several packets
  (MQTT-6.0.0-2). A text message closes the connection with 1003
  (MQTT-6.0.0-1). Each ``write`` from the inner protocol is sent as one binary
  message.
- The ``WebSocketTransport`` offers write, writeSequence, loseConnection (a
  WebSocket close handshake, 1000), abortConnection, getPeer, getHost,
  register/unregisterProducer and pause/resume/stopProducing (forwarded to the
  socket, so flow control reaches TCP), and, over TLS, ``getPeerCertificate``
  and ``getHandle`` and ``ISSLTransport``, so ``mqtt_proxy.tls.peer_identity``
  works on it.
- *max_message_size* (bytes, 0 = unlimited) bounds what one WebSocket message
  may buffer; a bigger one fails the connection with 1009. Set it to at least
  the broker's max packet size.

Autobahn's own timers (opening/closing handshake timeouts) run on txaio's
Twisted loop, i.e. the running reactor; *clock* is handed to the factory.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionDeny
from twisted.internet.protocol import connectionDone
from twisted.internet.interfaces import IConsumer, IProtocolFactory, IPushProducer, ISSLTransport, ITransport
from twisted.python.failure import Failure
from zope.interface import alsoProvides, implementer

__all__ = ["DEFAULT_PATH", "SUBPROTOCOLS", "MQTTWebSocketFactory", "WebSocketTransport", "websocket_factory"]

DEFAULT_PATH = "/mqtt"
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
"""Subprotocols accepted, in order of preference."""

CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_DATA = 1003


@implementer(ITransport, IConsumer, IPushProducer)
class WebSocketTransport:
    """The transport an inner protocol sees: bytes out as binary WebSocket messages."""

    def __init__(self, ws: MQTTWebSocketProtocol) -> None:
        self._ws = ws
        self.disconnecting = False
        if ISSLTransport.providedBy(ws.transport):
            alsoProvides(self, ISSLTransport)

    def _open(self) -> bool:
        return self._ws.state == WebSocketProtocol.STATE_OPEN

    def write(self, data: bytes) -> None:
        """Send *data* as one binary message; dropped once the connection is closing."""
        if data and self._open() and not self.disconnecting:
            self._ws.sendMessage(bytes(data), isBinary=True)

    def writeSequence(self, data) -> None:  # noqa: N802 - Twisted interface
        self.write(b"".join(data))

    def loseConnection(self) -> None:  # noqa: N802
        """Start the WebSocket closing handshake (code 1000); the socket closes when it ends or times out."""
        if self.disconnecting:
            return
        self.disconnecting = True
        if self._open():
            self._ws.sendClose(code=CLOSE_NORMAL)
        elif self._ws.transport is not None:
            self._ws.transport.loseConnection()

    def abortConnection(self) -> None:  # noqa: N802
        """Drop the socket at once, without a closing handshake."""
        self.disconnecting = True
        self._ws.dropConnection(abort=True)

    def getPeer(self):  # noqa: N802
        return self._ws.transport.getPeer()

    def getHost(self):  # noqa: N802
        return self._ws.transport.getHost()

    def registerProducer(self, producer, streaming) -> None:  # noqa: N802
        self._ws.transport.registerProducer(producer, streaming)

    def unregisterProducer(self) -> None:  # noqa: N802
        self._ws.transport.unregisterProducer()

    def pauseProducing(self) -> None:  # noqa: N802
        """Stop reading from the socket (backpressure towards the client)."""
        self._ws.transport.pauseProducing()

    def resumeProducing(self) -> None:  # noqa: N802
        self._ws.transport.resumeProducing()

    def stopProducing(self) -> None:  # noqa: N802
        self.abortConnection()

    def getPeerCertificate(self):  # noqa: N802
        """Return the TLS peer certificate (pyOpenSSL X509) or None over plain TCP."""
        get = getattr(self._ws.transport, "getPeerCertificate", None)
        return get() if get is not None else None

    def getHandle(self):  # noqa: N802
        """Return the TLS connection object over wss, else the socket."""
        return self._ws.transport.getHandle()

    def __repr__(self) -> str:
        return f"<WebSocketTransport peer={self._ws.peer}>"


class MQTTWebSocketProtocol(WebSocketServerProtocol):
    """One WebSocket connection carrying the byte stream of one inner protocol."""

    inner = None
    inner_transport: WebSocketTransport | None = None
    _inner_lost = False

    def onConnect(self, request):  # noqa: N802 - autobahn interface
        wanted = self.factory.url_path
        if wanted is not None and request.path != wanted:
            raise ConnectionDeny(404, "no MQTT endpoint at this path")
        for subprotocol in SUBPROTOCOLS:
            if subprotocol in request.protocols:
                return subprotocol
        raise ConnectionDeny(400, "MQTT over WebSocket needs the 'mqtt' subprotocol")

    def onOpen(self) -> None:  # noqa: N802
        inner = self.factory.inner_factory.buildProtocol(self.transport.getPeer())
        if inner is None:
            self.dropConnection(abort=True)
            return
        self.inner = inner
        self.inner_transport = WebSocketTransport(self)
        inner.makeConnection(self.inner_transport)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802,N803
        if self.inner is None or self._inner_lost:
            return
        if not isBinary:
            self.inner_transport.disconnecting = True
            self.sendCloseFrame(code=CLOSE_UNSUPPORTED_DATA, reasonUtf8=b"MQTT needs binary WebSocket frames")
            return
        self.inner.dataReceived(payload)

    def connectionLost(self, reason: Failure = connectionDone) -> None:  # noqa: N802
        super().connectionLost(reason)
        # autobahn leaves these armed when the peer drops the socket mid close handshake.
        for name in ("closeHandshakeTimeoutCall", "serverConnectionDropTimeoutCall"):
            call = getattr(self, name, None)
            if call is not None:
                try:
                    call.cancel()
                except Exception:  # noqa: BLE001 - already fired or cancelled
                    pass
                setattr(self, name, None)
        if self.inner is not None and not self._inner_lost:
            self._inner_lost = True
            if self.inner_transport is not None:
                self.inner_transport.disconnecting = True
            # autobahn aborts the socket after a completed close handshake: that is a clean end.
            self.inner.connectionLost(connectionDone if self.wasClean else reason)


@implementer(IProtocolFactory)
class MQTTWebSocketFactory(WebSocketServerFactory):
    """Builds ``MQTTWebSocketProtocol``s that hand their byte streams to *inner_factory*'s protocols."""

    protocol = MQTTWebSocketProtocol

    def __init__(self, inner_factory: IProtocolFactory, url_path: str | None = DEFAULT_PATH,
                 clock: Any = None, max_message_size: int = 0) -> None:
        super().__init__(protocols=list(SUBPROTOCOLS), reactor=clock)
        self.inner_factory = inner_factory
        self.url_path = url_path
        self.setProtocolOptions(maxMessagePayloadSize=max_message_size, maxFramePayloadSize=max_message_size)
        # Frames carry CONNECT passwords: never let autobahn log payloads.
        self.logOctets = False
        self.logFrames = False

    def startFactory(self) -> None:  # noqa: N802
        super().startFactory()
        self.inner_factory.doStart()

    def stopFactory(self) -> None:  # noqa: N802
        self.inner_factory.doStop()
        super().stopFactory()


def websocket_factory(inner_factory: IProtocolFactory, url_path: str | None = DEFAULT_PATH,
                      clock: Any = None, max_message_size: int = 0) -> MQTTWebSocketFactory:
    """Wrap any protocol factory so its protocols are served over WebSocket at *url_path* (None: any path)."""
    return MQTTWebSocketFactory(inner_factory, url_path, clock, max_message_size)
