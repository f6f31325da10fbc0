"""Secure transports on a real node with real paho clients: TLS, mutual TLS with x509 identity, ws:// and wss://.

Two nodes for the module:

- ``tls_node``: ``--mqtt-tls`` without a CA (server authentication only),
  ``--mqtt-ws tcp:`` and ``--mqtt-ws ssl:``, a password file made with the real
  ``twistmq-admin passwd`` and ``allow_anonymous = true``;
- ``mtls_node``: ``--mqtt-tls`` with ``--mqtt-tls-ca`` (a client certificate is
  required) and ``--use-identity-as-username``, with an ACL using ``%u``.

The last test greps both nodes' logs for passwords and private-key material.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import ssl
import time

import pytest

from cluster.tools.certs import make_ca, make_client_cert, write_issued
from tests.integration.node import NodeProcess
from tests.integration.pki_fixtures import PKI
from tests.integration.security_support import (
    Paho,
    add_user,
    node_logs,
    paho_round_trip,
    raw,
    toml_str,
    unique,
    write_config,
)
from tests.integration.waiting import wait_until

PASSWORD = "tls-Pa55word-7f3a9c"  # the known password whose absence from the logs we check
WRONG_PASSWORD = "tls-Wr0ng-guess-41be"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the server certificate, and client certificates (good, expired, self-signed, other CA) on disk."""
    p = PKI(str(tmp_path_factory.mktemp("pki")))
    p.clients["sensor"] = make_client_cert(p.ca, "sensor-7")
    p.files = {}
    for name, issued in p.clients.items():
        cert, key = os.path.join(p.dir, f"client-{name}.pem"), os.path.join(p.dir, f"client-{name}.key")
        write_issued(issued, cert, key)
        p.files[name] = {"certfile": cert, "keyfile": key}
    p.ca_key_file = os.path.join(p.dir, "ca.key")
    other = make_ca("an unrelated CA")
    p.other_ca_file = os.path.join(p.dir, "other-ca.pem")
    write_issued(other, p.other_ca_file, os.path.join(p.dir, "other-ca.key"))
    return p


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory, pki):
    """TLS (server auth only), ws:// and wss://; password file with alice; anonymous allowed."""
    conf = tmp_path_factory.mktemp("tls-conf")
    passwords = str(conf / "passwd")
    add_user(passwords, "alice", PASSWORD)
    config = write_config(conf, f"[mqtt]\npassword_file = {toml_str(passwords)}\nallow_anonymous = true\n"
                                "auth_fail_delay = 0.05\nauth_fail_delay_max = 0.1\n")
    node = NodeProcess(str(tmp_path_factory.mktemp("tls") / "data"), listeners=("mqtt", "http"),
                       extra_args=["--config", config, "--mqtt-tls", pki.ssl_description(),
                                   "--mqtt-ws", "tcp:0:interface=127.0.0.1", "--mqtt-ws", pki.ssl_description(),
                                   "--ws-path", "/mqtt"]).start()
    node.ws_port, node.wss_port = node.ports["mqtt-ws"]
    yield node
    node.stop()


@pytest.fixture(scope="module")
def mtls_node(tmp_path_factory, pki):
    """Mutual TLS: a client certificate from the CA is required and its CN is the username; ACL with %u."""
    conf = tmp_path_factory.mktemp("mtls-conf")
    acl = conf / "acl"
    acl.write_text("pattern readwrite devices/%u/#\n\nuser good-client\ntopic read fleet/#\n")
    config = write_config(conf, f"[mqtt]\nacl_file = {toml_str(acl)}\nallow_anonymous = false\n"
                                "auth_fail_delay = 0.05\nauth_fail_delay_max = 0.1\n")
    node = NodeProcess(str(tmp_path_factory.mktemp("mtls") / "data"), listeners=("mqtt", "http"),
                       extra_args=["--config", config, "--mqtt-tls", pki.ssl_description(),
                                   "--mqtt-tls-ca", pki.ca_file, "--use-identity-as-username"]).start()
    yield node
    node.stop()


