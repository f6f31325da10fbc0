"""MQTT over WebSocket over real sockets: framing independence, handshake rules, paho over ws:// and wss://."""

from __future__ import annotations

import os
import threading

import paho.mqtt.client as mqtt
from autobahn.twisted.websocket import WebSocketClientFactory, WebSocketClientProtocol
from twisted.internet import defer, protocol, reactor, threads
from twisted.internet.endpoints import (
    SSL4ClientEndpoint,
    TCP4ClientEndpoint,
    serverFromString,
)
from twisted.internet.error import ConnectionDone
from twisted.trial import unittest

from cluster.tools.certs import write_issued
from mqtt_proxy.tls import peer_identity, tls_server_endpoint
from mqtt_proxy.websocket import websocket_factory
from tests.integration.pki_fixtures import PKI, temp_dir

CONNECT = bytes.fromhex("101000044d5154540402003c0004746573") + b"t"  # MQTT 3.1.1 CONNECT, client id "test"
CONNACK = b"\x20\x02\x00\x00"
PINGREQ = b"\xc0\x00"
PINGRESP = b"\xd0\x00"


class Echo(protocol.Protocol):
    """Writes back whatever it receives."""

    def dataReceived(self, data):  # noqa: N802
        self.transport.write(data)


class ConnackResponder(protocol.Protocol):
    """A minimal MQTT server: reassembles packets from the byte stream, answers CONNECT, PINGREQ, PUBLISH.

    CONNECT gets CONNACK (and the peer identity is recorded on the factory), PINGREQ gets PINGRESP,
    a QoS 0 PUBLISH is sent back as is, DISCONNECT closes.
    """

    def connectionMade(self):  # noqa: N802
        self.buffer = b""

    def dataReceived(self, data):  # noqa: N802
        self.buffer += data
        while True:
            packet = self._next_packet()
            if packet is None:
                return
            kind = packet[0] >> 4
            if kind == 1:
                self.factory.identities.append(peer_identity(self.transport))
                self.transport.write(CONNACK)
            elif kind == 12:
                self.transport.write(PINGRESP)
            elif kind == 3:
                self.transport.write(packet)
            elif kind == 14:
                self.transport.loseConnection()

    def _next_packet(self):
        length, multiplier, index = 0, 1, 1
        while True:
            if index >= len(self.buffer):
                return None
            byte = self.buffer[index]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            index += 1
            if not byte & 0x80:
                break
        if len(self.buffer) < index + length:
            return None
        packet, self.buffer = self.buffer[:index + length], self.buffer[index + length:]
        return packet


class AddressReporter(protocol.Protocol):
    """Sends the peer and host addresses it sees, then closes the connection from the server side."""

    def connectionMade(self):  # noqa: N802
        peer, host = self.transport.getPeer(), self.transport.getHost()
        self.transport.registerProducer(self, True)
        self.transport.unregisterProducer()
        self.transport.writeSequence([f"{peer.host} {host.port}".encode()])
        self.transport.loseConnection()

    def connectionLost(self, reason):  # noqa: N802
        self.factory.lost.callback(reason.value)

    def pauseProducing(self):  # noqa: N802
        pass

    resumeProducing = stopProducing = pauseProducing


class RecordingClient(WebSocketClientProtocol):
    """Runs ``factory.script(self)`` on open, records binary messages and the close code."""

    def onOpen(self):  # noqa: N802
        self.factory.script(self)

    def onMessage(self, payload, isBinary):  # noqa: N802, N803
        self.factory.messages.append(payload)
        if len(self.factory.messages) == self.factory.expect:
            self.sendClose(1000)

    def onClose(self, wasClean, code, reason):  # noqa: N802, N803
        if not self.factory.closed.called:
            self.factory.closed.callback(code)


