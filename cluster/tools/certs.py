"""Development certificates: a CA, a server certificate and client certificates, made with ``cryptography``.

For trying TLS in a minute and for tests, not for production PKI. Keys are
ECDSA P-256, written unencrypted (PKCS#8 PEM, mode 0600). Layout written by
``create_dev_pki(out_dir, ...)``::

    ca.pem  ca.key                       the development CA (reused if present)
    server.pem  server.key               SAN: localhost, 127.0.0.1, ::1 and --host values
    client-NAME.pem  client-NAME.key     CN=NAME, clientAuth

The Python API also makes the certificates tests need to see rejected:
``make_client_cert(..., not_after=<past>)`` (expired), ``make_self_signed``
and a second ``make_ca`` (another CA).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cluster.admin.errors import AdminError

__all__ = [
    "Issued",
    "create_dev_pki",
    "load_issued",
    "make_ca",
    "make_client_cert",
    "make_self_signed",
    "make_server_cert",
    "write_issued",
]

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "twistmq dev"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(not_before: datetime.datetime | None, not_after: datetime.datetime | None,
              days: int) -> tuple[datetime.datetime, datetime.datetime]:
    start = not_before or (_now() - _DAY)  # a day of slack for clock skew
    end = not_after or (start + datetime.timedelta(days=days))
    if not_after is not None and not_before is None and end <= start:
        start = end - datetime.timedelta(days=days)
    return start, end


def _builder(subject: x509.Name, issuer: x509.Name, public_key, start, end) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def make_ca(common_name: str = "twistmq dev CA", days: int = 3650, *,
            not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None) -> Issued:
    """Make a self-signed CA certificate allowed to sign certificates (not intermediates)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(not_before, not_after, days)
    cert = (_builder(_name(common_name), _name(common_name), key.public_key(), start, end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Issued(key, cert)


def _leaf(ca: Issued, common_name: str, usage, san: list[x509.GeneralName] | None, days: int,
          not_before, not_after) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(not_before, not_after, days)
    builder = (_builder(_name(common_name), ca.cert.subject, key.public_key(), start, end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                              critical=False))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_server_cert(ca: Issued, hosts: tuple[str, ...] | list[str] = DEFAULT_HOSTS, days: int = 825, *,
                     not_before=None, not_after=None) -> Issued:
    """Make a server certificate signed by *ca*, valid for *hosts* (names or IP addresses)."""
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        raise ValueError("a server certificate needs at least one host")
    return _leaf(ca, hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, [_general_name(h) for h in hosts], days,
                 not_before, not_after)


def make_client_cert(ca: Issued, name: str, days: int = 825, *, emails: list[str] | None = None,
                     not_before=None, not_after=None) -> Issued:
    """Make a client certificate with CN=*name* signed by *ca* (pass a past *not_after* for an expired one)."""
    san = [x509.RFC822Name(e) for e in emails] if emails else None
    return _leaf(ca, name, ExtendedKeyUsageOID.CLIENT_AUTH, san, days, not_before, not_after)


def make_self_signed(name: str, days: int = 825) -> Issued:
    """Make a self-signed client certificate with CN=*name*, which no CA vouches for."""
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(None, None, days)
    cert = (_builder(_name(name), _name(name), key.public_key(), start, end)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(key, cert)


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)


def write_issued(issued: Issued, cert_path: str, key_path: str) -> None:
    """Write the certificate (mode 0644) and the key (mode 0600)."""
    _write(key_path, issued.key_pem(), 0o600)
    _write(cert_path, issued.cert_pem(), 0o644)


def load_issued(cert_path: str, key_path: str) -> Issued:
    """Read a certificate and its key back (e.g. the CA, to sign more client certificates)."""
    with open(cert_path, "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    with open(key_path, "rb") as handle:
        key = serialization.load_pem_private_key(handle.read(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: expected an EC private key")
    return Issued(key, cert)


def _safe_name(name: str) -> str:
    if not name or any(ch in name for ch in "/\\\0") or name in (".", ".."):
        raise ValueError(f"bad client name {name!r}: it names a file")
    return name


def create_dev_pki(out_dir: str, clients: list[str] = (), hosts: list[str] = (),
                   server: bool = True) -> dict[str, str]:
    """Create (or reuse) the CA in *out_dir*, then the server and client certificates; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"ca": os.path.join(out_dir, "ca.pem"), "ca_key": os.path.join(out_dir, "ca.key")}
    if os.path.exists(paths["ca"]) and os.path.exists(paths["ca_key"]):
        ca = load_issued(paths["ca"], paths["ca_key"])
    else:
        ca = make_ca()
        write_issued(ca, paths["ca"], paths["ca_key"])
    if server:
        paths["server"] = os.path.join(out_dir, "server.pem")
        paths["server_key"] = os.path.join(out_dir, "server.key")
        all_hosts = list(DEFAULT_HOSTS) + [h for h in hosts if h not in DEFAULT_HOSTS]
        write_issued(make_server_cert(ca, all_hosts), paths["server"], paths["server_key"])
    for name in clients:
        stem = os.path.join(out_dir, f"client-{_safe_name(name)}")
        paths[f"client:{name}"] = stem + ".pem"
        paths[f"client_key:{name}"] = stem + ".key"
        write_issued(make_client_cert(ca, name), stem + ".pem", stem + ".key")
    return paths


# --- the ``twistmq-admin certs`` subcommand ---------------------------------------------------------

def _escape(path: str) -> str:
    return path.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


def register(subparsers) -> None:
    """Add ``certs`` to the ``twistmq-admin`` subcommands."""
    parser = subparsers.add_parser(
        "certs", help="create a development CA, server and client certificates",
        description="Create (or reuse) a development CA in DIR, then a server certificate for localhost, "
                    "127.0.0.1, ::1 and every --host, and one client certificate per --client.")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the PEM files")
    parser.add_argument("--client", action="append", default=[], metavar="NAME",
                        help="issue a client certificate with CN=NAME (repeatable)")
    parser.add_argument("--host", action="append", default=[], metavar="HOST",
                        help="extra DNS name or IP address for the server certificate (repeatable)")
    parser.add_argument("--no-server", action="store_true", help="do not (re)issue the server certificate")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Create the files and print how to use them."""
    try:
        paths = create_dev_pki(args.out, clients=args.client, hosts=args.host, server=not args.no_server)
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    print(f"CA certificate:     {paths['ca']}   (keep {paths['ca_key']} private)")
    if "server" in paths:
        print(f"server certificate: {paths['server']}  key: {paths['server_key']}")
    for name in args.client:
        print(f"client {name!r}: {paths[f'client:{name}']}  key: {paths[f'client_key:{name}']}")
    if "server" in paths:
        print("listen with:  --mqtt-tls ssl:8883:privateKey="
              f"{_escape(os.path.abspath(paths['server_key']))}:certKey={_escape(os.path.abspath(paths['server']))}"
              f" --mqtt-tls-ca {os.path.abspath(paths['ca'])}")
    return 0
