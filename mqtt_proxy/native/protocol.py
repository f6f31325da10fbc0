"""Thin Twisted adapters of the native protocol: newline-delimited JSON over TCP, one object per UDP datagram.

TCP: requests are pipelined; each gets a slot in arrival order and replies are
written in that order as their slots fill. A request starts only once the
earlier requests of the connection on the same queue are answered
(``ordering.RequestOrder``), so they take effect in the order they were sent. A connection with more than
``max_pipeline`` requests unanswered stops being read until half of them are; so does one whose replies
pile up (past the transport's 64 KiB send buffer, or ``max_reply_buffer_bytes`` ready behind an earlier reply) until
the client reads them: a client that sends and never reads holds a bounded amount of memory. List replies
come in pages (``paging``). With ``native.token`` set, the first request must carry it (``token``); a
wrong or missing one is answered with an error and the connection closed.
UDP: one request per datagram, one reply datagram to the sender, each datagram
on its own (no order between datagrams, as UDP itself); each datagram carries
the token when one is set; a datagram over ``max_datagram_bytes`` gets an
error; list actions are refused (a small request, a large reply: a reflection
amplifier); and a consume over UDP never hands out a message whose reply would
not fit in a datagram (it answers an error instead and the message stays for a
TCP consumer).
"""

from __future__ import annotations

import collections
import functools
import hmac
import logging

from twisted.internet import protocol

from mqtt_proxy.native import codec, paging
from mqtt_proxy.native.codec import LINE_TOO_LONG, LineBuffer, RequestError
from mqtt_proxy.native.ordering import RequestOrder
from mqtt_proxy.twisted_internals import can_send_directly, send, read_datagrams_up_to

log = logging.getLogger("twistmq.native.protocol")

AUTH = "auth"
"""The action of a request that only presents the token (a TCP connection's first request, when one is set)."""
LIST_ACTIONS = (codec.QUEUE_LIST, codec.NODE_QUEUE_LIST)
MAX_UDP_PAYLOAD = 65507
UDP_DATA_BUDGET = MAX_UDP_PAYLOAD - 1024  # room for the reply's other fields


class NativeTCPProtocol(protocol.Protocol):
    """One TCP client: lines in, replies out in request order, reading paused while replies pile up."""

    def __init__(self, service) -> None:
        self.service = service
        self.engine = service.engine
        self.config = service.config
        self.topic_limits = service.topic_limits
        self._token = token_bytes(self.config.token)
        self._authenticated = not self._token
        self._lines = LineBuffer(self.config.max_request_bytes)
        self._slots: collections.deque[list] = collections.deque()
        self._pending: collections.deque = collections.deque()  # lines read, waiting for room to be served
        self._held = 0  # bytes of replies ready behind an earlier one still being served
        self._order = RequestOrder(self.config.virtual_queues)
        self._paused = False  # we stopped reading from the transport
        self._out_paused = False  # the transport's send buffer is over its high-water mark
        self._serving = False
        self._closing = False
        self._open = False

    def connectionMade(self) -> None:
        self._open = True
        self._direct = can_send_directly(self.transport)
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        # The transport pauses us when its send buffer passes its high-water mark (Twisted's bufferSize, 64 KiB).
        # Not raised to max_reply_buffer_bytes: a TCP transport also reads bufferSize bytes per recv, and 1 MiB
        # reads cost a node 1.5x the CPU per native request (bench.cost_bench native).
        self.transport.registerProducer(self, True)
        self.service.connections.add(self)

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self._open = False
        self.service.connections.discard(self)
        self._order.cancel()
        self._slots.clear()
        self._pending.clear()

    def close(self) -> None:
        """Close once what was written is sent.

        The producer goes first: a transport whose buffer drains while its producer is paused resumes the
        producer instead of closing, and the connection would stay open.
        """
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    # -- the transport's producer calls: its send buffer went over, or back under, the high-water mark --

    def pauseProducing(self) -> None:
        self._out_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self._out_paused = False
        self._serve_pending()

    def stopProducing(self) -> None:
        self._out_paused = True

    # -- requests -----------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        self._pending.extend(self._lines.feed(data))
        self._serve_pending()

    def _room(self) -> bool:
        """Whether another request may be served now (else its line waits and reading pauses)."""
        return (not self._out_paused and self._held <= self.config.max_reply_buffer_bytes
                and len(self._slots) <= self.config.max_pipeline)

    def _serve_pending(self) -> None:
        if self._serving:
            return
        pending = self._pending
        while True:
            self._serving = True  # replies made meanwhile are written together, below
            try:
                while pending and not self._closing and self._open and self._room():
                    self._serve(pending.popleft())
            finally:
                self._serving = False
            self._flush()
            if not (pending and not self._closing and self._open and self._room()):
                break
        self._update_reading()

    def _serve(self, line) -> None:
        slot: list = [None]
        self._slots.append(slot)
        if line is LINE_TOO_LONG:
            if not self._authenticated:
                return self._refuse(slot, "the first request must carry the native token")
            self._fill(slot, codec.encode_reply(codec.error_reply(
                f"request line longer than max_request_bytes {self.config.max_request_bytes}")))
            self.service.counters["errors"] += 1
            return
        try:
            obj = codec.parse_json(line)
            if not self._authenticated or obj.get("action") == AUTH:
                if not token_ok(obj, self._token):
                    return self._refuse(slot, "wrong or missing native token", obj)
                self._authenticated = True
                if obj.get("action") == AUTH:
                    return self._fill(slot, codec.encode_reply(auth_reply(obj)))
            req = codec.parse_request(obj, self.config, self.topic_limits)
            done = functools.partial(self._answered, slot)
            if req.action in LIST_ACTIONS:
                done = functools.partial(self._answered_page, slot, paging.parse_page(obj, self.config.list_page_size))
        except RequestError as exc:
            if not self._authenticated:
                return self._refuse(slot, "the first request must carry the native token")
            self._fill(slot, codec.encode_reply(codec.error_reply(exc.reason, exc.echo)))
            self.service.counters["errors"] += 1
            return
        self._order.run(req, functools.partial(self.engine.serve, req), done)

    def _refuse(self, slot: list, reason: str, obj: dict | None = None) -> None:
        """A request without the token: answer it, then close the connection (nothing after it is served)."""
        self.service.counters["errors"] += 1
        log.info("native_auth_refused peer=%s", getattr(self.transport.getPeer(), "host", "?"))
        self._closing = True
        self._pending.clear()
        self._fill(slot, codec.encode_reply(codec.error_reply(reason, codec.echo_of(obj) if obj else None)))

    def _fill(self, slot: list, data: bytes) -> None:
        slot[0] = data
        if self._slots and self._slots[0] is not slot:
            self._held += len(data)

    def _answered_page(self, slot: list, page, reply: dict) -> None:
        self._answered(slot, paging.page_reply(reply, page))

    def _answered(self, slot: list, reply: dict) -> None:
        self._fill(slot, codec.encode_reply(reply))
        if self._slots and self._slots[0] is slot and not self._serving:
            self._flush()
            if self._pending:
                self._serve_pending()
            else:
                self._update_reading()

    def _flush(self) -> None:
        slots = self._slots
        out = []
        while slots and slots[0][0] is not None:
            data = slots.popleft()[0]
            if out:
                self._held -= len(data)  # it waited behind the first
            out.append(data)
            out.append(b"\n")
        if self._held < 0 or not slots:
            self._held = 0
        if out and self._open:
            self._write(b"".join(out))
        if self._closing and not slots and self._open:
            self.close()

    def _update_reading(self) -> None:
        """Read from the transport only while a request read now could be served at once."""
        if not self._open or self._closing:
            return
        slots_limit = self.config.max_pipeline // 2 if self._paused else self.config.max_pipeline
        blocked = (self._out_paused or bool(self._pending) or self._held > self.config.max_reply_buffer_bytes
                   or len(self._slots) > slots_limit)
        if blocked and not self._paused:
            self._paused = True
            self.transport.pauseProducing()
        elif not blocked and self._paused:
            self._paused = False
            self.transport.resumeProducing()

    def _write(self, data: bytes) -> None:
        send(self.transport, data, self._direct)