class ServingTestCase(unittest.TestCase):
    """Serves an inner protocol through the WebSocket wrapper on 127.0.0.1."""

    @defer.inlineCallbacks
    def serve(self, inner_protocol, description="tcp:0:interface=127.0.0.1", ca_file=None, **kwargs):
        """Listen with the wrapper around *inner_protocol*; return (port number, inner factory)."""
        inner = protocol.Factory.forProtocol(inner_protocol)
        inner.identities = []
        inner.lost = defer.Deferred()
        if description.startswith("ssl:"):
            endpoint = tls_server_endpoint(reactor, description, ca_file)
        else:
            endpoint = serverFromString(reactor, description)
        port = yield endpoint.listen(websocket_factory(inner, clock=reactor, **kwargs))
        self.addCleanup(port.stopListening)
        return port.getHost().port, inner


class WebSocketTests(ServingTestCase):
    """The WebSocket wrapper served on 127.0.0.1, driven by autobahn and paho clients."""

    timeout = 20

    @defer.inlineCallbacks
    def run_client(self, port, script, expect, path="/mqtt", protocols=("mqtt",)):
        """Connect an autobahn client, run *script*, wait for *expect* messages; return (messages, close code)."""
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{port}{path}", protocols=list(protocols))
        factory.protocol = RecordingClient
        factory.script, factory.expect, factory.messages = script, expect, []
        factory.closed = defer.Deferred()
        yield TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(factory)
        code = yield factory.closed
        return factory.messages, code

    @defer.inlineCallbacks
    def test_echo_over_fragmented_frames(self):
        """An echo protocol gets the bytes of a message sent as many small WebSocket frames."""
        port, _ = yield self.serve(Echo)
        messages, code = yield self.run_client(
            port, lambda c: c.sendMessage(b"hello websocket", isBinary=True, fragmentSize=3), expect=1)
        self.assertEqual(messages, [b"hello websocket"])
        self.assertEqual(code, 1000)

    @defer.inlineCallbacks
    def test_packet_spans_messages_and_message_holds_packets(self):
        """A CONNECT split over two messages is answered, and two PINGREQs in one message get two PINGRESPs."""
        port, inner = yield self.serve(ConnackResponder)

        def script(client):
            client.sendMessage(CONNECT[:5], isBinary=True)
            client.sendMessage(CONNECT[5:], isBinary=True, fragmentSize=2)
            client.sendMessage(PINGREQ + PINGREQ, isBinary=True)

        messages, _ = yield self.run_client(port, script, expect=3)
        self.assertEqual(b"".join(messages), CONNACK + PINGRESP + PINGRESP)
        self.assertEqual(inner.identities, [None])

    @defer.inlineCallbacks
    def test_transport_addresses_and_server_close(self):
        """The inner transport reports real addresses, and loseConnection is a clean 1000 close."""
        port, inner = yield self.serve(AddressReporter)
        messages, code = yield self.run_client(port, lambda c: None, expect=0)
        self.assertEqual(messages, [f"127.0.0.1 {port}".encode()])
        self.assertEqual(code, 1000)
        reason = yield inner.lost
        self.assertIsInstance(reason, ConnectionDone)

    @defer.inlineCallbacks
    def test_text_frame_closes_with_1003(self):
        """A text message closes the connection with 1003 (MQTT-6.0.0-1)."""
        port, _ = yield self.serve(Echo)
        messages, code = yield self.run_client(port, lambda c: c.sendMessage(b"text", isBinary=False), expect=1)
        self.assertEqual((messages, code), ([], 1003))

    @defer.inlineCallbacks
    def test_wrong_path_and_missing_subprotocol_refused(self):
        """The opening handshake fails on another path or without the mqtt subprotocol."""
        port, _ = yield self.serve(Echo)
        for path, protocols in (("/other", ("mqtt",)), ("/mqtt", ()), ("/mqtt", ("wamp.2.json",))):
            messages, code = yield self.run_client(
                port, lambda c: c.sendMessage(b"x", isBinary=True), expect=1, path=path, protocols=protocols)
            self.assertEqual(messages, [], f"path {path} protocols {protocols} was served")
            self.assertNotEqual(code, 1000)

    @defer.inlineCallbacks
    def test_custom_path(self):
        """A configured path is served instead of /mqtt."""
        port, _ = yield self.serve(Echo, url_path="/ws")
        messages, _ = yield self.run_client(port, lambda c: c.sendMessage(b"hi", isBinary=True), expect=1,
                                            path="/ws")
        self.assertEqual(messages, [b"hi"])

    @defer.inlineCallbacks
    def test_oversized_message_fails_connection(self):
        """A message larger than max_message_size closes the connection instead of being buffered."""
        port, _ = yield self.serve(Echo, max_message_size=64)
        messages, code = yield self.run_client(port, lambda c: c.sendMessage(b"x" * 1000, isBinary=True), expect=1)
        self.assertEqual(messages, [])
        self.assertNotEqual(code, 1000)

    @defer.inlineCallbacks
    def test_wss_transport_exposes_client_certificate(self):
        """Over wss with a required client certificate, the inner protocol sees the verified identity."""
        pki = PKI(temp_dir(self))
        port, inner = yield self.serve(ConnackResponder, pki.ssl_description(), ca_file=pki.ca_file)
        factory = WebSocketClientFactory(f"wss://localhost:{port}/mqtt", protocols=["mqtt"])
        factory.protocol = RecordingClient
        factory.script = lambda c: c.sendMessage(CONNECT, isBinary=True)
        factory.expect, factory.messages, factory.closed = 1, [], defer.Deferred()
        yield SSL4ClientEndpoint(reactor, "127.0.0.1", port, pki.client_options("good")).connect(factory)
        yield factory.closed
        self.assertEqual(factory.messages, [CONNACK])
        self.assertEqual(inner.identities, ["good-client"])


