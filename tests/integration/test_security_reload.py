"""SIGHUP on a real node with real paho clients: password file, ACL and TLS certificates reloaded, connections kept.

Also what a new user coming from Mosquitto meets at start: a ``mosquitto_passwd``
file works as it is, and each malformed ACL line stops the node with one line
and exit code 2.

Every test starts its own node (they rewrite its files); each waits for the
node's ``reload_ok`` / ``reload_failed`` line before checking the effect.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest
from cryptography import x509

from cluster.tools.certs import make_server_cert, write_issued
from mqtt_proxy.auth.passwords import hash_password
from tests.integration.node import TWISTD, NodeProcess
from tests.integration.pki_fixtures import PKI
from tests.integration.security_support import (
    Paho,
    node_logs,
    toml_str,
    unique,
    write_config,
)

LOG_N = 10  # scrypt cost of the test users: quick, still real scrypt
ALICE_PW = "alice-Reload-pw-31c7"
BOB_PW = "bob-Reload-pw-8d2e"
ACL = "user alice\ntopic readwrite alice/#\ntopic read news/#\n\nuser bob\ntopic readwrite bob/#\n"


def write_passwords(path, **users: str) -> None:
    """Write a password file with these users (scrypt)."""
    with open(path, "w", encoding="utf-8") as handle:
        for user, password in users.items():
            handle.write(f"{user}:{hash_password(password, log_n=LOG_N)}\n")


def start_node(tmp_path, extra_args=(), acl: str = ACL) -> NodeProcess:
    """A node with a password file (alice), the ACL above, anonymous refused; its file paths on the object."""
    conf = tmp_path / "conf"
    conf.mkdir()
    node_passwd, node_acl = conf / "passwd", conf / "acl"
    write_passwords(node_passwd, alice=ALICE_PW)
    node_acl.write_text(acl, encoding="utf-8")
    config = write_config(conf, f"[mqtt]\npassword_file = {toml_str(node_passwd)}\nacl_file = {toml_str(node_acl)}\n"
                                "allow_anonymous = false\nauth_fail_delay = 0.01\nauth_fail_delay_max = 0.02\n")
    node = NodeProcess(str(tmp_path / "data"), extra_args=["--config", config, *extra_args]).start()
    node.passwd, node.acl = str(node_passwd), str(node_acl)
    return node


@pytest.fixture
def node(tmp_path):
    n = start_node(tmp_path)
    yield n
    n.stop()


def log_lines(node, pattern: str) -> list[str]:
    """The node's log lines matching the regular expression *pattern*."""
    return [ln for ln in node_logs(node).splitlines() if re.search(pattern, ln)]


def sighup(node, expect: list[str], timeout: float = 10.0) -> list[str]:
    """Send SIGHUP and wait until one more line matches each pattern of *expect*; return those new lines."""
    before = {p: len(log_lines(node, p)) for p in expect}
    node.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {p: log_lines(node, p) for p in expect}
        if all(len(found[p]) > before[p] for p in expect):
            return [found[p][-1] for p in expect]
        assert node.proc.poll() is None, f"the node exited on SIGHUP with {node.proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"no {expect} after SIGHUP: {node_logs(node)[-3000:]}")


def login(node, user: str | None, password: str | None, level: int = 5) -> Paho:
    """A paho client connected (or refused: see ``.connack``) as *user*."""
    client = Paho(node.port(), level=level, username=user, password=password)
    client.connect()
    return client


def round_trip(client: Paho, topic: str) -> None:
    """The client subscribes to *topic*, publishes to it at QoS 1 and receives its message: it is still served."""
    payload = unique("p").encode()
    assert client.subscribe(topic, 1) == [1]
    assert client.publish(topic, payload, 1) == 0
    msg = client.next_message()
    assert msg is not None and msg.payload == payload


# -- passwords -------------------------------------------------------------------------------------

