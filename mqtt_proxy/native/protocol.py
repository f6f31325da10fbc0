"""Thin Twisted adapters of the native protocol: newline-delimited JSON over TCP, one object per UDP datagram.

TCP: requests are pipelined; each gets a slot in arrival order and replies are
written in that order as their slots fill. A request starts only once the
earlier requests of the connection on the same queue are answered
(``ordering.RequestOrder``), so they take effect in the order they were sent. A connection with more than
``max_pipeline`` requests unanswered stops being read until half of them are.
UDP: one request per datagram, one reply datagram to the sender, each datagram
on its own (no order between datagrams, as UDP itself); a datagram over
``max_datagram_bytes`` gets an error, and a consume over UDP never hands out a
message whose reply would not fit in a datagram (it answers an error instead and
the message stays for a TCP consumer).
"""

from __future__ import annotations

import collections
import functools
import logging

from twisted.internet import protocol

from mqtt_proxy.native import codec
from mqtt_proxy.native.codec import LINE_TOO_LONG, LineBuffer, RequestError
from mqtt_proxy.native.ordering import RequestOrder
from mqtt_proxy.twisted_internals import can_send_directly, send

log = logging.getLogger("twistmq.native.protocol")

MAX_UDP_PAYLOAD = 65507
UDP_DATA_BUDGET = MAX_UDP_PAYLOAD - 1024  # room for the reply's other fields


class NativeTCPProtocol(protocol.Protocol):
    """One TCP client: lines in, replies out in request order."""

    def __init__(self, service) -> None:
        self.service = service
        self.engine = service.engine
        self.config = service.config
        self._lines = LineBuffer(self.config.max_request_bytes)
        self._slots: collections.deque[list] = collections.deque()
        self._order = RequestOrder(self.config.virtual_queues)
        self._paused = False
        self._open = False

    def connectionMade(self) -> None:
        self._open = True
        self._direct = can_send_directly(self.transport)
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        self.service.connections.add(self)

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        self._open = False
        self.service.connections.discard(self)
        self._order.cancel()
        self._slots.clear()

    def dataReceived(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            slot: list = [None]
            self._slots.append(slot)
            if line is LINE_TOO_LONG:
                slot[0] = codec.encode_reply(codec.error_reply(
                    f"request line longer than max_request_bytes {self.config.max_request_bytes}"))
                self.service.counters["errors"] += 1
                continue
            try:
                req = codec.parse_request(line, self.config)
            except RequestError as exc:
                slot[0] = codec.encode_reply(codec.error_reply(exc.reason, exc.echo))
                self.service.counters["errors"] += 1
                continue
            self._order.run(req, functools.partial(self.engine.serve, req), functools.partial(self._answered, slot))
        self._flush()
        if len(self._slots) > self.config.max_pipeline and not self._paused and self._open:
            self._paused = True
            self.transport.pauseProducing()

    def _answered(self, slot: list, reply: dict) -> None:
        slot[0] = codec.encode_reply(reply)
        if self._slots and self._slots[0] is slot:
            self._flush()

    def _flush(self) -> None:
        slots = self._slots
        out = []
        while slots and slots[0][0] is not None:
            out.append(slots.popleft()[0])
            out.append(b"\n")
        if out and self._open:
            self._write(b"".join(out))
        if self._paused and len(slots) <= self.config.max_pipeline // 2 and self._open:
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

    def datagramReceived(self, data: bytes, addr) -> None:
        self.service.counters["udp_datagrams"] += 1
        if len(data) > self.config.max_datagram_bytes:
            self.service.counters["errors"] += 1
            self._send(codec.error_reply(f"datagram of {len(data)} bytes exceeds max_datagram_bytes "
                                         f"{self.config.max_datagram_bytes}: use TCP"), addr)
            return
        try:
            req = codec.parse_request(data, self.config)
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
