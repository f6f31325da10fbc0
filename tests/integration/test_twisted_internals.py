"""The Twisted transport internals mqtt_proxy/twisted_internals.py relies on: this fails if Twisted changes them.

Real TCP transports over a socket pair (built, never started: nothing here runs
a reactor), so the attributes checked are the ones a live connection has.
"""

from __future__ import annotations

import socket
import sys
from types import SimpleNamespace

import pytest
from twisted.internet import protocol, tcp
from twisted.internet.testing import MemoryReactor

from mqtt_proxy.twisted_internals import (
    TRANSPORT_KEYS, can_send_directly, raise_send_limit, send, share_log_strings,
)


@pytest.fixture()
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    yield a, b
    a.close()
    b.close()


def _server(sock) -> tcp.Server:
    port = SimpleNamespace(_realPortNumber=1883)  # what a Server reads of its listening Port
    return tcp.Server(sock, protocol.Protocol(), ("127.0.0.1", 50000), port, 1, MemoryReactor())


def test_tcp_transport_has_the_buffer_attributes_send_reads(pair):
    """A TCP transport has dataBuffer, _tempDataLen, connected, disconnecting, TLS and socket: direct sends work."""
    transport = _server(pair[0])
    transport.connected = 1
    for name in ("dataBuffer", "_tempDataLen", "disconnecting", "TLS", "socket", "SEND_LIMIT"):
        assert hasattr(transport, name), name
    assert can_send_directly(transport)
    send(transport, b"hello", direct=True)
    assert pair[1].recv(16) == b"hello"  # went straight to the socket, nothing queued in Twisted's buffer
    assert not transport.dataBuffer and not transport._tempDataLen


def test_send_limit_is_a_class_default_raised_per_transport(pair):
    """SEND_LIMIT is Twisted's per-pass send size (a class attribute): raising it changes only this transport."""
    transport = _server(pair[0])
    default = tcp.Server.SEND_LIMIT
    raise_send_limit(transport, default * 8)
    assert transport.SEND_LIMIT == default * 8 and tcp.Server.SEND_LIMIT == default
    raise_send_limit(transport, 1)  # never lowered
    assert transport.SEND_LIMIT == default * 8


def test_log_strings_are_what_twisted_formats_per_connection(pair):
    """A TCP server transport keeps logstr and repstr, which Twisted reads for its log prefix and repr."""
    transport = _server(pair[0])
    assert isinstance(transport.logstr, str) and isinstance(transport.repstr, str)
    share_log_strings(transport, "MQTTServerProtocol")
    assert transport.logPrefix() == "MQTTServerProtocol" and repr(transport) == "MQTTServerProtocol"


def test_session_number_and_peer_host_are_only_what_the_log_strings_and_peer_show(pair):
    """share_log_strings keeps getPeer() and the log strings right while the host is interned and sessionno shared."""
    host = "".join(["127.0.", "0.1"])  # a string of its own, as an accepted connection's address has
    transport = tcp.Server(pair[0], protocol.Protocol(), (host, 50000), SimpleNamespace(_realPortNumber=1883), 70000,
                           MemoryReactor())
    share_log_strings(transport, "MQTTServerProtocol")
    peer = transport.getPeer()
    assert (peer.host, peer.port) == ("127.0.0.1", 50000) and transport.hostname == "127.0.0.1"
    assert peer.host is sys.intern("127.0.0.1") and transport.sessionno == 0
    assert transport.logPrefix() == "MQTTServerProtocol"


def test_transport_keys_name_every_attribute_of_an_open_transport(pair):
    """An open TCP server transport (producer paused by a full buffer, a write flushed) has no attribute outside
    TRANSPORT_KEYS."""
    transport = _server(pair[0])
    transport.connected = 1
    producer = SimpleNamespace(pauseProducing=lambda: None, resumeProducing=lambda: None, stopProducing=lambda: None)
    transport.registerProducer(producer, True)
    transport.bufferSize = 4
    raise_send_limit(transport, 1 << 20)
    transport.write(b"x" * 10)  # past bufferSize: Twisted pauses the producer
    assert transport.producerPaused
    transport.doWrite()
    assert pair[1].recv(16) == b"x" * 10
    assert set(vars(transport)) <= set(TRANSPORT_KEYS), set(vars(transport)) - set(TRANSPORT_KEYS)


