"""A new user's first day, on real node processes: safe defaults, one-line errors, config paths, the log, version.

Every node here binds 127.0.0.1 only: "refused on another interface" is shown
by the refusal at start (exit code 2, the data directory never created), never
by binding another interface.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from importlib import metadata

import pytest

from tests.integration.node import TWISTD, NodeProcess
from tests.integration.security_support import ADMIN, Paho, add_user, unique, write_config

VERSION = metadata.version("twistmq")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+ ")
PASSWORD = "first-Day-passw0rd-7f3a"


def run_node(*args, timeout=60, cwd="/"):
    """Run ``twistd -n twistmq node ARGS`` to its end (these are meant to stop at start)."""
    return subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "node", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def only_error_line(result) -> str:
    """The one non-log line on stderr; fails if there are several, or a traceback anywhere."""
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("twistmq: ")
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# -- secure defaults --------------------------------------------------------------------------------

def test_default_listeners_are_loopback_only(tmp_path):
    """With no listener configured the ready line names only 127.0.0.1 addresses (MQTT and HTTP)."""
    if not (port_free(1883) and port_free(8080)):
        pytest.skip("127.0.0.1:1883 or :8080 is taken by another process: the default listeners cannot bind")
    node = NodeProcess(str(tmp_path / "data"), listeners=()).start()
    try:
        ready = next(line for line in node.output if "twistmq ready" in line)
        addresses = dict(part.split("=", 1) for part in ready.split("twistmq ready ", 1)[1].split())
        assert addresses == {"mqtt": "127.0.0.1:1883", "http": "127.0.0.1:8080"}
    finally:
        node.stop()


@pytest.mark.parametrize("flag,kind", [("--mqtt", "anonymous"), ("--mqtt-ws", "anonymous"),
                                       ("--native", "native"), ("--http", "/metrics")])
def test_listener_on_every_interface_without_auth_is_refused(tmp_path, flag, kind):
    """A listener facing other hosts with no authentication and no allow_anonymous: one line, exit 2, nothing opened."""
    value = f"tcp:{free_port()}"
    result = run_node(flag, value, "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    line = only_error_line(result)
    assert line.startswith(f"twistmq: {flag} {value} would ") and kind in line
    assert "bind it to this host" in line and "interface=127.0.0.1" in line
    assert not os.path.exists(tmp_path / "data")  # refused before the store (or any listener) opened


def test_password_file_does_not_open_native_listeners(tmp_path):
    """The native protocol has no authentication, so a password file does not let it face other hosts."""
    add_user(str(tmp_path / "passwd"), "alice", PASSWORD)
    config = write_config(tmp_path, '[mqtt]\npassword_file = "passwd"\n')
    result = run_node("--config", config, "--native", f"tcp:{free_port()}", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "allow_anonymous = true" in only_error_line(result)


# -- clear errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value,example", [
    ("--mqtt", "1883", "--mqtt tcp:1883:interface=127.0.0.1"),
    ("--mqtt", "localhost:1883", "--mqtt tcp:1883:interface=127.0.0.1"),
    ("--native", "foo", "--native tcp:9876:interface=127.0.0.1"),
    ("--http", "tcp:notaport", "--http tcp:8080:interface=127.0.0.1"),
])
def test_bad_listener_flag_is_one_line(tmp_path, flag, value, example):
    """Mosquitto habits and typos in a listener flag: one line naming flag, value and an example; exit 2."""
    result = run_node(flag, value, "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    line = only_error_line(result)
    assert line.startswith(f"twistmq: {flag} {value}: ") and line.endswith(f"for example {example}")
    assert result.stdout == ""


def test_port_in_use_is_one_line(tmp_path):
    """A port another process holds: one line naming the flag, the value and the reason; exit 2, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        value = f"tcp:{taken.getsockname()[1]}:interface=127.0.0.1"
        result = run_node("--mqtt", value, "--http", "tcp:0:interface=127.0.0.1", "--data-dir",
                          str(tmp_path / "data"))
    assert result.returncode == 2
    assert only_error_line(result) == f"twistmq: cannot listen on --mqtt {value}: Address already in use"
    assert "twistmq ready" not in result.stdout


