"""Helpers for the security integration tests: real paho clients, raw clients from chosen addresses, node files.

Shared by ``test_security_tls.py``, ``test_security_auth.py`` and
``test_security_limits.py``. Every helper blocks with a deadline, so a broken
broker fails a test instead of hanging it.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from mqtt_proxy.codec import MQTTParser, PubAck, Publish, SubAck, Subscribe, Subscription, SubscriptionOptions
from tests.integration.mqtt_raw import RawClient

_ids = itertools.count()


def unique(prefix: str) -> str:
    """A client id (or topic level) no other test uses."""
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def write_config(directory, text: str) -> str:
    """Write a TOML config file for ``--config``; return its path."""
    path = os.path.join(str(directory), "twistmq.toml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def toml_str(path: str) -> str:
    """Quote a path as a TOML basic string."""
    return '"' + str(path).replace("\\", "\\\\").replace('"', '\\"') + '"'


def node_logs(node) -> str:
    """Everything the node wrote: its stdout (twistd log) and its stderr log file."""
    stderr_path = os.path.join(os.path.dirname(node.data_dir.rstrip("/")) or ".",
                               os.path.basename(node.data_dir.rstrip("/")) + ".stderr.log")
    if node._log is not None and not node._log.closed:
        node._log.flush()
    with open(stderr_path, "rb") as handle:
        stderr = handle.read().decode("utf-8", errors="replace")
    return "\n".join(list(node.output)) + "\n" + stderr


def http_get(node, path: str = "/metrics", timeout: float = 5.0) -> tuple[int, str]:
    """GET a path of the node's HTTP listener."""
    url = f"http://127.0.0.1:{node.port('http')}{path}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def anon_rss_kib(pid: int) -> int:
    """Anonymous resident memory of a process (heap, not mapped files), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/PID/status")


# -- raw codec clients ------------------------------------------------------------------------------

class SourceClient(RawClient):
    """A RawClient whose socket is bound to a chosen loopback source address, optionally with a small receive buffer.

    The per-address connection-rate limit counts by source address, so tests
    that must not trip it spread their connections over 127.0.0.0/8.
    """

    _next_source = itertools.count()

    def __init__(self, port: int, level: int = 5, timeout: float = 5.0, source: str | None = None,
                 rcvbuf: int | None = None) -> None:
        self.level = level
        self.timeout = timeout
        if source is None:
            n = next(self._next_source)
            source = f"127.0.{10 + n // 200 % 200}.{10 + n % 200}"
        self.source = source
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        self.sock = sock
        self.parser = MQTTParser(server_side=False, protocol_level=level)
        self.inbox: list = []
        self.closed = False


def raw(port: int, level: int = 5, client_id: str | None = None, expect_ok: bool = True, **connect):
    """A connected raw client (from a fresh source address); asserts the CONNACK is a success unless told not to."""
    c = SourceClient(port, level)
    ack = c.connect(client_id or unique("raw"), **connect)
    if expect_ok:
        assert ack.reason_code == 0, ack
    c.connack = ack
    return c


def subscribe(c, topic_filter, qos: int = 1, pid: int = 1, **opts) -> SubAck:
    """SUBSCRIBE to one filter; return the SUBACK."""
    c.send(Subscribe(pid, (Subscription(topic_filter, SubscriptionOptions(qos=qos, **opts)),)))
    ack, _ = c.recv_until(SubAck)
    return ack


def subscribe_many(c, filters, qos: int = 1, pid: int = 1) -> SubAck:
    """SUBSCRIBE to several filters in one packet; return the SUBACK."""
    c.send(Subscribe(pid, tuple(Subscription(f, SubscriptionOptions(qos=qos)) for f in filters)))
    ack, _ = c.recv_until(SubAck)
    return ack


def publishes(packets) -> list:
    """The PUBLISH packets among *packets*."""
    return [p for p in packets if isinstance(p, Publish)]


def assert_serving(port: int, level: int = 5) -> None:
    """A fresh subscriber and a fresh publisher complete a QoS 1 round trip: the broker still serves others."""
    topic = "serving/" + unique("t")
    sub = raw(port, level)
    try:
        ack = subscribe(sub, topic, qos=1)
        assert ack.reason_codes == (1,), ack
        pub = raw(port, level)
        try:
            pub.send(Publish(topic, b"still serving", qos=1, packet_id=1))
            ack, _ = pub.recv_until(PubAck)
            assert (ack.packet_id, ack.reason_code) == (1, 0), ack
            msg, _ = sub.recv_until(Publish)
            assert (msg.topic, msg.payload) == (topic, b"still serving")
        finally:
            pub.close()
    finally:
        sub.close()


# -- paho ------------------------------------------------------------------------------------------

class Paho:
    """A paho-mqtt 2.x client run on its own network thread, with blocking helpers.

    ``connect()`` returns the CONNACK reason code as an int (paho's v3.1.1
    return codes come mapped to v5 values: 4 -> 0x86, 5 -> 0x87), or None when
    no CONNACK arrived (TLS handshake refused, connection closed first).
    """

    def __init__(self, port: int, client_id: str | None = None, level: int = 5, transport: str = "tcp",
                 ws_path: str | None = None, tls: dict | None = None, username: str | None = None,
                 password: str | None = None) -> None:
        self.port = port
        self.level = level
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id or unique("paho"),
                                  protocol=mqtt.MQTTv5 if level == 5 else mqtt.MQTTv311, transport=transport,
                                  reconnect_on_failure=False)
        if transport == "websockets":
            self.client.ws_set_options(path=ws_path or "/mqtt")
        if tls is not None:
            self.client.tls_set(**tls)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.client.reconnect_delay_set(60, 60)  # never reconnect by itself during a test
        self.messages: queue.Queue = queue.Queue()
        self.connack: int | None = None
        self._connack = threading.Event()
        self.disconnected = threading.Event()
        self.disconnect_reason = None
        self.subacks: dict[int, list[int]] = {}
        self.pubacks: dict[int, int] = {}
        self._acked = threading.Condition()
        c = self.client
        c.on_connect = self._on_connect
        c.on_connect_fail = self._on_connect_fail
        c.on_disconnect = self._on_disconnect
        c.on_message = lambda _c, _u, m: self.messages.put(m)
        c.on_subscribe = self._on_subscribe
        c.on_publish = self._on_publish
        self.errors: list[str] = []  # paho's error log lines and connect() exceptions (e.g. TLS alerts)
        c.on_log = lambda _c, _u, level, text: self.errors.append(text) if level == mqtt.MQTT_LOG_ERR else None
        self._started = False

    def _on_connect(self, _c, _u, _flags, reason_code, _props) -> None:
        self.connack = reason_code.value
        self._connack.set()

    def _on_connect_fail(self, _c, _u) -> None:
        self._stop_reconnecting()
        self._connack.set()

    def _on_disconnect(self, _c, _u, _flags, reason_code, _props) -> None:
        self.disconnect_reason = getattr(reason_code, "value", reason_code)
        self._stop_reconnecting()
        self.disconnected.set()
        self._connack.set()

    def _stop_reconnecting(self) -> None:
        # Mark the client disconnected so paho's network thread ends instead of waiting to reconnect.
        try:
            self.client.disconnect()
        except Exception:  # noqa: BLE001 - the socket is already gone
            pass

    def _on_subscribe(self, _c, _u, mid, reason_codes, _props) -> None:
        with self._acked:
            self.subacks[mid] = [rc.value for rc in reason_codes]
            self._acked.notify_all()

    def _on_publish(self, _c, _u, mid, reason_code, _props) -> None:
        with self._acked:
            self.pubacks[mid] = reason_code.value
            self._acked.notify_all()

    def connect(self, timeout: float = 10.0) -> int | None:
        """Connect and wait for the CONNACK (or the failure); return its reason code or None."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=30)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: a handshake refused by either side
            self.errors.append(str(exc))
            return None
        self.client.loop_start()
        self._started = True
        self._connack.wait(timeout)
        return self.connack

    def _wait_for(self, table: dict, mid: int, timeout: float):
        deadline = time.monotonic() + timeout
        with self._acked:
            while mid not in table:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no acknowledgement for mid {mid}")
                self._acked.wait(left)
            return table[mid]

    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 5.0) -> list[int]:
        """Subscribe and return the SUBACK reason codes as ints."""
        _rc, mid = self.client.subscribe(topic_filter, qos)
        return self._wait_for(self.subacks, mid, timeout)

    def publish(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False,
                timeout: float = 5.0) -> int | None:
        """Publish; for QoS 1 wait for the PUBACK and return its reason code."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        if qos == 0:
            return None
        return self._wait_for(self.pubacks, info.mid, timeout)

    def next_message(self, timeout: float = 5.0):
        """The next message received, or None on timeout."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            if self._started:
                self.client.loop_stop()


