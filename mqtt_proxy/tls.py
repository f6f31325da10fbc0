"""TLS listeners: Twisted ``ssl:`` endpoint descriptions made strict, and the client certificate identity.

``tls_server_endpoint(reactor, "ssl:8883:privateKey=KEY:certKey=CERT", ca_file)``
accepts the arguments of Twisted's ``ssl:`` server endpoint (``port``,
``interface``, ``backlog``, ``privateKey``, ``certKey`` (defaults to
``privateKey``), ``extraCertChain``, ``dhParameters``; ``:`` and ``=`` inside a
value are escaped with ``\\``) and builds the context itself so that:

- only TLS 1.2 and TLS 1.3 are offered (``sslmethod`` is refused);
- with *ca_file* (PEM, one or more CA certificates), a client certificate is
  required and verified against those CAs during the handshake: a missing,
  expired, self-signed or foreign certificate fails the handshake, before the
  MQTT protocol sees a byte.

``server_endpoint`` dispatches: ``ssl:`` descriptions go through
``tls_server_endpoint``, anything else to ``serverFromString``.

Reload: a listener's ``TLSServerEndpoint.context_factory`` is a
``ServerContextFactory`` whose ``reload()`` re-reads the key, certificate, chain
and client CA files and builds a new OpenSSL context, or raises
``TLSConfigError`` and keeps the old one. New connections get the new context;
open ones keep the one they were made with.

Refusals: a connection that ends before its TLS handshake completes (no client
certificate, one from another CA, expired, self-signed, a client refusing our
certificate, plain MQTT on the TLS port) is logged once::

    tls_handshake_failed peer=127.0.0.1:5555 reason='certificate verify failed: certificate has expired ...'

A TLS listener is what Twisted's ``listenSSL`` builds (a TCP port under a
``TLSMemoryBIOFactory``) with a TLS protocol subclass that notices the refusal
(``RefusalLoggingTLSFactory``): the application protocol still sees Twisted's
own TLS transport, as autobahn's WebSocket requires.

Identity: ``peer_identity(transport)`` returns the client certificate's subject
common name (the first CN); when the subject has no CN, the first DNS name of
the subjectAltName, else its first e-mail address; None when there is no client
certificate. A certificate is only present when the listener has a CA (the
server asks for one only then), and then it has been verified, so the identity
can be trusted; read it once data has arrived (the handshake is done by then).
It works on a TLS transport and on the WebSocket transport of
``mqtt_proxy.websocket`` over ``ssl:``.
"""

from __future__ import annotations

import weakref
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from twisted.internet import error, ssl
from twisted.internet.endpoints import TCP4ServerEndpoint, serverFromString
from twisted.internet.interfaces import IOpenSSLContextFactory, IStreamServerEndpoint
from twisted.logger import Logger
from twisted.protocols.tls import BufferingTLSTransport, TLSMemoryBIOFactory
from twisted.python.filepath import FilePath
from zope.interface import implementer

__all__ = [
    "RefusalLoggingTLSFactory",
    "ServerContextFactory",
    "TLSConfigError",
    "TLSServerEndpoint",
    "certificate_identity",
    "parse_description",
    "peer_certificate",
    "peer_identity",
    "server_context_factory",
    "server_endpoint",
    "tls_server_endpoint",
]

_log = Logger(namespace="twistmq.tls")  # not a class attribute: Logger, a descriptor, would take the class's name
_SSL_KEYS = {"port", "interface", "backlog", "privateKey", "certKey", "extraCertChain", "dhParameters"}


class TLSConfigError(ValueError):
    """A TLS listener description or one of its files is unusable; the message says which."""


def parse_description(description: str) -> tuple[str, list[str], dict[str, str]]:
    """Split an endpoint description into ``(type, positional args, keyword args)`` (Twisted's quoting)."""
    parts: list[list[str]] = [[]]  # each part: [text] or [key, value]
    current: list[str] = []
    escaped = False
    for ch in description:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ":":
            parts[-1].append("".join(current))
            parts.append([])
            current = []
        elif ch == "=" and len(parts[-1]) == 0:
            parts[-1].append("".join(current))
            current = []
        else:
            current.append(ch)
    parts[-1].append("".join(current))
    kind = parts[0][0] if len(parts[0]) == 1 else ""
    args: list[str] = []
    kwargs: dict[str, str] = {}
    for part in parts[1:]:
        if len(part) == 1:
            args.append(part[0])
        else:
            kwargs[part[0]] = part[1]
    return kind, args, kwargs


