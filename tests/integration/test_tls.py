"""TLS listeners over real sockets: versions, mutual TLS with good and bad client certificates, identity."""

from __future__ import annotations

from OpenSSL import SSL
from twisted.internet import defer, endpoints, protocol, reactor, task
from twisted.internet.endpoints import SSL4ClientEndpoint
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLContextFactory
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial import unittest
from zope.interface import implementer

from cluster.tools.certs import make_server_cert, write_issued
from mqtt_proxy.tls import (
    TLSConfigError,
    certificate_identity,
    parse_description,
    peer_identity,
    server_endpoint,
    tls_server_endpoint,
)
from tests.integration.pki_fixtures import PKI, temp_dir


class IdentityServer(protocol.Protocol):
    """Answers any data with the peer's certificate identity (or '-') and a newline."""

    def dataReceived(self, data):  # noqa: N802
        self.transport.write((peer_identity(self.transport) or "-").encode() + b"\n")


@implementer(IHandshakeListener)
class Probe(protocol.Protocol):
    """Sends 'ping' once connected; fires ``done`` with (received bytes, reason) when the connection ends."""

    def __init__(self):
        self.received = b""
        self.done = defer.Deferred()
        self.server_cert = None
        self.local_port = None

    def connectionMade(self):  # noqa: N802
        self.local_port = self.transport.getHost().port
        self.transport.write(b"ping")

    def handshakeCompleted(self):  # noqa: N802 - IHandshakeListener: note the certificate the server served
        self.server_cert = self.transport.getPeerCertificate().to_cryptography()

    def dataReceived(self, data):  # noqa: N802
        self.received += data
        if self.received.endswith(b"\n"):
            self.transport.loseConnection()

    def connectionLost(self, reason):  # noqa: N802
        self.done.callback((self.received, reason))


@implementer(IOpenSSLContextFactory)
class RawContextFactory:
    """A bare pyOpenSSL context allowing TLS 1.1 (security level 0), for the version-refusal test."""

    def __init__(self, max_version=None, cert_file=None, key_file=None):
        self.context = SSL.Context(SSL.TLS_METHOD)
        self.context.set_min_proto_version(SSL.TLS1_1_VERSION)
        if max_version is not None:
            self.context.set_max_proto_version(max_version)
        self.context.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
        if cert_file:
            self.context.use_certificate_file(cert_file)
            self.context.use_privatekey_file(key_file)

    def getContext(self):  # noqa: N802 - Twisted interface
        return self.context


@defer.inlineCallbacks
def wait_for_lines(lines: list[str], prefix: str, timeout: float = 5.0):
    """The lines starting with *prefix*, waiting (bounded) for the first: the server half closes asynchronously."""
    deadline = reactor.seconds() + timeout
    while not any(ln.startswith(prefix) for ln in lines) and reactor.seconds() < deadline:
        yield task.deferLater(reactor, 0.01, lambda: None)
    return [ln for ln in lines if ln.startswith(prefix)]


