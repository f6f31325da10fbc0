"""The Twisted side of an MQTT connection: bytes to the codec, packets to the MQTT front end.

Thin on purpose: it owns the transport, the keep-alive and CONNECT deadlines
(kept on the front end's one ``DeadlineWheel``, not a timer each) and the two
kinds of back-pressure. Writing: it is registered as the transport's producer,
so when a client reads slower than we push, the transport pauses us and the
session stops pulling (a slow consumer costs its offset, nothing more); a
delivery batch is corked into one transport write. Reading: when too many of
this client's publishes wait on the store, we stop reading its socket until the
store catches up.
"""

from __future__ import annotations

import logging

from twisted.internet import protocol
from zope.interface import implementer
from twisted.internet.interfaces import ILoggingContext, IProtocol, IPushProducer

from mqtt_proxy.codec import (
    MQTT_5, ConnAck, Connect, Disconnect, MQTTParser, PingReq, ProtocolError, PubAck, PubComp, Publish, PubRec,
    PubRel, ReasonCode, Subscribe, Unsubscribe, encode,
)
from mqtt_proxy.codec.errors import UnsupportedProtocolVersion
from mqtt_proxy.codec.reason import DISCONNECT_CODES
from mqtt_proxy.codec.packets import PING_RESP, Auth, Properties
from mqtt_proxy.session_state import Phase, PhaseEvent
from mqtt_proxy.subscribe import handle_subscribe, handle_unsubscribe
from mqtt_proxy.twisted_internals import (
    can_send_directly, raise_send_limit, read_into_shared_buffer, send, share_log_strings, share_transport_keys,
)
from store.api import AppendStatus as PutStatus

log = logging.getLogger("twistmq.mqtt.protocol")

CONNECT_TIMEOUT_S = 10.0
CORK_FLUSH_BYTES = 65536  # a corked batch goes to the transport at this size, so back-pressure still applies
MAX_BACKLOG = 1000  # packets received between CONNECT and CONNACK
_KEEP_ALIVES: dict[int, int] = {}  # keep-alive seconds clients asked for -> one int object for each
AWAITING_CONNECT, CONNECTING, CONNECTED, CLOSING = (Phase.AWAITING_CONNECT, Phase.CONNECTING, Phase.CONNECTED,
                                                    Phase.CLOSING)