def test_udp_port_reads_max_packet_size_bytes():
    """Twisted's UDP port reads maxPacketSize bytes per datagram: what read_datagrams_up_to sets."""
    import inspect

    from twisted.internet import udp

    from mqtt_proxy.twisted_internals import read_datagrams_up_to
    assert "recvfrom(self.maxPacketSize)" in inspect.getsource(udp.Port.doRead)
    port = udp.Port(0, protocol.DatagramProtocol(), "127.0.0.1", reactor=MemoryReactor())
    read_datagrams_up_to(port, 20001)
    assert port.maxPacketSize == 20001


def test_http_channel_knows_the_target_before_the_body():
    """An HTTP channel holds the request target (_path) once the request line is in, before any body byte."""
    from twisted.internet.testing import StringTransport
    from twisted.web import http

    from mqtt_proxy.twisted_internals import request_target
    channel = http.HTTPChannel()
    channel.makeConnection(StringTransport())
    assert request_target(channel) is None
    channel.dataReceived(b"POST /api/v1/publish HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n")
    assert request_target(channel) == b"/api/v1/publish"
    channel.connectionLost(None)


@pytest.fixture()
def tcp_pair():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname(), timeout=5)
    server, _ = listener.accept()
    listener.close()
    server.setblocking(False)
    yield server, client
    server.close()
    client.close()


def test_connack_goes_straight_to_the_socket(tcp_pair, tmp_path):
    """A CONNACK leaves at once, with no poll round (nothing queued before it); later packets queue as before."""
    from mqtt_proxy.codec import ConnAck, Connect, MQTTParser, PingReq, encode
    from tests.unit.test_mqtt_broker import Harness

    front = Harness(tmp_path)
    try:
        proto = front.factory.buildProtocol(None)
        transport = tcp.Server(tcp_pair[0], proto, ("127.0.0.1", 50000), SimpleNamespace(_realPortNumber=1883), 1,
                               MemoryReactor())  # never started: only a direct send reaches the socket
        proto.makeConnection(transport)
        proto.dataReceived(encode(Connect(client_id="direct", protocol_level=4), 4))
        front.tick()
        (ack,) = MQTTParser(server_side=False, protocol_level=4).feed(tcp_pair[1].recv(64))
        assert isinstance(ack, ConnAck) and ack.reason_code == 0
        proto.dataReceived(encode(PingReq(), 4))
        assert transport._tempDataLen == 2  # a PINGRESP waits for the reactor, as every other packet
    finally:
        proto.connectionLost(None)  # the registry lets the session go; the fixture closes the sockets
        front.close()


def test_a_port_prepared_by_the_mqtt_factory_builds_shared_buffer_transports():
    """The MQTT factory makes its TCP port build SharedBufferServer transports; other ports are left alone."""
    from mqtt_proxy.protocol import MQTTServerFactory
    from mqtt_proxy.twisted_internals import SharedBufferServer

    port = tcp.Port(0, protocol.Factory(), reactor=MemoryReactor())
    MQTTServerFactory(None, None).prepare_port(port)
    assert port.transport is SharedBufferServer and tcp.Port.transport is tcp.Server
    MQTTServerFactory(None, None).prepare_port(SimpleNamespace(transport=None))  # not a TCP port: no-op


def test_a_shared_buffer_read_is_twisteds_without_allocating_the_buffer_size(pair):
    """SharedBufferServer.doRead hands the protocol what came (small, up to bufferSize, then the end) and a
    small read does not allocate bufferSize bytes, as Twisted's recv(bufferSize) does."""
    import tracemalloc

    from mqtt_proxy.twisted_internals import SharedBufferServer

    got = []
    proto = protocol.Protocol()
    proto.dataReceived = got.append
    transport = SharedBufferServer(pair[0], proto, ("127.0.0.1", 50000), SimpleNamespace(_realPortNumber=1883), 1,
                                   MemoryReactor())
    transport.bufferSize = 1 << 20
    transport.doRead()  # the shared buffer grows to bufferSize once
    pair[1].sendall(b"\x10\x0c" + b"c" * 12)
    tracemalloc.start()
    try:
        assert transport.doRead() is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [b"\x10\x0c" + b"c" * 12]
    assert peak < 64 * 1024, peak  # Twisted's own read allocates the whole megabyte
    big = bytes(range(256)) * 400  # within the socket pair's buffer: sendall returns before the reads
    pair[1].sendall(big)
    while sum(map(len, got[1:])) < len(big):
        transport.doRead()
    assert b"".join(got[1:]) == big
    pair[1].close()
    from twisted.internet import main
    assert transport.doRead() is main.CONNECTION_DONE