def paho_round_trip(port, tls=None):
    """Blocking: connect paho over WebSocket, publish QoS 0, wait for the echo; return (rc, payload)."""
    done = threading.Event()
    result = {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-ws", transport="websockets")
    client.ws_set_options(path="/mqtt")
    if tls is not None:
        client.tls_set(**tls)

    def on_connect(c, userdata, flags, reason_code, properties):
        result["rc"] = reason_code.value
        c.publish("t/ws", b"over websocket")

    def on_message(c, userdata, message):
        result["payload"] = message.payload
        done.set()

    client.on_connect, client.on_message = on_connect, on_message
    client.connect("localhost" if tls else "127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        done.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    return result.get("rc"), result.get("payload")


class PahoWebSocketTests(ServingTestCase):
    """paho-mqtt with transport='websockets' against the wrapper (ws:// and wss:// with a client cert)."""

    timeout = 30

    @defer.inlineCallbacks
    def test_paho_over_ws(self):
        """paho connects over ws://, gets CONNACK and its PUBLISH echoed."""
        port, _ = yield self.serve(ConnackResponder)
        rc, payload = yield threads.deferToThread(paho_round_trip, port)
        self.assertEqual((rc, payload), (0, b"over websocket"))

    @defer.inlineCallbacks
    def test_paho_over_wss_with_client_certificate(self):
        """paho connects over wss:// with tls_set and a client certificate; the broker sees its CN."""
        pki = PKI(temp_dir(self))
        port, inner = yield self.serve(ConnackResponder, pki.ssl_description(), ca_file=pki.ca_file)
        cert, key = os.path.join(pki.dir, "good.pem"), os.path.join(pki.dir, "good.key")
        write_issued(pki.clients["good"], cert, key)
        tls = {"ca_certs": pki.ca_file, "certfile": cert, "keyfile": key}
        rc, payload = yield threads.deferToThread(paho_round_trip, port, tls)
        self.assertEqual((rc, payload), (0, b"over websocket"))
        self.assertEqual(inner.identities, ["good-client"])