class NativeTCPFactory(protocol.Factory):
    """Builds a NativeTCPProtocol per connection."""

    noisy = False

    def __init__(self, service) -> None:
        self.service = service

    def buildProtocol(self, addr):
        p = NativeTCPProtocol(self.service)
        p.factory = self
        return p


class NativeUDPProtocol(protocol.DatagramProtocol):
    """One request per datagram; the reply goes back to the sender."""

    noisy = False

    def __init__(self, service) -> None:
        self.service = service
        self.engine = service.engine
        self.config = service.config
        self.topic_limits = service.topic_limits
        self._token = token_bytes(self.config.token)

    def startProtocol(self) -> None:
        # The port reads at most maxPacketSize bytes of a datagram (Twisted's default 8,192) and drops the
        # rest without a word: read one byte past the limit, so an over-long datagram is seen and answered.
        read_datagrams_up_to(self.transport, self.config.max_datagram_bytes + 1)

    def datagramReceived(self, data: bytes, addr) -> None:
        self.service.counters["udp_datagrams"] += 1
        if len(data) > self.config.max_datagram_bytes:
            self.service.counters["errors"] += 1
            self._send(codec.error_reply(f"datagram exceeds max_datagram_bytes "
                                         f"{self.config.max_datagram_bytes}: use TCP"), addr)
            return
        try:
            obj = codec.parse_json(data)
            if self._token and not token_ok(obj, self._token):
                raise RequestError("wrong or missing native token", codec.echo_of(obj))
            if obj.get("action") == AUTH:
                self._send(auth_reply(obj), addr)
                return
            req = codec.parse_request(obj, self.config, self.topic_limits)
            if req.action in LIST_ACTIONS:  # a reply many times its request's size: a reflection amplifier
                raise RequestError("list actions are served over TCP only", req.echo)
        except RequestError as exc:
            self.service.counters["errors"] += 1
            self._send(codec.error_reply(exc.reason, exc.echo), addr)
            return
        self.engine.handle(req, max_data_bytes=UDP_DATA_BUDGET).addCallback(self._send, addr)

    def _send(self, reply: dict, addr) -> None:
        out = codec.encode_reply(reply)
        if len(out) > MAX_UDP_PAYLOAD:
            echo = {k: reply[k] for k in ("action", "queue", "topic", "seq") if k in reply}
            out = codec.encode_reply(codec.error_reply("reply too large for a datagram: use TCP", echo))
        if self.transport is None:
            return
        try:
            self.transport.write(out, addr)
        except OSError as exc:  # unreachable peer, full buffer: UDP is best effort
            log.debug("native_udp_send_failed addr=%s error=%s", addr, exc)


def token_bytes(token: str) -> bytes:
    """The configured token as the bytes requests are compared with (empty: no token required)."""
    return token.encode("utf-8") if token else b""


def token_ok(obj: dict, token: bytes) -> bool:
    """Whether request ``obj`` carries ``token`` (always true when no token is set); constant-time."""
    if not token:
        return True
    given = obj.get("token")
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token)


def auth_reply(obj: dict) -> dict:
    """The answer to an accepted ``auth`` request (echoing its ``seq``)."""
    reply = {"code": 0, "action": AUTH}
    if "seq" in codec.echo_of(obj):
        reply["seq"] = obj["seq"]
    return reply
