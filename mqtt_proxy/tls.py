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

from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from twisted.internet import ssl
from twisted.internet.endpoints import SSL4ServerEndpoint, serverFromString
from twisted.internet.interfaces import IOpenSSLContextFactory
from twisted.python.filepath import FilePath
from zope.interface import implementer

__all__ = [
    "TLSConfigError",
    "certificate_identity",
    "parse_description",
    "peer_certificate",
    "peer_identity",
    "server_context_factory",
    "server_endpoint",
    "tls_server_endpoint",
]

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


@implementer(IOpenSSLContextFactory)
class _ServerContextFactory:
    """Wraps ``CertificateOptions`` to also announce the accepted client CAs in the CertificateRequest."""

    def __init__(self, options: ssl.CertificateOptions, client_cas: list[ssl.Certificate]) -> None:
        self._options = options
        self._client_cas = client_cas
        self._context = None

    def getContext(self):  # noqa: N802 - Twisted interface
        if self._context is None:
            context = self._options.getContext()
            if self._client_cas:
                context.set_client_ca_list([ca.original.get_subject() for ca in self._client_cas])
            self._context = context
        return self._context


def server_context_factory(private_key: str, cert: str | None = None, ca_file: str | None = None,
                           extra_cert_chain: str | None = None, dh_parameters: str | None = None):
    """Build the server context factory: TLS 1.2+, the key/cert pair, client certs required when *ca_file*."""
    key_pem = _read(private_key, "private key")
    cert_pem = _read(cert or private_key, "certificate")
    try:
        private = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
    except Exception as exc:  # noqa: BLE001 - OpenSSL raises several types; never echo key material
        raise TLSConfigError(f"cannot load certificate {cert or private_key!r} with key {private_key!r}: "
                             f"{type(exc).__name__}") from None
    kwargs: dict[str, Any] = {
        "privateKey": private.privateKey.original,
        "certificate": private.original,
        "raiseMinimumTo": ssl.TLSVersion.TLSv1_2,
    }
    if extra_cert_chain:
        kwargs["extraCertChain"] = [_to_twisted(c).original
                                    for c in _load_certificates(extra_cert_chain, "extraCertChain")]
    if dh_parameters:
        kwargs["dhParameters"] = ssl.DiffieHellmanParameters.fromFile(FilePath(dh_parameters))
    client_cas: list[ssl.Certificate] = []
    if ca_file:
        client_cas = [_to_twisted(c) for c in _load_certificates(ca_file, "CA file")]
        kwargs["trustRoot"] = ssl.trustRootFromCertificates(client_cas)
    options = ssl.CertificateOptions(**kwargs)
    factory = _ServerContextFactory(options, client_cas)
    factory.getContext()  # fail now, at start-up, rather than on the first connection
    return factory


def tls_server_endpoint(reactor: Any, description: str, ca_file: str | None = None) -> SSL4ServerEndpoint:
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
    return SSL4ServerEndpoint(reactor, port, factory, backlog=backlog, interface=kwargs.get("interface", ""))


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