def test_bad_listener_in_config_file_names_key_and_file(tmp_path):
    """A malformed listener in the config file names node.KEY and the file, with a TOML example."""
    config = write_config(tmp_path, '[node]\nmqtt = ["1883"]\n')
    result = run_node("--config", config, "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    line = only_error_line(result)
    assert line.startswith(f'twistmq: node.mqtt = "1883" in {config}: ')
    assert line.endswith('for example mqtt = ["tcp:1883:interface=127.0.0.1"]')


# -- relative paths ---------------------------------------------------------------------------------

def test_relative_auth_files_resolve_against_the_config_directory(tmp_path):
    """password_file and acl_file written relative in a config elsewhere work with the node started in /."""
    site = tmp_path / "site"
    site.mkdir()
    add_user(str(site / "passwd"), "alice", PASSWORD)
    (site / "acl").write_text("user alice\ntopic readwrite fleet/#\n")
    config = write_config(site, '[mqtt]\npassword_file = "passwd"\nacl_file = "acl"\n'
                                "auth_fail_delay = 0.05\nauth_fail_delay_max = 0.1\n")
    node = NodeProcess(str(tmp_path / "data"), extra_args=["--config", config]).start()  # cwd is /
    try:
        alice = Paho(node.port(), username="alice", password=PASSWORD)
        try:
            assert alice.connect() == 0
            assert alice.subscribe("fleet/1", 1) == [1]
            assert alice.subscribe("other/1", 1) == [0x87]  # the ACL was read: only fleet/# is granted
            assert alice.publish("fleet/1", b"hello", 1) == 0
            assert alice.next_message().payload == b"hello"
        finally:
            alice.close()
        anonymous = Paho(node.port())
        try:
            assert anonymous.connect() == 0x87  # a password file without allow_anonymous refuses anonymous
        finally:
            anonymous.close()
    finally:
        node.stop()


def test_missing_relative_file_names_key_and_resolved_path(tmp_path):
    """A relative acl_file that is not there: one line with the key and the absolute path looked at."""
    site = tmp_path / "site"
    site.mkdir()
    config = write_config(site, '[mqtt]\nacl_file = "acl"\n')
    result = run_node("--config", config, "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert only_error_line(result) == f"twistmq: mqtt.acl_file: {site / 'acl'} does not exist"


# -- the log ----------------------------------------------------------------------------------------

def log_node(tmp_path, log_section: str) -> tuple[NodeProcess, str]:
    """A node with a password file (alice) and ``[log]`` as given, log file node.log beside the config."""
    site = tmp_path / "site"
    site.mkdir()
    add_user(str(site / "passwd"), "alice", PASSWORD)
    config = write_config(site, '[mqtt]\npassword_file = "passwd"\nauth_fail_delay = 0.05\n'
                                f'auth_fail_delay_max = 0.1\n[log]\nfile = "node.log"\n{log_section}')
    return NodeProcess(str(tmp_path / "data"), extra_args=["--config", config]).start(), str(site / "node.log")


def come_and_go(node) -> tuple[str, str]:
    """One good login that connects and disconnects, one wrong password; return both client ids."""
    good, bad = unique("good"), unique("bad")
    client = Paho(node.port(), client_id=good, username="alice", password=PASSWORD)
    try:
        assert client.connect() == 0
    finally:
        client.close()
    client = Paho(node.port(), client_id=bad, username="alice", password="wrong-" + PASSWORD)
    try:
        assert client.connect() == 0x86
    finally:
        client.close()
    return good, bad


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_log_file_gets_every_line_in_one_format(tmp_path):
    """[log] file holds twistd's, the broker's and the authenticator's lines; stdout holds only the ready line."""
    node, log_file = log_node(tmp_path, "")
    try:
        good, bad = come_and_go(node)
        assert wait_for(lambda: f"client_disconnected client={good}" in read(log_file))
        assert wait_for(lambda: "connect_refused" in read(log_file))
    finally:
        node.stop()
    text = read(log_file)
    assert f"INFO twistmq.mqtt.broker client_connected client={good}" in text
    # The authenticator logs through twisted.logger (its logger is named after its class).
    assert re.search(f"INFO \\S+ mqtt.auth.ok client_id='{good}' username='alice'", text)
    assert re.search(f"WARNING \\S+ mqtt.auth.fail client_id='{bad}' username='alice'", text)
    assert f"INFO twistmq.mqtt.protocol connect_refused client='{bad}' user='alice' peer=127.0.0.1" in text
    assert "twistd 26" in text and "node_stopped" in text  # Twisted's own events join the same file
    assert all(LOG_LINE.match(line) for line in text.splitlines() if not line.startswith((" ", "Traceback"))), text
    stderr = read(node.data_dir + ".stderr.log")
    assert "client_connected" not in stderr and "mqtt.auth" not in stderr
    assert [line for line in node.output if line.strip()] == [next(l for l in node.output if "twistmq ready" in l)]


def test_level_warning_silences_info_connect_lines(tmp_path):
    """[log] level = "WARNING": no INFO connect lines, the failed login still logged."""
    node, log_file = log_node(tmp_path, 'level = "WARNING"\n')
    try:
        good, bad = come_and_go(node)
        assert wait_for(lambda: f"mqtt.auth.fail client_id='{bad}'" in read(log_file))
    finally:
        node.stop()
    text = read(log_file)
    assert " INFO " not in text and good not in text


def test_connection_messages_off_keeps_refusals(tmp_path):
    """[log] connection_messages = false: no connect/disconnect lines, refused connects still there."""
    node, log_file = log_node(tmp_path, "connection_messages = false\n")
    try:
        good, bad = come_and_go(node)
        assert wait_for(lambda: f"connect_refused client='{bad}'" in read(log_file))
    finally:
        node.stop()
    text = read(log_file)
    assert good not in text and "node_stopped" in text


# -- version ----------------------------------------------------------------------------------------

def test_version_flags_print_the_package_version():
    """``twistd twistmq node --version``, ``twistd twistmq --version`` and ``twistmq-admin --version`` print it."""
    for argv in ([TWISTD, "twistmq", "node", "--version"], [TWISTD, "twistmq", "--version"], [ADMIN, "--version"]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
        assert (result.returncode, result.stdout.strip()) == (0, f"twistmq {VERSION}"), result.stderr


def test_sys_version_and_load_reach_a_paho_subscriber(tmp_path):
    """$SYS/broker/version and a Mosquitto load figure arrive, retained, to a paho subscriber."""
    config = write_config(tmp_path, "[mqtt]\nsys_interval = 1\n")
    node = NodeProcess(str(tmp_path / "data"), extra_args=["--config", config]).start()
    client = Paho(node.port())
    try:
        assert client.connect() == 0
        assert client.subscribe("$SYS/broker/version", 0) == [0]
        message = client.next_message(timeout=10)
        assert (message.topic, message.payload) == ("$SYS/broker/version", f"twistmq version {VERSION}".encode())
        assert client.subscribe("$SYS/broker/load/messages/received/1min", 0) == [0]
        message = client.next_message(timeout=10)
        assert message.topic == "$SYS/broker/load/messages/received/1min"
        assert re.fullmatch(rb"\d+\.\d\d", message.payload)
    finally:
        client.close()
        node.stop()
