"""A real node with ``kv_sync = true`` and tiny segments: every fsync off the reactor, no promise broken.

With kv_sync the session and native KVs answer only after a WAL fsync that now
runs on the executor, and each segment roll leaves its fsyncs to the flush
policy's thread; these tests drive both through real clients (paho-mqtt, the
native client), kill the node with SIGKILL and check nothing answered is lost.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

from mqtt_proxy.native.client import BlockingClient
from tests.integration.node import NodeProcess
from tests.integration.waiting import wait_until

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

pytestmark = pytest.mark.slow

CONFIG = """\
[store]
kv_sync = true
segment_size = 4096
index_flush_s = 0.5
"""
WAIT = 20.0
COUNT = 300


@pytest.fixture
def node(tmp_path):
    conf = tmp_path / "twistmq.toml"
    conf.write_text(CONFIG)
    n = NodeProcess(str(tmp_path / "data"), listeners=("mqtt", "native", "http"),
                    extra_args=["--config", str(conf)]).start()
    yield n
    n.stop_hard()


class Subscriber:
    """A paho client on a persistent session (clean_session=False) that collects payloads."""

    def __init__(self, port, client_id):
        self.got: list[bytes] = []
        self.ready = threading.Event()
        self.c = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
                             clean_session=False, protocol=paho.MQTTv311, reconnect_on_failure=False)
        self.c.on_connect = lambda c, u, f, rc, p: self.ready.set()
        self.c.on_message = lambda c, u, m: self.got.append(m.payload)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert self.ready.wait(WAIT)

    def wait_for(self, n):
        deadline = time.monotonic() + WAIT
        while len(set(self.got)) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return set(self.got)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def _publish_all(port, count):
    """QoS 1 publishes from paho; returns the payloads whose PUBACK came back."""
    pub = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="kvs-pub",
                      protocol=paho.MQTTv311)
    pub.max_inflight_messages_set(50)
    pub.connect("127.0.0.1", port)
    pub.loop_start()
    try:
        infos = [(b"m%04d" % i, pub.publish(f"kvs/{i % 4}/t", b"m%04d" % i, qos=1)) for i in range(count)]
        for _payload, info in infos:
            info.wait_for_publish(WAIT)
        return {payload for payload, info in infos if info.is_published()}
    finally:
        pub.disconnect()
        pub.loop_stop()


def test_persistent_qos1_with_kv_sync_across_rolls_and_sigkill(node, tmp_path):
    """Every PUBACKed message reaches a persistent subscriber, before and after a SIGKILL, through many segment
    rolls, and /metrics reports the reactor's lateness."""
    sub = Subscriber(node.port(), "kvs-sub")
    subacks = []
    sub.c.on_subscribe = lambda c, u, mid, codes, p: subacks.append(mid)
    _, mid = sub.c.subscribe("kvs/+/t", qos=1)
    wait_until(lambda: mid in subacks, WAIT, what="the SUBACK")
    acked = _publish_all(node.port(), COUNT)
    assert len(acked) == COUNT
    assert sub.wait_for(COUNT) >= acked
    assert len(list((tmp_path / "data" / "commitlog").glob("0*"))) > 5, "the log rolled many times"
    text = urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/metrics", timeout=5).read().decode()
    lag = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
           if line.startswith("twistmq_reactor_lag_seconds{")}
    assert set(lag) == {"0.5", "0.99", "1"} and 0 <= lag["0.5"] <= lag["0.99"] <= lag["1"]
    sub.close()
    more = _publish_all(node.port(), 50)  # queued for the offline persistent session
    node.kill()
    node.start()
    back = Subscriber(node.port(), "kvs-sub")
    try:
        assert back.wait_for(len(more)) >= more, "acknowledged while offline: delivered after the restart"
    finally:
        back.close()


def test_native_produce_and_confirm_with_kv_sync_survive_sigkill(node):
    """Native produce replies follow the log write and confirms follow the fsynced KV: after SIGKILL the
    confirmed messages stay gone and every other produced one is still there."""
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        ids = [c.produce("kvs-jobs", "j%d" % i, retry=60) for i in range(60)]
        for _ in range(20):
            got = c.consume("kvs-jobs")
            c.confirm("kvs-jobs", got["msg_id"])
    node.kill()
    node.start()
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        rest = [c.consume("kvs-jobs")["msg_id"] for _ in range(40)]
        assert rest == ids[20:]
        assert "data" not in c.consume("kvs-jobs")