def tls_opts(pki, client: str | None = None) -> dict:
    """``tls_set`` arguments trusting the test CA, presenting the named client certificate if any."""
    opts = {"ca_certs": pki.ca_file}
    if client is not None:
        opts.update(pki.files[client])
    return opts


# -- TLS -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_paho_over_tls_round_trip(tls_node, pki, level):
    """paho with tls_set(ca_certs=CA) connects over TLS and completes a QoS 1 publish/subscribe round trip."""
    port = tls_node.port("mqtt-tls")
    assert paho_round_trip(port, level, tls=tls_opts(pki)).startswith(b"round trip")


def test_tls_client_refuses_server_certificate_from_another_ca(tls_node, pki):
    """A client that trusts another CA refuses the server certificate: no CONNACK, nothing connected."""
    client = Paho(tls_node.port("mqtt-tls"), tls={"ca_certs": pki.other_ca_file})
    try:
        assert client.connect(timeout=3) is None
        assert any("CERTIFICATE_VERIFY_FAILED" in e for e in client.errors), client.errors
    finally:
        client.close()


def test_tls_and_plain_tcp_share_one_broker(tls_node, pki):
    """A message published over TLS reaches a subscriber on the plain TCP listener."""
    topic = "cross/" + unique("t")
    sub = Paho(tls_node.port("mqtt"))
    pub = Paho(tls_node.port("mqtt-tls"), tls=tls_opts(pki))
    try:
        assert sub.connect() == 0 and pub.connect() == 0
        assert sub.subscribe(topic, 1) == [1]
        assert pub.publish(topic, b"via tls", 1) == 0
        msg = sub.next_message()
        assert msg is not None and msg.payload == b"via tls"
    finally:
        sub.close()
        pub.close()


# -- WebSocket -------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_paho_over_websocket_round_trip(tls_node, level):
    """paho with transport='websockets' and path /mqtt completes a QoS 1 round trip over ws://."""
    payload = paho_round_trip(tls_node.ws_port, level, transport="websockets", ws_path="/mqtt")
    assert payload.startswith(b"round trip")


@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_paho_over_secure_websocket_round_trip(tls_node, pki, level):
    """paho with transport='websockets' and tls_set(ca_certs=CA) completes a QoS 1 round trip over wss://."""
    payload = paho_round_trip(tls_node.wss_port, level, transport="websockets", ws_path="/mqtt",
                              tls=tls_opts(pki))
    assert payload.startswith(b"round trip")


def test_websocket_and_tcp_clients_exchange_messages(tls_node, pki):
    """A wss:// subscriber receives what a ws:// and a plain TCP publisher send (one broker behind all listeners)."""
    topic = "wsx/" + unique("t")
    sub = Paho(tls_node.wss_port, transport="websockets", tls=tls_opts(pki))
    ws_pub = Paho(tls_node.ws_port, transport="websockets", level=4)
    tcp_pub = Paho(tls_node.port("mqtt"))
    try:
        assert sub.connect() == 0 and ws_pub.connect() == 0 and tcp_pub.connect() == 0
        assert sub.subscribe(topic, 1) == [1]
        assert ws_pub.publish(topic, b"from ws", 1) == 0
        assert tcp_pub.publish(topic, b"from tcp", 1) == 0
        got = {sub.next_message().payload, sub.next_message().payload}
        assert got == {b"from ws", b"from tcp"}
    finally:
        for c in (sub, ws_pub, tcp_pub):
            c.close()


def test_websocket_wrong_path_refused(tls_node):
    """A WebSocket client asking for another path than --ws-path gets no MQTT session."""
    client = Paho(tls_node.ws_port, transport="websockets", ws_path="/not-mqtt")
    try:
        assert client.connect(timeout=3) is None
    finally:
        client.close()


# -- passwords with anonymous allowed ---------------------------------------------------------------

def test_anonymous_accepted_when_allowed(tls_node, pki):
    """With allow_anonymous = true (and a password file), a client without a username connects over TLS."""
    client = Paho(tls_node.port("mqtt-tls"), tls=tls_opts(pki))
    try:
        assert client.connect() == 0
    finally:
        client.close()


