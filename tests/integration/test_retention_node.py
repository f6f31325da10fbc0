"""Retention against a real node: owed messages survive it, a disk limit's losses are counted and named.

The node runs with 64 KiB segments and a retention of 2 seconds, checked twice
a second: the same code path as the default 72 hours, only sooner.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from mqtt_proxy.native.client import BlockingClient
from tests.integration.node import NodeProcess
from tests.integration.waiting import QUIET_PERIOD, metric_value, wait_until

pytestmark = pytest.mark.slow

RETENTION_HOURS = 2 / 3600  # two seconds
CHECK_S = 0.5  # retention_check_s
MORE_RUNS = 3  # retention runs watched after the first that held owed segments
QUOTA_MB = 1


def _config(path, **store) -> str:
    values = {"segment_size": 65536, "retention_hours": RETENTION_HOURS, "retention_check_s": CHECK_S,
              "disk_max_used_ratio": 1.0, **store}
    lines = ["[store]"] + [f"{k} = {v!r}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _paho(node, client_id, clean=False):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean,
                    protocol=mqtt.MQTTv311)
    c.max_inflight_messages_set(100)
    c.connect("127.0.0.1", node.port("mqtt"))
    c.loop_start()
    return c


def _subscribe_offline(node, client_id, topic_filter):
    """A persistent session subscribed to ``topic_filter``, then disconnected."""
    c = _paho(node, client_id)
    done = threading.Event()
    c.on_subscribe = lambda *a: done.set()
    c.subscribe(topic_filter, qos=1)
    assert done.wait(10)
    c.disconnect()
    c.loop_stop()


def _publish_all(node, topic_of, count, size=100, retain_topic=None):
    pub = _paho(node, f"pub-{time.monotonic_ns()}", clean=True)
    infos = [pub.publish(topic_of(i), b"%06d" % i + b"x" * (size - 6), qos=1) for i in range(count)]
    if retain_topic:
        infos.append(pub.publish(retain_topic, b"retained-value", qos=1, retain=True))
    for info in infos:
        info.wait_for_publish(30)
        assert info.rc == 0 and info.is_published()
    pub.disconnect()
    pub.loop_stop()


def _receive(node, client_id, expect, timeout=60.0):
    """Reconnect a persistent session and collect the message numbers it gets until ``expect`` arrive."""
    got: list[int] = []
    lock = threading.Lock()

    def on_message(_c, _u, msg):
        with lock:
            got.append(int(msg.payload[:6]))

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False,
                    protocol=mqtt.MQTTv311)
    c.on_message = on_message
    c.connect("127.0.0.1", node.port("mqtt"))
    c.loop_start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(set(got)) < expect:
        time.sleep(0.1)
    time.sleep(QUIET_PERIOD)  # anything beyond what was expected would show up now
    c.disconnect()
    c.loop_stop()
    return got


def _segments(node) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(node.data_dir, "commitlog")) if n.isdigit())


def _log(node) -> str:
    with open(node.data_dir.rstrip("/") + ".stderr.log", errors="replace") as f:
        return f.read()


def _store_bytes(node) -> float:
    return metric_value(node.port("http"), "twistmq_store_bytes")


def _metrics(node) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/metrics", timeout=5) as r:
        return r.read().decode()


def _wait_for(predicate, timeout=20.0, what="condition"):
    wait_until(predicate, timeout, interval=0.2, what=what)


def test_owed_messages_survive_many_retention_runs_and_caught_up_logs_are_freed(tmp_path):
    """Offline session, native queue, retained, POP-invisible and delayed messages all outlive a 2 s retention;
    once every consumer has caught up, retention deletes every segment but the active one."""
    node = NodeProcess(str(tmp_path / "data"), listeners=("mqtt", "native", "http"),
                       extra_args=["--config", _config(tmp_path / "ret.toml")]).start()
    try:
        _subscribe_offline(node, "ret-sub", "ret/#")
        with BlockingClient("127.0.0.1", node.port("native")) as nc:
            nc.produce("popq", "invisible")
            popped = nc.pop("popq", invisible_time=8)
            assert popped["data"] == "invisible"
            native_ids = [nc.produce("retq", f"n{i:04d}" + "y" * 100, ttl=3600) for i in range(500)]
            delayed_id = nc.produce("later", "delayed", delay=6)
        _publish_all(node, lambda i: f"ret/{i % 10}", 3000, retain_topic="keep/r")
        assert len(_segments(node)) >= 6  # the backlog spans many segments
        # A run found segments old enough to go and kept them for what is owed in them ...
        _wait_for(lambda: "retention_held" in _log(node), timeout=10, what="a run holding owed segments")
        time.sleep(MORE_RUNS * CHECK_S)  # ... and so do the runs after it (the waiting is the subject here)
        assert "commitlog_segment_deleted" not in _log(node)

        got = _receive(node, "ret-sub", 3000)
        assert sorted(set(got)) == list(range(3000))
        with BlockingClient("127.0.0.1", node.port("native")) as nc:
            replies = [nc.consume("retq") for _ in range(500)]
            assert [r["msg_id"] for r in replies] == native_ids
            assert "data" not in nc.consume("retq")
            again = None
            for _ in range(100):  # the invisible time (8 s) ends: the popped message comes back
                again = nc.pop("popq", invisible_time=30)
                if "data" in again:
                    break
                time.sleep(0.2)
            assert again["msg_id"] == popped["msg_id"] and again["data"] == "invisible"
            nc.ack("popq", again["msg_id"])
            r = nc.consume("later")
            for _ in range(100):
                if "data" in r:
                    break
                time.sleep(0.2)
                r = nc.consume("later")
            assert r["data"] == "delayed" and r["msg_id"] == delayed_id

        # Every consumer has caught up: the next runs free everything but the active segment,
        # and the retained message is carried ahead of them.
        _wait_for(lambda: len(_segments(node)) == 1, timeout=20, what="one segment left")
        assert "commitlog_segment_deleted" in _log(node) and "retention_carried" in _log(node)
        assert "retention_dropped_owed" not in _log(node)
        retained = _receive_retained(node, "keep/r")
        assert retained == b"retained-value"
    finally:
        node.stop()


def _receive_retained(node, topic) -> bytes | None:
    got = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ret-reader", protocol=mqtt.MQTTv311)
    c.on_message = lambda _c, _u, msg: got.append(msg.payload)
    c.connect("127.0.0.1", node.port("mqtt"))
    c.loop_start()
    c.subscribe(topic, qos=1)
    _wait_for(lambda: got, timeout=10, what="the retained message")
    c.disconnect()
    c.loop_stop()
    return got[0]


def test_disk_quota_drops_are_counted_logged_and_skipped(tmp_path):
    """A 1 MB quota under a 3 MB backlog: the metric and the log name the queue and offsets dropped,
    and the session and the native consumer get everything after the gap."""
    node = NodeProcess(str(tmp_path / "data"), listeners=("mqtt", "native", "http"),
                       extra_args=["--config", _config(tmp_path / "quota.toml", disk_quota_mb=QUOTA_MB,
                                                       retention_hours=1000.0)]).start()
    try:
        _subscribe_offline(node, "quota-sub", "q/#")
        with BlockingClient("127.0.0.1", node.port("native")) as nc:
            for i in range(200):
                nc.produce("qn", f"{i:06d}" + "z" * 1000)
            _publish_all(node, lambda i: f"q/{i % 4}", 3000, size=1000)
            for i in range(200, 400):
                nc.produce("qn", f"{i:06d}" + "z" * 1000)
        _wait_for(lambda: "retention_dropped_owed" in _log(node), what="a quota deletion")
        # The runs settle once the log is under the quota: nothing is published any more, so nothing more goes.
        _wait_for(lambda: _store_bytes(node) <= QUOTA_MB * 1024 * 1024, what="the log under the quota")
        text = _log(node)
        metric = dict(re.findall(r'twistmq_retention_dropped_messages_total\{queue="([^"]+)"\} ([0-9.e+]+)',
                                 _metrics(node)))
        lost_lmq = int(float(metric["%LMQ%q/#"]))
        lost_native = int(float(metric["%QUEUE%qn"]))
        assert lost_lmq > 0 and lost_native > 0
        logged = [(q, owner, int(a), int(b)) for q, owner, a, b in re.findall(
            r"retention_dropped_owed queue=(\S+) owner='([^']+)' queue_offsets=\[(\d+),(\d+)\)", text)]
        by_queue: dict[str, int] = {}
        for q, owner, a, b in logged:
            by_queue[q] = by_queue.get(q, 0) + (b - a)
        assert by_queue == {"%LMQ%q/#": lost_lmq, "%QUEUE%qn": lost_native}
        assert {owner for q, owner, _a, _b in logged if q == "%LMQ%q/#"} == {"session quota-sub"}

        got = _receive(node, "quota-sub", 3000 - lost_lmq)
        assert sorted(set(got)) == list(range(lost_lmq, 3000))  # everything after the gap
        with BlockingClient("127.0.0.1", node.port("native")) as nc:
            first = nc.consume("qn")
            assert first["data"].startswith(f"{lost_native:06d}")
        _wait_for(lambda: "delivery_gap client=quota-sub" in _log(node), what="the session's gap line")
        # The native queue had no reader yet: its loss is the retention metric's; its first reader starts after it.
        assert f"twistmq_delivery_gap_messages_total {float(lost_lmq)}" in _metrics(node)
    finally:
        node.stop()