def test_sighup_reloads_the_password_file_and_keeps_connections(node):
    """After SIGHUP an added user logs in, a removed one cannot, and the removed one's open connection stays."""
    alice = login(node, "alice", ALICE_PW)
    try:
        assert alice.connack == 0
        bob = login(node, "bob", BOB_PW)
        assert bob.connack == 0x86
        bob.close()
        write_passwords(node.passwd, bob=BOB_PW)
        (line,) = sighup(node, [r"reload_ok kind=passwords"])
        assert f"file={node.passwd} users=1" in line
        bob = login(node, "bob", BOB_PW)
        again = login(node, "alice", ALICE_PW)
        try:
            assert bob.connack == 0 and again.connack == 0x86
            round_trip(alice, "alice/" + unique("t"))  # the connection made before the reload still works
            assert not alice.disconnected.is_set()
        finally:
            bob.close()
            again.close()
    finally:
        alice.close()


def test_broken_password_file_on_sighup_keeps_the_old_one(node):
    """A bad line in the new password file is logged (file, line, reason) and the old users keep logging in."""
    with open(node.passwd, "a", encoding="utf-8") as handle:
        handle.write(f"bob:{hash_password(BOB_PW, log_n=LOG_N)}\ncarol:$7$notanumber$AAAA$AAAA\n")
    (line,) = sighup(node, [r"reload_failed kind=passwords"])
    assert f"file={node.passwd} line=3 reason=" in line and "ITERATIONS" in line and "kept=previous" in line
    alice, bob = login(node, "alice", ALICE_PW), login(node, "bob", BOB_PW)
    try:
        assert alice.connack == 0 and bob.connack == 0x86  # bob only exists in the refused file
    finally:
        alice.close()
        bob.close()


# -- ACL -------------------------------------------------------------------------------------------

def test_sighup_reloads_the_acl_for_connected_clients(node):
    """A publish the ACL denies is allowed after the ACL file grants it and SIGHUP, on the same connection."""
    alice = login(node, "alice", ALICE_PW)
    try:
        topic = "shared/" + unique("t")
        assert alice.publish(topic, b"before", 1) == 0x87
        with open(node.acl, "a", encoding="utf-8") as handle:
            handle.write("\nuser alice\ntopic readwrite shared/#\n")
        (line,) = sighup(node, [r"reload_ok kind=acl"])
        assert f"file={node.acl} users=2" in line
        round_trip(alice, topic)
    finally:
        alice.close()


@pytest.mark.parametrize("bad_line", ["topic rw alice/#", "topic read a/#/b", "permit alice/#", "user"])
def test_broken_acl_on_sighup_keeps_the_old_one(node, bad_line):
    """A malformed ACL line is logged with file, line and reason, and every ACL decision stays as it was."""
    with open(node.acl, "w", encoding="utf-8") as handle:
        handle.write(ACL.replace("topic read news/#", "topic readwrite news/#\n" + bad_line))
    (line,) = sighup(node, [r"reload_failed kind=acl"])
    assert f"file={node.acl} line=4 reason=" in line and "kept=previous" in line
    alice = login(node, "alice", ALICE_PW)
    try:
        assert alice.publish("news/" + unique("t"), b"x", 1) == 0x87  # the refused file would have allowed it
        round_trip(alice, "alice/" + unique("t"))
    finally:
        alice.close()


def test_node_survives_repeated_sighup_and_stops_cleanly(node):
    """Several SIGHUPs in a row leave the node serving, and SIGTERM still shuts it down cleanly."""
    alice = login(node, "alice", ALICE_PW)
    try:
        for _ in range(3):
            sighup(node, [r"reload_ok kind=passwords", r"reload_ok kind=acl"])
        round_trip(alice, "alice/" + unique("t"))
    finally:
        alice.close()
    assert node.stop() in (0, -15)  # twistd re-raises SIGTERM after a clean shutdown
    assert log_lines(node, "node_stopped")


# -- TLS -------------------------------------------------------------------------------------------