@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_password_over_tls_good_and_bad(tls_node, pki, level):
    """Over TLS the right password connects and a wrong one is refused (0x86), even with anonymous allowed."""
    good = Paho(tls_node.port("mqtt-tls"), level=level, tls=tls_opts(pki), username="alice", password=PASSWORD)
    bad = Paho(tls_node.port("mqtt-tls"), level=level, tls=tls_opts(pki), username="alice",
               password=WRONG_PASSWORD)
    try:
        assert good.connect() == 0
        assert bad.connect() == 0x86  # paho maps the v3.1.1 return code 4 to 0x86
    finally:
        good.close()
        bad.close()


# -- mutual TLS ------------------------------------------------------------------------------------

def test_mutual_tls_good_certificate_connects(mtls_node, pki):
    """A client certificate signed by the CA connects and round-trips on its own devices/<CN>/ topic."""
    port = mtls_node.port("mqtt-tls")
    payload = paho_round_trip(port, 5, topic="devices/good-client/rt", tls=tls_opts(pki, "good"))
    assert payload.startswith(b"round trip")


@pytest.mark.parametrize("client", [None, "expired", "selfsigned", "otherca"],
                         ids=["missing", "expired", "self-signed", "other-ca"])
def test_mutual_tls_bad_certificate_rejected(mtls_node, pki, client):
    """A missing, expired, self-signed or other-CA client certificate fails the handshake: a TLS alert, no CONNACK."""
    c = Paho(mtls_node.port("mqtt-tls"), tls=tls_opts(pki, client))
    try:
        assert c.connect(timeout=3) is None
        assert c.connack is None
        assert any("alert" in e.lower() for e in c.errors), c.errors  # the server refused us during TLS
    finally:
        c.close()


