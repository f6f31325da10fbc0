"""TLS listeners over real sockets: versions, mutual TLS with good and bad client certificates, identity."""

from __future__ import annotations

from OpenSSL import SSL
from zope.interface import implementer
from twisted.internet import defer, protocol, reactor
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.internet.endpoints import SSL4ClientEndpoint
from twisted.trial import unittest

from mqtt_proxy.tls import (TLSConfigError, certificate_identity, parse_description, peer_identity,
                            server_endpoint, tls_server_endpoint)
from tests.integration.pki_fixtures import PKI, temp_dir


class IdentityServer(protocol.Protocol):
    """Answers any data with the peer's certificate identity (or '-') and a newline."""

    def dataReceived(self, data):  # noqa: N802
        self.transport.write((peer_identity(self.transport) or "-").encode() + b"\n")


class Probe(protocol.Protocol):
    """Sends 'ping' once connected; fires ``done`` with (received bytes, reason) when the connection ends."""

    def __init__(self):
        self.received = b""
        self.done = defer.Deferred()

    def connectionMade(self):  # noqa: N802
        self.transport.write(b"ping")

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


class TLSListenerTests(unittest.TestCase):
    """A tls_server_endpoint listener on 127.0.0.1 against real OpenSSL clients."""

    timeout = 20

    def setUp(self):
        self.pki = PKI(temp_dir(self))

    @defer.inlineCallbacks
    def listen(self, ca_file=None):
        """Start an IdentityServer behind the TLS endpoint; return the port number."""
        endpoint = tls_server_endpoint(reactor, self.pki.ssl_description(), ca_file)
        port = yield endpoint.listen(protocol.Factory.forProtocol(IdentityServer))
        self.addCleanup(port.stopListening)
        return port.getHost().port

    @defer.inlineCallbacks
    def exchange(self, port, options):
        """Connect with *options*, send ping, return the bytes received before the connection closed."""
        probe = Probe()
        endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, options)
        try:
            yield endpoint.connect(protocol.Factory.forProtocol(lambda: probe))
        except SSL.Error:
            return b""
        received, _reason = yield probe.done
        return received

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
        self.assertEqual(type(server_endpoint(reactor, self.pki.ssl_description())).__name__, "SSL4ServerEndpoint")

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