def served_certificate(port: int, ca_file: str) -> x509.Certificate:
    """Open a TLS connection (stdlib ssl) and return the certificate the server sent."""
    context = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with context.wrap_socket(sock, server_hostname="localhost") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_sighup_reloads_tls_certificates_for_new_connections(tmp_path):
    """After SIGHUP new TLS connections get the renewed certificate, open ones stay; a bad pair is refused."""
    pki = PKI(str(tmp_path / "pki"))
    node = start_node(tmp_path, ["--mqtt-tls", pki.ssl_description()])
    try:
        port = node.port("mqtt-tls")
        assert served_certificate(port, pki.ca_file).serial_number == pki.server.cert.serial_number
        alice = Paho(port, username="alice", password=ALICE_PW, tls={"ca_certs": pki.ca_file})
        try:
            assert alice.connect() == 0
            renewed = make_server_cert(pki.ca, ["localhost", "127.0.0.1"])
            write_issued(renewed, pki.server_cert, pki.server_key)
            (line,) = sighup(node, [r"reload_ok kind=tls"])
            assert f"listener=mqtt-tls file={pki.server_cert}" in line
            assert f"serial={renewed.cert.serial_number:x}" in line
            assert served_certificate(port, pki.ca_file).serial_number == renewed.cert.serial_number
            round_trip(alice, "alice/" + unique("t"))  # made with the old certificate, still served

            with open(pki.server_key, "wb") as handle:  # a key that does not match the certificate
                handle.write(make_server_cert(pki.ca, ["localhost"]).key_pem())
            (line,) = sighup(node, [r"reload_failed kind=tls"])
            assert "kept=previous" in line
            assert served_certificate(port, pki.ca_file).serial_number == renewed.cert.serial_number
        finally:
            alice.close()
    finally:
        node.stop()


# -- Mosquitto password files ----------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None,
                    reason="mosquitto_passwd is not installed (./dev test installs Debian's mosquitto)")
@pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
def test_mosquitto_passwd_file_users_log_in(tmp_path, level):
    """Users of a real mosquitto_passwd file ($7$ default, -H sha512) log in with paho; wrong passwords fail."""
    passwd = tmp_path / "mosquitto.passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwd), "dev-1", "dev-1-Pass"], check=True, timeout=30)
    subprocess.run(["mosquitto_passwd", "-b", "-H", "sha512", str(passwd), "legacy", "legacy-Pass"], check=True,
                   timeout=30)
    text = passwd.read_text()
    assert "dev-1:$7$" in text and "legacy:$6$" in text
    config = write_config(tmp_path, f"[mqtt]\npassword_file = {toml_str(passwd)}\nallow_anonymous = false\n"
                                    "auth_fail_delay = 0.01\nauth_fail_delay_max = 0.02\n")
    node = NodeProcess(str(tmp_path / "data"), extra_args=["--config", config]).start()
    try:
        for user, password, want in (("dev-1", "dev-1-Pass", 0), ("legacy", "legacy-Pass", 0),
                                     ("dev-1", "wrong", 0x86), ("legacy", "dev-1-Pass", 0x86)):
            client = login(node, user, password, level)
            try:
                assert client.connack == want, (user, password)
                if want == 0:
                    round_trip(client, f"{user}/" + unique("t"))
            finally:
                client.close()
    finally:
        node.stop()


# -- malformed ACL at start ------------------------------------------------------------------------

@pytest.mark.parametrize("bad_line,why", [
    ("topic rw dev/#", "unknown access 'rw'"),
    ("topic\tREAD dev/#", "unknown access 'READ'"),
    ("topic read dev/#/x", "'#' must be the last level"),
    ("topic write", "needs a topic filter"),
    ("user", "'user' needs a name"),
    ("allow dev/#", "unknown keyword 'allow'"),
])
def test_malformed_acl_line_refused_at_start(tmp_path, bad_line, why):
    """A malformed ACL line stops the node: exit code 2, one stderr line (file, line, reason), no traceback."""
    acl = tmp_path / "acl"
    acl.write_text(f"# devices\nuser dev\n{bad_line}\n", encoding="utf-8")
    config = write_config(tmp_path, f"[mqtt]\nacl_file = {toml_str(acl)}\n")
    done = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "node", "--config", config,
                           "--data-dir", str(tmp_path / "data"), "--mqtt", "tcp:0:interface=127.0.0.1"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("twistmq:")]
    assert len(errors) == 1 and errors[0].startswith(f"twistmq: {acl}:3: "), done.stderr
    assert why in errors[0]
    if "access" in why:
        assert "read, write, readwrite or deny" in errors[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert "twistmq ready" not in done.stdout