def refused_tls_client(port: int, pki, client: str | None) -> int:
    """Try a TLS handshake (stdlib ssl) presenting the named client certificate; return the local port used.

    With TLS 1.3 the client may finish its half before the server checks the
    certificate, so the refusal can surface on the first read: read once.
    """
    context = ssl.create_default_context(cafile=pki.ca_file)
    if client is not None:
        context.load_cert_chain(pki.files[client]["certfile"], pki.files[client]["keyfile"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        local_port = sock.getsockname()[1]
        try:
            with context.wrap_socket(sock, server_hostname="localhost") as tls:
                assert tls.recv(1) == b""  # the server closes: it never speaks MQTT to us
        except (ssl.SSLError, ConnectionError):
            pass  # the handshake or the first read failed: what we expect
    return local_port


@pytest.mark.parametrize("client,reason", [
    (None, "peer did not return a certificate"),
    ("expired", "certificate has expired"),
    ("selfsigned", "self-signed certificate"),
    ("otherca", "unable to get local issuer certificate"),
], ids=["missing", "expired", "self-signed", "other-ca"])
def test_refused_tls_handshake_is_logged(mtls_node, pki, client, reason):
    """A client certificate refused in the handshake leaves one tls_handshake_failed line with its address and why."""
    local_port = refused_tls_client(mtls_node.port("mqtt-tls"), pki, client)
    prefix = f"tls_handshake_failed peer=127.0.0.1:{local_port} "
    deadline = time.monotonic() + 5
    found: list[str] = []
    while not found and time.monotonic() < deadline:
        found = [ln for ln in node_logs(mtls_node).splitlines() if prefix in ln]
        time.sleep(0.05)
    assert len(found) == 1, node_logs(mtls_node)[-2000:]
    assert reason in found[0]


@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_certificate_cn_is_the_username_for_the_acl(mtls_node, pki, level):
    """With --use-identity-as-username the CN is the ACL username (%u), whatever username the client claims."""
    port = mtls_node.port("mqtt-tls")
    # good-client claims to be sensor-7: the certificate wins.
    good = Paho(port, level=level, tls=tls_opts(pki, "good"), username="sensor-7", password="ignored")
    sensor = Paho(port, level=level, tls=tls_opts(pki, "sensor"))
    try:
        assert good.connect() == 0 and sensor.connect() == 0
        assert good.subscribe("devices/good-client/#", 1) == [1]
        assert good.subscribe("fleet/#", 1) == [1]  # a per-user rule for good-client
        assert sensor.subscribe("devices/sensor-7/#", 1) == [1]
        denied = 0x87 if level == 5 else 0x80
        assert good.subscribe("devices/sensor-7/#", 1) == [denied]
        assert sensor.subscribe("devices/good-client/#", 1) == [denied]
        assert sensor.subscribe("fleet/#", 1) == [denied]
        if level == 5:
            assert good.publish("devices/sensor-7/cmd", b"x", 1) == 0x87
            assert sensor.publish("devices/sensor-7/state", b"mine", 1) == 0
            msg = sensor.next_message()
            assert msg is not None and msg.topic == "devices/sensor-7/state"
        else:
            assert good.publish("devices/sensor-7/cmd", b"dropped", 1) == 0  # 3.1.1: acked, dropped
            assert sensor.publish("devices/sensor-7/state", b"mine", 1) == 0
            msg = sensor.next_message()
            assert msg is not None and msg.payload == b"mine"
            assert sensor.next_message(timeout=0.3) is None  # the denied one never arrived
            assert not good.disconnected.is_set()  # and the denied publisher is still connected
    finally:
        good.close()
        sensor.close()


@pytest.mark.parametrize("username", [None, "good-client"], ids=["anonymous", "claims-cert-user"])
def test_plain_listener_without_certificate_is_refused(mtls_node, username):
    """Without a certificate (plain TCP listener) a client is refused (0x87), even claiming a certificate's CN."""
    c = raw(mtls_node.port("mqtt"), 5, expect_ok=False, username=username)
    try:
        assert c.connack.reason_code == 0x87
        c.expect_closed()
    finally:
        c.close()


# -- secrets never logged --------------------------------------------------------------------------

def _key_fragments(key_path: str) -> list[str]:
    """Strings that would betray the private key: its PEM lines, DER base64 and the private scalar in hex."""
    from cryptography.hazmat.primitives import serialization
    pem = open(key_path, "rb").read()
    key = serialization.load_pem_private_key(pem, password=None)
    lines = [ln for ln in pem.decode().splitlines() if ln and not ln.startswith("-----")]
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    return lines + [base64.b64encode(der).decode()[:40], scalar.hex(), scalar.hex().upper(),
                    base64.b64encode(scalar).decode().rstrip("=")]


def test_no_password_or_private_key_in_logs(tls_node, mtls_node, pki):
    """Good and bad logins (v5 and 3.1.1, TLS and TCP) leave no password and no key material in any node log."""
    ids = []
    for level in (5, 4):
        for port, tls in ((tls_node.port("mqtt-tls"), tls_opts(pki)), (tls_node.port("mqtt"), None)):
            for password, want in ((PASSWORD, 0), (WRONG_PASSWORD, 0x86)):
                ids.append(unique("logs"))
                c = Paho(port, ids[-1], level=level, tls=tls, username="alice", password=password)
                try:
                    assert c.connect() == want
                finally:
                    c.close()
    wait_until(lambda: all(f"client_id={cid!r}" in node_logs(tls_node) for cid in ids),
               what="the node's log line of every attempt")
    for node in (tls_node, mtls_node):
        logs = node_logs(node)
        assert "twistmq ready" in logs
        for secret in (PASSWORD, WRONG_PASSWORD, base64.b64encode(PASSWORD.encode()).decode().rstrip("="),
                       PASSWORD.encode().hex()):
            assert secret not in logs, f"a password leaked into the logs of {node.data_dir}"
        assert "PRIVATE KEY" not in logs
        for fragment in _key_fragments(pki.server_key) + _key_fragments(pki.ca_key_file) \
                + _key_fragments(pki.files["good"]["keyfile"]):
            assert fragment not in logs, "private key material leaked into the logs"
    # The attempts themselves are logged (so the grep above looked at the right place).
    assert re.search(r"mqtt\.auth\.fail .*username='alice'", node_logs(tls_node))
