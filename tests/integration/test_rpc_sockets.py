"""RPC and MQTT on real sockets in-process: TCP_NODELAY on both ends of every RPC connection and on accepted
MQTT sockets (read back with getsockopt), and RPC calls over TLS client endpoints (``tls:`` and ``ssl:``)."""

from __future__ import annotations

import pathlib
import socket

from twisted.internet import defer, endpoints, reactor, task
from twisted.trial import unittest

from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RpcSettings
from cluster.rpc.server import RpcServerFactory
from mqtt_proxy.tls import tls_server_endpoint
from tests.integration.pki_fixtures import PKI, escape, temp_dir
from tests.unit.test_mqtt_broker import Harness

SETTINGS = RpcSettings(call_timeout=5.0, heartbeat_interval=1.0, max_frame=1 << 20, secret="sockets-secret")


def no_delay(transport) -> int:
    """TCP_NODELAY as the kernel has it for *transport*'s socket (through a TLS wrapper if there is one)."""
    handle = transport.getHandle()
    sock = handle if isinstance(handle, socket.socket) else transport.transport.getHandle()
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


class RpcSocketsTest(unittest.TestCase):
    """A broker-side RPC server and a PeerClient on 127.0.0.1, over plain TCP and over TLS."""

    @defer.inlineCallbacks
    def serve_and_dial(self, server_description: str, client_description) -> defer.Deferred:
        """Listen on *server_description*, dial ``client_description(port)``; the client once connected."""
        dispatcher = Dispatcher(reactor)
        dispatcher.register("echo", lambda p, body: body)
        self.factory = RpcServerFactory(Hello("c", "b1", "broker", RPC_VERSION), SETTINGS, reactor, dispatcher)
        port = yield endpoints.serverFromString(reactor, server_description).listen(self.factory)
        self.addCleanup(port.stopListening)
        self.addCleanup(self.factory.stop)
        endpoint = endpoints.clientFromString(reactor, client_description(port.getHost().port))
        peer = PeerClient("b1", endpoint, Hello("c", "p1", "proxy", RPC_VERSION), SETTINGS, reactor)
        peer.startService()
        self.addCleanup(peer.stopService)
        yield peer.when_connected().addTimeout(10, reactor)
        return peer

    @defer.inlineCallbacks
    def test_both_ends_of_an_rpc_connection_disable_nagle(self):
        """The dialled and the accepted socket of an RPC connection both have TCP_NODELAY set."""
        peer = yield self.serve_and_dial("tcp:0:interface=127.0.0.1", lambda port: f"tcp:127.0.0.1:{port}")
        (accepted,) = self.factory.connections
        self.assertTrue(no_delay(peer.protocol.transport))
        self.assertTrue(no_delay(accepted.transport))
        answer = yield peer.call("echo", b"plain")
        self.assertEqual(answer, b"plain")

    @defer.inlineCallbacks
    def test_a_call_over_a_tls_endpoint_with_host_name_check(self):
        """An ssl: RPC listener is dialled with a tls: client endpoint trusting the cluster's CA: the handshake
        and a call go through TLS, and Nagle is off under it too."""
        pki = PKI(temp_dir(self))
        trust = temp_dir(self)
        with open(pki.ca_file, "rb") as src, open(f"{trust}/ca.pem", "wb") as dst:
            dst.write(src.read())
        peer = yield self.serve_and_dial(pki.ssl_description(),
                                         lambda port: f"tls:127.0.0.1:{port}:trustRoots={escape(trust)}")
        self.assertIsNotNone(peer.protocol.transport.getPeerCertificate())
        answer = yield peer.call("echo", b"over tls")
        self.assertEqual(answer, b"over tls")
        (accepted,) = self.factory.connections
        self.assertTrue(no_delay(peer.protocol.transport))
        self.assertTrue(no_delay(accepted.transport))

    @defer.inlineCallbacks
    def test_a_call_over_an_ssl_client_endpoint(self):
        """The ssl:host=..:port=..:caCertsDir=.. form of a client endpoint works for RPC as well."""
        pki = PKI(temp_dir(self))
        trust = temp_dir(self)
        with open(pki.ca_file, "rb") as src, open(f"{trust}/ca.pem", "wb") as dst:
            dst.write(src.read())
        peer = yield self.serve_and_dial(
            pki.ssl_description(), lambda port: f"ssl:host=127.0.0.1:port={port}:caCertsDir={escape(trust)}")
        answer = yield peer.call("echo", b"over ssl")
        self.assertEqual(answer, b"over ssl")


class MqttSocketsTest(unittest.TestCase):
    """The MQTT protocol's accepted sockets, over TCP and TLS, on a front end over a real store."""

    def setUp(self):
        self.harness = Harness(pathlib.Path(temp_dir(self)))
        self.addCleanup(self.harness.close)

    @defer.inlineCallbacks
    def accepted_no_delay(self, endpoint) -> defer.Deferred:
        port = yield endpoint.listen(self.harness.factory)
        self.addCleanup(port.stopListening)
        client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5)
        self.addCleanup(client.close)
        for _ in range(200):  # the accept happens on a later reactor turn
            if self.harness.broker.connections:
                break
            yield task.deferLater(reactor, 0.01, lambda: None)
        (proto,) = self.harness.broker.connections
        value = no_delay(proto.transport)
        proto.transport.abortConnection()
        return value

    @defer.inlineCallbacks
    def test_accepted_mqtt_sockets_disable_nagle(self):
        """An accepted MQTT TCP socket and an accepted MQTT TLS socket have TCP_NODELAY set."""
        plain = yield self.accepted_no_delay(endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1"))
        self.assertTrue(plain)
        pki = PKI(temp_dir(self))
        tls = yield self.accepted_no_delay(tls_server_endpoint(reactor, pki.ssl_description(), None))
        self.assertTrue(tls)
