"""Test PKI: a CA with server and client certificates, plus the bad certificates TLS must reject."""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile

from twisted.internet import ssl

from cluster.tools.certs import (
    Issued,
    make_ca,
    make_client_cert,
    make_self_signed,
    make_server_cert,
    write_issued,
)


def temp_dir(test) -> str:
    """Make a temporary directory outside the checkout, removed when *test* ends."""
    path = tempfile.mkdtemp(prefix="twistmq-pki-")
    test.addCleanup(shutil.rmtree, path, True)
    return path


def escape(path: str) -> str:
    """Quote a path for a Twisted endpoint description."""
    return path.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")


class PKI:
    """Writes a CA, a server certificate and named client certificates into *directory*."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        self.ca = make_ca()
        self.server = make_server_cert(self.ca, ["localhost", "127.0.0.1"])
        self.ca_file = self._write("ca", self.ca)[0]
        self.server_cert, self.server_key = self._write("server", self.server)
        past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=2)
        self.clients: dict[str, Issued] = {
            "good": make_client_cert(self.ca, "good-client"),
            "expired": make_client_cert(self.ca, "expired-client", not_after=past),
            "selfsigned": make_self_signed("self-client"),
            "otherca": make_client_cert(make_ca("other CA"), "other-client"),
        }

    def _write(self, name: str, issued: Issued) -> tuple[str, str]:
        cert, key = os.path.join(self.dir, name + ".pem"), os.path.join(self.dir, name + ".key")
        write_issued(issued, cert, key)
        return cert, key

    def ssl_description(self, port: int = 0) -> str:
        """Return an ``ssl:`` server description bound to 127.0.0.1 with this server certificate."""
        return (f"ssl:{port}:interface=127.0.0.1:privateKey={escape(self.server_key)}"
                f":certKey={escape(self.server_cert)}")

    def client_options(self, client: str | None = None):
        """Return client TLS options trusting the CA, presenting the named client certificate (if any)."""
        ca = ssl.Certificate.loadPEM(self.ca.cert_pem())
        kwargs = {}
        if client is not None:
            issued = self.clients[client]
            kwargs["clientCertificate"] = ssl.PrivateCertificate.loadPEM(issued.cert_pem() + issued.key_pem())
        return ssl.optionsForClientTLS("localhost", trustRoot=ca, **kwargs)