def paho_round_trip(port: int, level: int = 5, topic: str | None = None, **kw) -> bytes | None:
    """Connect one paho client with ``kw`` (transport, tls, credentials), subscribe, publish QoS 1 to itself.

    Returns the payload received, or raises AssertionError naming what failed.
    """
    topic = topic or "rt/" + unique("t")
    payload = f"round trip {unique('p')}".encode()
    client = Paho(port, level=level, **kw)
    try:
        rc = client.connect()
        assert rc == 0, f"CONNACK {rc!r}"
        assert client.subscribe(topic, 1) == [1]
        assert client.publish(topic, payload, qos=1) == 0
        msg = client.next_message()
        assert msg is not None, "no message came back"
        assert msg.topic == topic
        return msg.payload
    finally:
        client.close()


# -- twistmq-admin --------------------------------------------------------------------------------

ADMIN = os.path.join(os.path.dirname(sys.executable), "twistmq-admin")


def admin(*args: str, stdin: str | None = None) -> str:
    """Run the real ``twistmq-admin`` command; return its stdout, fail the test on a non-zero exit."""
    done = subprocess.run([ADMIN, *args], input=stdin, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"twistmq-admin {args[0]} failed: {done.stderr}"
    return done.stdout


def add_user(password_file: str, user: str, password: str) -> None:
    """Add a user with ``twistmq-admin passwd``, the password on stdin (never on the command line)."""
    admin("passwd", password_file, user, stdin=password + "\n")