def _read(path: str, what: str) -> bytes:
    try:
        return FilePath(path).getContent()
    except OSError as exc:
        raise TLSConfigError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None


def _load_certificates(path: str, what: str) -> list[x509.Certificate]:
    data = _read(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TLSConfigError(f"{what} {path!r} holds no PEM certificate") from None
    return certs


def _to_twisted(cert: x509.Certificate) -> ssl.Certificate:
    from cryptography.hazmat.primitives.serialization import Encoding
    return ssl.Certificate.loadPEM(cert.public_bytes(Encoding.PEM))


# X509_V_ERR_* codes of OpenSSL's x509_vfy.h (stable across versions) that a refused client meets.
_VERIFY_ERRORS = {
    2: "unable to get issuer certificate",
    4: "unable to decrypt certificate's signature",
    6: "unable to decode issuer public key",
    7: "certificate signature failure",
    9: "certificate is not yet valid",
    10: "certificate has expired",
    13: "format error in certificate's notBefore field",
    14: "format error in certificate's notAfter field",
    18: "self-signed certificate",
    19: "self-signed certificate in certificate chain",
    20: "unable to get local issuer certificate",
    21: "unable to verify the first certificate",
    22: "certificate chain too long",
    23: "certificate revoked",
    24: "invalid CA certificate",
    25: "path length constraint exceeded",
    26: "unsupported certificate purpose",
    27: "certificate not trusted",
    28: "certificate rejected",
}


@implementer(IOpenSSLContextFactory)
class ServerContextFactory:
    """The server's TLS context (TLS 1.2+, its key/cert, client certificates required with a CA file).

    ``getContext()`` hands every new connection the current context; ``reload()``
    builds a new one from the same files. It also remembers why a client
    certificate failed verification, per connection, for the refusal log line.
    """

    def __init__(self, private_key: str, cert: str | None = None, ca_file: str | None = None,
                 extra_cert_chain: str | None = None, dh_parameters: str | None = None) -> None:
        self.private_key = private_key
        self.cert = cert or private_key
        self.ca_file = ca_file
        self.extra_cert_chain = extra_cert_chain
        self.dh_parameters = dh_parameters
        self.certificate: x509.Certificate | None = None
        """The server certificate being served (after the latest successful build)."""
        self._verify_errors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._context, self.certificate = self._build()  # fail now, at start-up, not on the first connection

    def getContext(self):  # noqa: N802 - Twisted interface
        return self._context

    def reload(self) -> dict[str, Any]:
        """Re-read every file and swap in the new context; raise ``TLSConfigError`` and keep the old one on error.

        Returns what the log line shows: the files and the new certificate's subject, serial and expiry.
        """
        self._context, self.certificate = self._build()
        return self.describe()

    def describe(self) -> dict[str, Any]:
        """The files and the served certificate's identity, serial (hex) and notAfter, for log lines."""
        cert = self.certificate
        return {"file": self.cert, "key": self.private_key, "ca": self.ca_file or "-",
                "subject": certificate_identity(cert) if cert is not None else "-",
                "serial": format(cert.serial_number, "x") if cert is not None else "-",
                "not_after": cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ") if cert is not None else "-"}

    def verify_error(self, connection: Any) -> str | None:
        """Why the client certificate on *connection* (an ``OpenSSL.SSL.Connection``) failed, or None."""
        return self._verify_errors.get(connection) if connection is not None else None

    def _remember_verify_error(self, connection, cert, errnum: int, depth: int, ok: int) -> bool:
        # OpenSSL's verdict stands; this only keeps the first reason for the log line.
        if not ok and connection not in self._verify_errors:
            what = _VERIFY_ERRORS.get(errnum, f"X509 verify error {errnum}")
            try:
                who = certificate_identity(cert.to_cryptography())
            except Exception:  # noqa: BLE001 - a certificate we cannot read still fails; the name is a nicety
                who = None
            self._verify_errors[connection] = f"{what} (depth {depth}" + (f", {who!r})" if who else ")")
        return bool(ok)

    def _build(self) -> tuple[SSL.Context, x509.Certificate]:
        key_pem = _read(self.private_key, "private key")
        cert_pem = _read(self.cert, "certificate")
        try:
            private = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
        except Exception as exc:  # noqa: BLE001 - OpenSSL raises several types; never echo key material
            raise TLSConfigError(f"cannot load certificate {self.cert!r} with key {self.private_key!r}: "
                                 f"{type(exc).__name__}") from None
        kwargs: dict[str, Any] = {
            "privateKey": private.privateKey.original,
            "certificate": private.original,
            "raiseMinimumTo": ssl.TLSVersion.TLSv1_2,
        }
        if self.extra_cert_chain:
            kwargs["extraCertChain"] = [_to_twisted(c).original
                                        for c in _load_certificates(self.extra_cert_chain, "extraCertChain")]
        if self.dh_parameters:
            kwargs["dhParameters"] = ssl.DiffieHellmanParameters.fromFile(FilePath(self.dh_parameters))
        client_cas: list[ssl.Certificate] = []
        if self.ca_file:
            client_cas = [_to_twisted(c) for c in _load_certificates(self.ca_file, "CA file")]
            kwargs["trustRoot"] = ssl.trustRootFromCertificates(client_cas)
        try:
            context = ssl.CertificateOptions(**kwargs).getContext()
        except SSL.Error as exc:  # e.g. the key does not match the certificate
            raise TLSConfigError(f"cannot use certificate {self.cert!r} with key {self.private_key!r}: "
                                 f"{_ssl_error_text(exc)}") from None
        if client_cas:
            # Announce the accepted CAs in the CertificateRequest, and keep why a client certificate failed.
            context.set_client_ca_list([ca.original.get_subject() for ca in client_cas])
            context.set_verify(context.get_verify_mode(), self._remember_verify_error)
        return context, private.original.to_cryptography()


def server_context_factory(private_key: str, cert: str | None = None, ca_file: str | None = None,
                           extra_cert_chain: str | None = None, dh_parameters: str | None = None):
    """Build the server context factory: TLS 1.2+, the key/cert pair, client certs required when *ca_file*."""
    return ServerContextFactory(private_key, cert, ca_file, extra_cert_chain, dh_parameters)


def _ssl_error_text(exc: Exception) -> str:
    """OpenSSL's reasons from an ``SSL.Error`` (its args hold (library, function, reason) tuples)."""
    entries = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    reasons = [str(entry[-1]) for entry in entries if isinstance(entry, tuple) and entry and entry[-1]]
    return "; ".join(reasons) or str(exc) or type(exc).__name__


def handshake_failure_reason(reason: Any, verify_error: str | None = None) -> str:
    """Say in one line why a TLS connection ended before its handshake completed (*reason*: a Failure)."""
    value = reason.value
    if isinstance(value, SSL.Error):
        text = _ssl_error_text(value)
    elif isinstance(value, error.ConnectionDone):
        text = "closed by the peer before the handshake completed"
    elif isinstance(value, error.ConnectionLost):
        text = "connection lost before the handshake completed"
    else:
        text = f"{type(value).__name__}: {value}"
    return f"{text}: {verify_error}" if verify_error else text


class _RefusalLoggingTLSProtocol(BufferingTLSTransport):
    """Twisted's TLS protocol (with its write buffering), logging a connection that ends before its handshake.

    Subclassing is how Twisted itself extends ``TLSMemoryBIOProtocol``; this
    reads two of its documented instance variables, ``_handshakeDone`` and
    ``_reason`` (the OpenSSL error that ended the connection). Twisted is
    pinned, and ``test_tls.py`` checks the log line names the real reason.
    """

    def connectionLost(self, reason) -> None:  # noqa: N802 - Twisted interface
        if not self._handshakeDone:
            try:
                self.factory.handshake_failed(self, self._reason or reason)
            except Exception:  # noqa: BLE001 - a log line must never keep the application from its connectionLost
                _log.failure("tls_handshake_failed could not be logged")
        super().connectionLost(reason)


class RefusalLoggingTLSFactory(TLSMemoryBIOFactory):
    """Adds TLS to a listener's connections, like ``listenSSL``, and logs each refused handshake."""

    protocol = _RefusalLoggingTLSProtocol

    def __init__(self, context_factory: ServerContextFactory, wrapped_factory) -> None:
        super().__init__(context_factory, False, wrapped_factory)
        self.context_factory = context_factory

    def handshake_failed(self, tls_protocol, reason) -> None:
        """Log one refused handshake: the peer address and the reason.

        A TLS error is a warning; a peer that merely closed before finishing
        (a load balancer's TCP health check) is only worth an info line.
        """
        peer = tls_protocol.getPeer()
        verify_error = self.context_factory.verify_error(tls_protocol.getHandle())
        emit = _log.warn if isinstance(reason.value, SSL.Error) else _log.info
        emit("tls_handshake_failed peer={peer} reason={reason!r}",
             peer=f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}",
             reason=handshake_failure_reason(reason, verify_error))


@implementer(IStreamServerEndpoint)
class TLSServerEndpoint:
    """A TLS listener (what ``SSL4ServerEndpoint`` does) with a reloadable context and refusals logged."""

    def __init__(self, reactor: Any, port: int, context_factory: ServerContextFactory, backlog: int = 50,
                 interface: str = "") -> None:
        self.context_factory = context_factory
        """Its ``reload()`` re-reads the key, certificates and client CA for new connections."""
        self._tcp = TCP4ServerEndpoint(reactor, port, backlog=backlog, interface=interface)

    def listen(self, protocolFactory):  # noqa: N803 - Twisted interface
        return self._tcp.listen(RefusalLoggingTLSFactory(self.context_factory, protocolFactory))


def tls_server_endpoint(reactor: Any, description: str, ca_file: str | None = None) -> TLSServerEndpoint:
    """Build a TLS 1.2/1.3 server endpoint from an ``ssl:`` description; require client certs if *ca_file*."""
    kind, args, kwargs = parse_description(description)
    if kind != "ssl":
        raise TLSConfigError(f"TLS listener must be an ssl: endpoint, not {description.split(':')[0]!r}")
    if "sslmethod" in kwargs:
        raise TLSConfigError("sslmethod is not supported: TLS listeners speak TLS 1.2 and 1.3 only")
    unknown = set(kwargs) - _SSL_KEYS
    if unknown:
        raise TLSConfigError(f"unknown ssl: endpoint argument(s): {', '.join(sorted(unknown))}")
    if args:
        if len(args) > 1 or "port" in kwargs:
            raise TLSConfigError(f"ssl: endpoint takes one positional argument (the port): {description!r}")
        kwargs["port"] = args[0]
    if "port" not in kwargs or "privateKey" not in kwargs:
        raise TLSConfigError("ssl: endpoint needs a port and privateKey=FILE")
    try:
        port = int(kwargs["port"])
        backlog = int(kwargs.get("backlog", 50))
    except ValueError:
        raise TLSConfigError(f"ssl: endpoint port and backlog must be integers: {description!r}") from None
    factory = server_context_factory(kwargs["privateKey"], kwargs.get("certKey"), ca_file,
                                     kwargs.get("extraCertChain"), kwargs.get("dhParameters"))
    return TLSServerEndpoint(reactor, port, factory, backlog=backlog, interface=kwargs.get("interface", ""))


def server_endpoint(reactor: Any, description: str, ca_file: str | None = None):
    """Build any listener endpoint: ``ssl:`` through ``tls_server_endpoint``, the rest via ``serverFromString``."""
    kind, _, _ = parse_description(description)
    if kind == "ssl":
        return tls_server_endpoint(reactor, description, ca_file)
    return serverFromString(reactor, description)


def peer_certificate(transport: Any) -> x509.Certificate | None:
    """Return the peer's certificate as a ``cryptography`` object, or None (plain TCP, no client cert)."""
    get_handle = getattr(transport, "getHandle", None)
    handle = get_handle() if get_handle is not None else None
    if handle is not None and hasattr(handle, "get_peer_certificate"):
        return handle.get_peer_certificate(as_cryptography=True)
    get_cert = getattr(transport, "getPeerCertificate", None)
    if get_cert is None:
        return None
    cert = get_cert()
    if cert is None:
        return None
    return cert if isinstance(cert, x509.Certificate) else cert.to_cryptography()


def certificate_identity(cert: x509.Certificate) -> str | None:
    """Return the subject CN, else the first SAN DNS name, else the first SAN e-mail; None if none."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if names and names[0].value:
        value = names[0].value
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for kind in (x509.DNSName, x509.RFC822Name):
        values = san.get_values_for_type(kind)
        if values:
            return values[0]
    return None


def peer_identity(transport: Any) -> str | None:
    """Return the verified client certificate's identity (see ``certificate_identity``), or None."""
    cert = peer_certificate(transport)
    return None if cert is None else certificate_identity(cert)