class TLSListenerTests(unittest.TestCase):
    """A tls_server_endpoint listener on 127.0.0.1 against real OpenSSL clients."""

    timeout = 20

    def setUp(self):
        self.pki = PKI(temp_dir(self))

    @defer.inlineCallbacks
    def listen(self, ca_file=None):
        """Start an IdentityServer behind the TLS endpoint; return the port number."""
        self.endpoint = tls_server_endpoint(reactor, self.pki.ssl_description(), ca_file)
        port = yield self.endpoint.listen(protocol.Factory.forProtocol(IdentityServer))
        self.addCleanup(port.stopListening)
        return port.getHost().port

    @defer.inlineCallbacks
    def exchange(self, port, options):
        """Connect with *options*, send ping, return the bytes received before the connection closed."""
        probe = yield self.probe(port, options)
        return probe.received

    @defer.inlineCallbacks
    def probe(self, port, options):
        """Connect with *options*, send ping, wait for the end; return the Probe (bytes, served cert, local port)."""
        probe = Probe()
        endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, options)
        try:
            yield endpoint.connect(protocol.Factory.forProtocol(lambda: probe))
        except SSL.Error:
            return probe
        yield probe.done
        return probe

    def capture_log(self) -> list[str]:
        """Collect the text of every log event emitted until the test ends."""
        lines: list[str] = []

        def observe(event):
            lines.append(formatEvent(event))
        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        return lines

    @defer.inlineCallbacks
    def test_plain_tls_without_ca(self):
        """Without a CA the server asks for no client certificate and the identity is None."""
        port = yield self.listen()
        received = yield self.exchange(port, self.pki.client_options())
        self.assertEqual(received, b"-\n")

    @defer.inlineCallbacks
    def test_good_client_certificate_accepted(self):
        """A client certificate signed by the CA is accepted and its CN is the identity."""
        port = yield self.listen(self.pki.ca_file)
        received = yield self.exchange(port, self.pki.client_options("good"))
        self.assertEqual(received, b"good-client\n")

    @defer.inlineCallbacks
    def test_bad_client_certificates_rejected(self):
        """Missing, expired, self-signed and other-CA client certificates all fail the handshake."""
        port = yield self.listen(self.pki.ca_file)
        for client in (None, "expired", "selfsigned", "otherca"):
            received = yield self.exchange(port, self.pki.client_options(client))
            self.assertEqual(received, b"", f"client certificate {client!r} was accepted")

    @defer.inlineCallbacks
    def test_refused_handshakes_are_logged_with_peer_and_reason(self):
        """Each refused client certificate leaves one tls_handshake_failed line naming its address and why."""
        lines = self.capture_log()
        port = yield self.listen(self.pki.ca_file)
        expected = {None: "peer did not return a certificate", "expired": "certificate has expired",
                    "selfsigned": "self-signed certificate", "otherca": "unable to get local issuer certificate"}
        for client, why in expected.items():
            probe = yield self.probe(port, self.pki.client_options(client))
            self.assertEqual(probe.received, b"")
            prefix = f"tls_handshake_failed peer=127.0.0.1:{probe.local_port} "
            found = yield wait_for_lines(lines, prefix)
            self.assertEqual(len(found), 1, f"{client!r}: {lines}")
            self.assertIn(why, found[0])

    @defer.inlineCallbacks
    def test_non_tls_peers_are_logged_too(self):
        """Plain MQTT bytes on the TLS port, a client refusing our certificate and a bare connect-close are logged."""
        lines = self.capture_log()
        port = yield self.listen()
        plain = yield self.raw_tcp(port, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        closed = yield self.raw_tcp(port, b"")
        other = PKI(temp_dir(self))  # a client trusting another CA refuses our certificate with an alert
        refusing = yield self.probe(port, other.client_options())
        reasons = {}
        for name, local_port in (("plain", plain), ("closed", closed), ("refusing", refusing.local_port)):
            found = yield wait_for_lines(lines, f"tls_handshake_failed peer=127.0.0.1:{local_port} ")
            self.assertEqual(len(found), 1, f"{name}: {lines}")
            reasons[name] = found[0]
        self.assertNotIn("closed by the peer", reasons["plain"])  # an OpenSSL record error, named as such
        self.assertIn("closed by the peer before the handshake completed", reasons["closed"])
        self.assertIn("alert", reasons["refusing"])

    @defer.inlineCallbacks
    def raw_tcp(self, port, data: bytes):
        """Connect over plain TCP, send *data*, close, and return the local port once the server has closed too."""
        done = defer.Deferred()

        class Raw(protocol.Protocol):
            def connectionMade(self):  # noqa: N802
                self.local_port = self.transport.getHost().port
                if data:
                    self.transport.write(data)
                else:
                    self.transport.loseConnection()

            def connectionLost(self, reason):  # noqa: N802
                done.callback(self.local_port)
        yield endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port).connect(protocol.Factory.forProtocol(Raw))
        local_port = yield done
        return local_port

    @defer.inlineCallbacks
    def test_accepted_handshake_is_not_logged(self):
        """A good client certificate leaves no tls_handshake_failed line."""
        lines = self.capture_log()
        port = yield self.listen(self.pki.ca_file)
        received = yield self.exchange(port, self.pki.client_options("good"))
        self.assertEqual(received, b"good-client\n")
        self.assertEqual([ln for ln in lines if "tls_handshake_failed" in ln], [])

    @defer.inlineCallbacks
    def test_reload_serves_the_new_certificate_to_new_connections(self):
        """After the files change, reload() makes new handshakes get the new certificate; a bad pair keeps the old."""
        port = yield self.listen()
        first = (yield self.probe(port, self.pki.client_options())).server_cert
        self.assertEqual(first.serial_number, self.pki.server.cert.serial_number)
        renewed = make_server_cert(self.pki.ca, ["localhost", "127.0.0.1"])
        write_issued(renewed, self.pki.server_cert, self.pki.server_key)
        info = self.endpoint.context_factory.reload()
        self.assertEqual(info["serial"], format(renewed.cert.serial_number, "x"))
        second = (yield self.probe(port, self.pki.client_options())).server_cert
        self.assertEqual(second.serial_number, renewed.cert.serial_number)
        # A key that does not match the certificate: refused, and the renewed pair stays in use.
        other = make_server_cert(self.pki.ca, ["localhost"])
        with open(self.pki.server_key, "wb") as handle:
            handle.write(other.key_pem())
        with self.assertRaises(TLSConfigError):
            self.endpoint.context_factory.reload()
        third = (yield self.probe(port, self.pki.client_options())).server_cert
        self.assertEqual(third.serial_number, renewed.cert.serial_number)

    @defer.inlineCallbacks
    def test_reload_rereads_the_client_ca(self):
        """A client CA file replaced by another CA's certificate refuses the old CA's clients after reload()."""
        port = yield self.listen(self.pki.ca_file)
        received = yield self.exchange(port, self.pki.client_options("good"))
        self.assertEqual(received, b"good-client\n")
        other = PKI(temp_dir(self))
        with open(self.pki.ca_file, "wb") as handle:
            handle.write(other.ca.cert_pem())
        self.endpoint.context_factory.reload()
        received = yield self.exchange(port, self.pki.client_options("good"))
        self.assertEqual(received, b"")

    @defer.inlineCallbacks
    def test_tls_1_1_refused(self):
        """A client limited to TLS 1.1 cannot connect, though it can talk to a server that allows TLS 1.1."""
        legacy = RawContextFactory(max_version=SSL.TLS1_1_VERSION)
        # Control: the same client against a deliberately permissive server must work,
        # so the refusal below comes from our server, not from the client's OpenSSL.
        lax_options = RawContextFactory(cert_file=self.pki.server_cert, key_file=self.pki.server_key)
        lax = reactor.listenSSL(0, protocol.Factory.forProtocol(IdentityServer), lax_options,
                                interface="127.0.0.1")
        self.addCleanup(lax.stopListening)
        control = yield self.exchange(lax.getHost().port, legacy)
        if control != b"-\n":
            raise unittest.SkipTest("this OpenSSL build cannot speak TLS 1.1 at all")
        port = yield self.listen()
        received = yield self.exchange(port, legacy)
        self.assertEqual(received, b"")

    def test_bad_descriptions(self):
        """Non-ssl types, sslmethod, unknown keys and missing files are clear TLSConfigErrors."""
        with self.assertRaises(TLSConfigError):
            tls_server_endpoint(reactor, "tcp:1883")
        with self.assertRaises(TLSConfigError):
            tls_server_endpoint(reactor, self.pki.ssl_description() + ":sslmethod=TLSv1_METHOD")
        with self.assertRaises(TLSConfigError):
            tls_server_endpoint(reactor, self.pki.ssl_description() + ":bogus=1")
        with self.assertRaises(TLSConfigError):
            tls_server_endpoint(reactor, "ssl:0:privateKey=/nonexistent/key.pem")
        with self.assertRaises(TLSConfigError):
            tls_server_endpoint(reactor, self.pki.ssl_description(), ca_file=self.pki.server_key)

    def test_server_endpoint_dispatch(self):
        """server_endpoint sends tcp: descriptions to serverFromString and ssl: ones to the TLS builder."""
        self.assertEqual(type(server_endpoint(reactor, "tcp:0:interface=127.0.0.1")).__name__, "TCP4ServerEndpoint")
        self.assertEqual(type(server_endpoint(reactor, self.pki.ssl_description())).__name__, "TLSServerEndpoint")

    def test_parse_description_quoting(self):
        """Backslash-escaped colons and equals signs stay inside values, as in Twisted."""
        kind, args, kwargs = parse_description(r"ssl:8883:privateKey=C\:\\k\=1.pem:interface=\:\:1")
        self.assertEqual((kind, args), ("ssl", ["8883"]))
        self.assertEqual(kwargs, {"privateKey": "C:\\k=1.pem", "interface": "::1"})

    def test_identity_falls_back_to_san(self):
        """Without a CN the first DNS SAN, then the first e-mail SAN, is the identity."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        def cert_with(subject, san):
            builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.pki.ca.cert.subject)
                       .public_key(self.pki.ca.key.public_key()).serial_number(1)
                       .not_valid_before(self.pki.ca.cert.not_valid_before_utc)
                       .not_valid_after(self.pki.ca.cert.not_valid_after_utc))
            if san:
                builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
            return builder.sign(self.pki.ca.key, hashes.SHA256())

        org = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o")])
        self.assertEqual(certificate_identity(cert_with(org, [x509.RFC822Name("a@b.c"), x509.DNSName("dev1")])),
                         "dev1")
        self.assertEqual(certificate_identity(cert_with(org, [x509.RFC822Name("a@b.c")])), "a@b.c")
        self.assertIsNone(certificate_identity(cert_with(org, None)))
        self.assertEqual(certificate_identity(self.pki.clients["good"].cert), "good-client")