@implementer(IProtocol, ILoggingContext, IPushProducer)
class MQTTServerProtocol:
    """One client connection.

    ``IProtocol`` without ``protocol.Protocol`` as base class: its instances
    carry a ``__dict__``, and an idle connection is mostly this object, so it has
    slots only. Rarely needed state starts as a shared None and is
    made when first used.
    """

    __slots__ = ("front", "transport", "connected", "factory", "parser", "level", "session", "client_id",
                 "username", "asked", "acl_username", "peer_host", "paused", "refusal", "phase",
                 "server_keep_alive", "pending_puts", "deadline_bucket",
                 "_reading_paused", "_backlog", "_keep_alive", "last_rx", "_corked", "_corked_bytes")

    def __init__(self, front, clock) -> None:
        self.front = front  # its clock is ``clock`` (the factory's), not kept twice: 232 -> 224 bytes per client
        self.transport = None
        self.connected = 0
        self.factory = None
        # Until CONNACK the peer is not authenticated: it may hold no more than a CONNECT's worth of buffer.
        limits = front.limits
        self.parser = MQTTParser(max_packet_size=min(limits.max_packet_size, limits.max_connect_bytes))
        self.level = 4
        self.session = None
        self.client_id = None
        self.username = None
        self.asked = None  # the CONNECT until it is answered, for the connect_refused line
        self.acl_username = None  # the username only if it was verified (password or certificate)
        self.peer_host = "?"
        self.paused = False  # the transport's write buffer is full
        self.refusal = None
        self.phase = AWAITING_CONNECT  # changed only by _phase_event
        self.server_keep_alive = None
        self.pending_puts = 0
        self.deadline_bucket = None  # the DeadlineWheel's, while a deadline is set
        self._reading_paused = False
        self._backlog: list | None = None  # packets after CONNECT, while it is being answered
        self._keep_alive = None  # None until CONNACK: the deadline is CONNECT's; then seconds, 0 = none
        self.last_rx = 0.0  # when data last came (reactor seconds): keep-alive, and a PUBLISH's born time
        self._corked: list | None = None  # writes held while a batch is being sent (see cork)
        self._corked_bytes = 0

    @property
    def inbound_inflight(self) -> int:
        """The client's QoS 1/2 PUBLISHes not yet acknowledged (its session machine counts them; read only)."""
        return self.session.state.inbound_inflight if self.session is not None else 0

    @property
    def inbound_aliases(self) -> dict[int, str] | None:
        """The topic aliases the client set on this connection (kept by its session machine; read only)."""
        return self.session.state.inbound_aliases if self.session is not None else None

    # -- transport events -----------------------------------------------------------------

    def makeConnection(self, transport) -> None:
        self.connected = 1
        self.transport = transport
        # Ours name the client and peer, so a shared prefix serves Twisted's own log lines.
        share_log_strings(transport, "MQTTServerProtocol")
        self.connectionMade()

    def logPrefix(self) -> str:
        return "MQTTServerProtocol"

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self.peer_host = getattr(peer, "host", "?")
        self.front.stats.connections_total += 1
        self.refusal = self.front.admit(self.peer_host)
        self.front.connections.add(self)
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = self.front.limits.max_queued_bytes
        # A PUBACK or a small PUBLISH held back by Nagle waits for the client's delayed ACK (tens of ms). As the
        # native protocol does; over WebSocket autobahn sets it on the socket and the inner transport has none.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        self.transport.registerProducer(self, True)
        self.last_rx = self.front.clock.seconds()
        self.front.deadlines.schedule(self, self.last_rx + CONNECT_TIMEOUT_S)

    def connectionLost(self, reason=None) -> None:
        # Twisted leaves ``connected`` set; the session registry's "client left while we waited" checks read it.
        self.connected = 0
        self.front.deadlines.cancel(self)
        self.front.connection_lost(self)

    def dataReceived(self, data: bytes) -> None:
        self.last_rx = self.front.clock.seconds()
        try:
            packets = self.parser.feed(data)
        except ProtocolError as exc:
            for packet in exc.parsed:
                self._dispatch(packet)
            self._parse_failed(exc)
            return
        i, n = 0, len(packets)
        publishes = self.front.publisher.handle_publishes
        acked = None  # the session whose window PUBACKs of this read freed: it pumps once, after the read
        while i < n:
            if self.phase is CLOSING:
                return
            packet = packets[i]
            if type(packet) is Publish and self.session is not None:
                # A read's plain PUBLISHes in one loop; whatever stops it goes through _dispatch below.
                j = publishes(self, packets, i)
                if j > i:
                    i = j
                    continue
            elif type(packet) is PubAck and self.phase is CONNECTED:
                acked = self.session
                i = acked.on_pubacks(packets, i)  # a read's run of them: a subscriber keeping up
                continue
            self._dispatch(packet)
            i += 1
        if acked is not None and self.phase is CONNECTED:
            acked.pump()

    def _parse_failed(self, exc: ProtocolError) -> None:
        self.front.stats.protocol_errors += 1
        log.info("protocol_error peer=%s client=%s error=%s", self.peer_host, self.client_id, exc)
        if self.phase is AWAITING_CONNECT:
            if isinstance(exc, UnsupportedProtocolVersion):
                self.level = 5 if exc.requested_level == 5 else 4
                self.refuse(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
                return
            if exc.protocol_level == MQTT_5:
                self.level = 5
                self.refuse(exc.reason_code)
                return
            self._abort()
            return
        self.protocol_violation(exc.reason_code, exc.message)

    # -- packets -----------------------------------------------------------------------------

    def _dispatch(self, packet) -> None:
        phase = self.phase
        if phase is CONNECTED:
            self._handle(packet)
            return
        if phase is AWAITING_CONNECT:
            if type(packet) is not Connect:
                self._parse_failed(ProtocolError(ReasonCode.PROTOCOL_ERROR, "the first packet must be CONNECT"))
                return
            self._on_connect(packet)
            return
        if phase is CONNECTING:
            if type(packet) is Connect:
                self.protocol_violation(ReasonCode.PROTOCOL_ERROR, "a second CONNECT (MQTT-3.1.0-2)")
                return
            if self._backlog is None:
                self._backlog = []
            self._backlog.append(packet)  # CONNECT is still being answered
            if len(self._backlog) > MAX_BACKLOG:
                self._pause_reading()

    def _handle(self, packet) -> None:
        kind = type(packet)
        session = self.session
        if kind is Publish:
            self.front.publisher.handle_publish(self, packet)
        elif kind is PubAck:
            session.on_puback(packet.packet_id)
        elif kind is PubRec:
            session.on_pubrec(packet.packet_id, packet.reason_code >= 0x80)
        elif kind is PubRel:
            self.front.publisher.handle_pubrel(self, packet)
        elif kind is PubComp:
            session.on_pubcomp(packet.packet_id)
        elif kind is Subscribe:
            handle_subscribe(self.front.router, self, packet).addErrback(self._handler_failed, "subscribe")
        elif kind is Unsubscribe:
            handle_unsubscribe(self.front.router, self, packet).addErrback(self._handler_failed, "unsubscribe")
        elif kind is PingReq:
            self.transport.write(encode(PING_RESP, self.level))
        elif kind is Disconnect:
            self.front.disconnect(self, packet)
        elif kind is Auth:
            # No authentication method was agreed in CONNECT, so an AUTH is a protocol error (MQTT-4.12.0-1).
            self.protocol_violation(ReasonCode.PROTOCOL_ERROR, "AUTH without an authentication method")
        elif kind is Connect:
            self.protocol_violation(ReasonCode.PROTOCOL_ERROR, "a second CONNECT (MQTT-3.1.0-2)")

    def _handler_failed(self, failure, what: str) -> None:
        log.error("handler_failed what=%s client=%s error=%s", what, self.client_id, failure.getTraceback())
        self.protocol_violation(ReasonCode.UNSPECIFIED_ERROR, f"{what} failed")

    def _on_connect(self, packet: Connect) -> None:
        self._phase_event(PhaseEvent.CONNECT)
        self.level = packet.protocol_level
        self.asked = packet
        if self.refusal is not None:
            self.refuse(self.refusal)
            return
        if packet.properties.authentication_method is not None:
            self.refuse(ReasonCode.BAD_AUTHENTICATION_METHOD)
            return
        keep_alive = packet.keep_alive
        max_ka = self.front.config.max_keep_alive
        if max_ka and (keep_alive == 0 or keep_alive > max_ka) and self.level == MQTT_5:
            keep_alive = self.server_keep_alive = max_ka
        d = self.front.connect(self, packet)
        d.addCallback(self._connected, keep_alive)
        d.addErrback(self._handler_failed, "connect")

    def _connected(self, _, keep_alive: int) -> None:
        self.front.deadlines.cancel(self)
        self.asked = None
        if self.session is None or self.phase is CLOSING:
            return
        self._phase_event(PhaseEvent.CONNACK)
        # One int per value in use, not one per client (a few values at most: the cache stops at 1,024).
        self._keep_alive = _KEEP_ALIVES.setdefault(keep_alive, keep_alive) if len(_KEEP_ALIVES) < 1024 else \
            _KEEP_ALIVES.get(keep_alive, keep_alive)
        self.parser.max_packet_size = self.front.limits.max_packet_size  # authenticated: the full limit
        if keep_alive:
            self.front.deadlines.schedule(self, self.last_rx + keep_alive * 1.5)
        backlog, self._backlog = self._backlog or (), None
        for packet in backlog:
            if self.phase is CLOSING or self.session is None:
                break
            self._handle(packet)
        if self._reading_paused and self.pending_puts <= self.front.limits.max_pending_puts // 2:
            self._resume_reading()

    # -- deadlines ----------------------------------------------------------------------------

    def deadline_due(self, now: float) -> float | None:
        """The DeadlineWheel's check: close a connection past its deadline, else name the next one."""
        if self.phase is CLOSING:
            return None
        keep_alive = self._keep_alive
        if keep_alive is None:  # no CONNACK yet
            log.info("connect_timeout peer=%s", self.peer_host)
            self._abort()
            return None
        idle = now - self.last_rx
        limit = keep_alive * 1.5
        if idle >= limit:
            log.info("keep_alive_expired client=%s idle=%.1fs", self.client_id, idle)
            self.front.server_disconnect(self, ReasonCode.KEEP_ALIVE_TIMEOUT)
            return None
        return self.last_rx + limit

    # -- output -----------------------------------------------------------------------------

    def send(self, packet) -> None:
        if self.phase is not CLOSING:
            self.write(encode(packet, self.level))

    def send_connack(self, packet: ConnAck) -> None:
        """CONNACK, the first packet of the connection: straight to the socket when nothing is queued.

        Through ``transport.write`` it would register the socket for writing, wait for a poll round and
        unregister it (two ``epoll_ctl`` calls and a wake-up per client: a connect storm's share). Only this
        packet: whatever follows goes through the transport's buffer, whose size is what bounds a client
        that does not read (the retained queue's bound counts on it).
        """
        if self.phase is not CLOSING and self._corked is None:
            t = self.transport
            send(t, encode(packet, self.level), can_send_directly(t))
        else:
            self.send(packet)

    def write(self, data: bytes) -> None:
        if self.phase is CLOSING:
            return
        corked = self._corked
        if corked is None:
            self.transport.write(data)
            return
        corked.append(data)
        self._corked_bytes += len(data)
        if self._corked_bytes >= CORK_FLUSH_BYTES:
            self._flush_corked()  # the transport may pause us now: the sender checks ``paused``

    def cork(self) -> None:
        """Hold writes until ``uncork``: a delivery batch reaches the transport as one write.

        Each transport write is a chain of Twisted calls (buffer, producer check,
        writer registration); on a fan-out they were a fifth of the broker's
        time, once per PUBLISH per subscriber.
        """
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        """Pass what was held to the transport, in order, and write directly again."""
        if self._corked is not None:
            self._flush_corked()
            self._corked = None

    def _flush_corked(self) -> None:
        corked = self._corked
        if corked:
            self._corked = []
            self._corked_bytes = 0
            if self.phase is not CLOSING:
                # A delivery batch goes to the socket at once when nothing is queued before it: through
                # transport.write it waits for a poll round, with the socket registered for writing and
                # unregistered again around it, once per batch (an offline drain's window of 100 messages).
                t = self.transport
                send(t, corked[0] if len(corked) == 1 else b"".join(corked), can_send_directly(t))

    def refuse(self, reason: int) -> None:
        """Answer CONNECT with a failure CONNACK and close."""
        self.front.stats.connections_refused += 1
        # %r: both come from the client, and quoting keeps a crafted line break out of the log.
        asked = self.asked
        log.info("connect_refused client=%r user=%r peer=%s reason=0x%02X", asked and asked.client_id,
                 asked and asked.username, self.peer_host, int(reason))
        self.transport.write(encode(ConnAck(False, reason), self.level))
        self._phase_event(PhaseEvent.CLOSE)
        self.transport.loseConnection()

    def protocol_violation(self, reason: int, message: str) -> None:
        """The client broke a rule: DISCONNECT with ``reason`` (v5), publish its will, close."""
        log.info("protocol_violation client=%s peer=%s reason=0x%02X %s", self.client_id, self.peer_host,
                 int(reason), message)
        if self.session is not None:
            self.front.server_disconnect(self, reason, message)
        else:
            self.close(reason, message)

    def close(self, reason: int | None, reason_string: str | None = None) -> None:
        """Close the connection, telling a v5 client why when ``reason`` is given."""
        if self.phase is CLOSING:
            return
        if reason is not None and self.level == MQTT_5 and self.phase is not AWAITING_CONNECT:
            if reason not in DISCONNECT_CODES:
                reason = ReasonCode.UNSPECIFIED_ERROR
            props = Properties(reason_string=reason_string[:200]) if reason_string else Properties()
            self.transport.write(encode(Disconnect(reason, props), MQTT_5))
        self._phase_event(PhaseEvent.CLOSE)
        self.transport.loseConnection()

    def _abort(self) -> None:
        self._phase_event(PhaseEvent.CLOSE)
        self.transport.abortConnection() if hasattr(self.transport, "abortConnection") \
            else self.transport.loseConnection()

    def _phase_event(self, event: PhaseEvent) -> None:
        self.phase = self.phase.after(event)

    def cert_identity(self) -> str | None:
        """The verified client-certificate identity, when the transport is mutual TLS."""
        identity = getattr(self.factory, "cert_identity", None)
        return identity(self.transport) if identity is not None else None

    # -- back-pressure ----------------------------------------------------------------------

    def pauseProducing(self) -> None:
        self.paused = True
        transport = self.transport
        size = getattr(transport, "bufferSize", 0)  # a TCP transport (TLS and WebSocket ones have their own)
        # One send may empty what the pause threshold lets queue: with Twisted's 128 KiB a fan-in's
        # subscriber got 128 KiB out per reactor pass while its publishers' reads brought 1 MiB each in,
        # fell behind and was served from the commit log instead of memory. Set on the first pause, not at
        # connect: an attribute more on every idle connection's transport costs per-connection memory.
        raise_send_limit(transport, size)

    def resumeProducing(self) -> None:
        self.paused = False
        session = self.session
        if session is not None:
            session.pump()
            for sub in list(session.subs.values()):
                if sub.share is not None:
                    sub.share.pump()

    def stopProducing(self) -> None:
        self.paused = True

    def put_started(self, count: int = 1) -> None:
        self.pending_puts += count
        if self.pending_puts > self.front.limits.max_pending_puts and not self._reading_paused:
            self._pause_reading()

    def qos0_stored(self, result) -> None:
        """A QoS 0 publish reached the store (nothing to answer; a failure is only logged)."""
        self.put_finished()
        if result.status is not PutStatus.PUT_OK:
            log.error("put_failed client=%s status=%s reason=%s", self.client_id, result.status.name, result.reason)

    def put_finished(self, count: int = 1) -> None:
        self.pending_puts -= count
        if self._reading_paused and self.pending_puts <= self.front.limits.max_pending_puts // 2:
            self._resume_reading()

    def _pause_reading(self) -> None:
        self._reading_paused = True
        self.transport.pauseProducing()

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if self.connected:
            self.transport.resumeProducing()


class MQTTServerFactory(protocol.Factory):
    """Makes a protocol per connection, all sharing one MQTT front end."""

    noisy = False

    def __init__(self, front, clock, cert_identity=None) -> None:
        self.front = front
        self.clock = clock
        self.cert_identity = cert_identity

    def startFactory(self) -> None:
        # Before the first connection: then no idle connection's transport needs a dict of its own.
        share_transport_keys()

    def prepare_port(self, port) -> None:
        """The listening port this factory serves: its TCP transports read through a shared buffer (a read of
        ``bufferSize``, which the protocol raises to ``max_queued_bytes``, would allocate that much each time)."""
        read_into_shared_buffer(port)

    def buildProtocol(self, addr):
        p = MQTTServerProtocol(self.front, self.clock)
        p.factory = self
        return p
