"""A group of two behind a proxy, real clients: with the slave stopped (SIGSTOP) nothing past the confirm offset is
acknowledged, delivered, consumed or read by Spark; it all happens once the slave has it; a master whose set fell
below min_in_sync_replicas answers as an unreachable group after call_timeout."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from cluster.tools import launcher
from spark import segments
from store.reader import list_segments
from tests.integration.security_support import Paho
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

CALL_TIMEOUT = 8.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group of two brokers (min_in_sync_replicas 2) and one proxy, no controllers."""
    root = tmp_path_factory.mktemp("ack")
    base = root / "base.toml"
    base.write_text("[mqtt]\nallow_anonymous = true\n")
    doc = launcher.up(str(root / "c"), groups=1, proxies=1, replicas=2, controllers=0, base_config=str(base),
                      cluster_settings={"call_timeout": CALL_TIMEOUT, "min_in_sync_replicas": 2,
                                        "ha_max_time_slave_not_catchup": 120.0})
    brokers = [p for p in doc["processes"] if p["role"] == "broker"]
    proxy = next(p for p in doc["processes"] if p["role"] == "proxy")
    try:
        yield proxy, brokers[0], brokers[1]
    finally:
        for b in brokers:  # a test that failed with its slave stopped must not leave it stopped
            try:
                os.kill(b["pid"], signal.SIGCONT)
            except OSError:
                pass
        launcher.down(str(root / "c"))


class Native:
    """A native TCP client: one JSON request per line, one reply per line."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def send(self, request: dict) -> None:
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def reply(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            assert chunk, "the native connection closed"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, request: dict) -> dict:
        self.send(request)
        return self.reply()

    def close(self) -> None:
        self.sock.close()


def _log_bytes(data_dir: str) -> bytes:
    out = b""
    for seg in list_segments(os.path.join(data_dir, "commitlog")):
        with open(seg.path, "rb") as f:
            out += f.read()
    return out


def _spark_end(data_dir: str) -> int:
    return segments.latest_boundary(os.path.join(data_dir, "commitlog"), 0)[0]


def test_a_record_past_the_confirm_offset_is_shown_to_nobody_until_the_slave_has_it(cluster):
    """Slave stopped: an MQTT publish and a native produce are written on the master but neither acknowledged, nor
    delivered to a subscriber, nor returned by a native consume, nor read by Spark; once the slave runs again all
    of it happens."""
    proxy, master, slave = cluster
    sub, pub = Paho(proxy["ports"]["mqtt"]), Paho(proxy["ports"]["mqtt"])
    producer, consumer = Native(proxy["ports"]["native"]), Native(proxy["ports"]["native"])
    assert sub.connect() == 0 and pub.connect() == 0
    try:
        assert sub.subscribe("gate/#", qos=1) == [1]
        assert producer.call({"action": "produce", "queue": "gatejobs", "data": "warm-up"})["code"] == 0
        assert wait_until(lambda: consumer.call({"action": "consume", "queue": "gatejobs"}).get("data"), 10,
                          what="the warm-up consumed") == "warm-up"
        os.kill(slave["pid"], signal.SIGSTOP)
        try:
            info = pub.client.publish("gate/held", b"held-1", qos=1)
            producer.send({"action": "produce", "queue": "gatejobs", "data": "held-2"})
            wait_until(lambda: b"held-2" in _log_bytes(master["data_dir"]) and b"held-1" in _log_bytes(
                master["data_dir"]), 10, what="both records on the master")
            data = _log_bytes(master["data_dir"])
            at = min(data.index(b"held-1"), data.index(b"held-2"))  # inside the first record: it ends past this
            consumed = consumer.call({"action": "consume", "queue": "gatejobs"})
            assert consumed["code"] == 0 and "data" not in consumed, consumed
            assert _spark_end(master["data_dir"]) < at
            assert sub.next_message(timeout=1.0) is None  # bounded: a delivery would have come by now
            assert info.mid not in pub.pubacks
        finally:
            os.kill(slave["pid"], signal.SIGCONT)
        msg = sub.next_message(timeout=15)
        assert msg is not None and msg.payload == b"held-1"
        wait_until(lambda: pub.pubacks.get(info.mid) == 0, 15, what="the PUBACK")
        assert producer.reply()["code"] == 0
        consumed = wait_until(lambda: consumer.call({"action": "consume", "queue": "gatejobs"}).get("data"), 10,
                              what="the native consume")
        assert consumed == "held-2"
        wait_until(lambda: _spark_end(master["data_dir"]) > at, 10, what="Spark to read past the records")
    finally:
        producer.close()
        consumer.close()
        sub.close()
        pub.close()


def test_a_master_below_min_in_sync_replicas_answers_as_an_unreachable_group(cluster):
    """Slave stopped long enough to leave the set (min 2): after call_timeout the MQTT v5 publisher gets DISCONNECT
    0x89 and no PUBACK, a native produce gets code -1; with the slave back, publishes are acknowledged again."""
    proxy, master, slave = cluster
    pub = Paho(proxy["ports"]["mqtt"])
    native = Native(proxy["ports"]["native"])
    assert pub.connect() == 0
    os.kill(slave["pid"], signal.SIGSTOP)
    try:
        started = time.monotonic()
        info = pub.client.publish("gate/refused", b"refused-1", qos=1)
        native.send({"action": "produce", "queue": "jobs", "data": "refused-2"})
        assert pub.disconnected.wait(CALL_TIMEOUT * 3), "no DISCONNECT"
        assert pub.disconnect_reason == 0x89
        assert info.mid not in pub.pubacks
        assert time.monotonic() - started >= CALL_TIMEOUT * 0.9
        reply = native.reply()
        assert reply["code"] == -1 and reply["reason"], reply
    finally:
        os.kill(slave["pid"], signal.SIGCONT)
        native.close()
        pub.close()
    wait_until(lambda: launcher.sync_state_set_size(master) == 2, 30, what="the slave back in the set")
    again = Paho(proxy["ports"]["mqtt"])
    assert again.connect() == 0
    try:
        assert again.publish("gate/again", b"ok", qos=1, timeout=15) == 0
    finally:
        again.close()
