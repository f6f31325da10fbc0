"""$SYS/broker topics over a real broker and store: Mosquitto's names, the version, and the load averages."""

from __future__ import annotations

import math

import pytest

from cluster.runtime.version import twistmq_version
from mqtt_proxy.codec import Subscribe, Subscription, SubscriptionOptions
from mqtt_proxy.sys_topics import LoadAverage, SysPublisher
from tests.unit.test_mqtt_broker import Harness


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def test_load_average_follows_mosquitto_formula():
    """The 1/5/15 minute loads are rate + exp(-elapsed/window) * (previous - rate), per minute."""
    load = LoadAverage()
    assert load.update(0.0, 0) == {"1min": 0.0, "5min": 0.0, "15min": 0.0}
    values = load.update(10.0, 100)  # 100 in 10 s: 600 per minute
    assert values["1min"] == pytest.approx(600 * (1 - math.exp(-10 / 60)))
    assert values["15min"] == pytest.approx(600 * (1 - math.exp(-10 / 900)))
    previous = values["1min"]
    values = load.update(20.0, 100)  # nothing new: decays towards 0
    assert values["1min"] == pytest.approx(math.exp(-10 / 60) * previous)


def test_load_average_converges_to_a_steady_rate():
    """At a steady 30 messages a minute, every load figure approaches 30."""
    load = LoadAverage()
    for step in range(0, 2 * 3600 // 10 + 1):
        values = load.update(step * 10.0, step * 5)
    assert values["1min"] == pytest.approx(30.0) and values["15min"] == pytest.approx(30.0, rel=1e-3)


def test_publisher_values_include_mosquitto_topics(h):
    """The published set has the version, uptime, client, publish, subscription and load topics."""
    sub = h.connect("watcher")
    sub.send(Subscribe(1, [Subscription("a/b", SubscriptionOptions(qos=0))]))
    h.connect("other")
    publisher = SysPublisher(h.broker, h.local, h.clock, 10.0, twistmq_version(), lambda: {"retained messages/count": str(h.retained.count)})
    values = publisher.values()
    assert values["version"] == f"twistmq version {twistmq_version()}"
    assert values["clients/connected"] == "2" and values["clients/total"] == "2"
    assert values["clients/disconnected"] == "0"
    assert values["subscriptions/count"] == "1"
    assert values["retained messages/count"] == "0"
    for figure in ("messages/received", "messages/sent", "bytes/received", "bytes/sent", "publish/dropped",
                   "connections"):
        for window in ("1min", "5min", "15min"):
            assert values[f"load/{figure}/{window}"] == "0.00"
    h.broker.stats.messages_received += 60
    h.clock.advance(60)
    later = publisher.values()
    assert later["load/messages/received/1min"] == f"{60 * (1 - math.exp(-1)):.2f}"
    assert later["uptime"] == "60 seconds"


def test_publisher_stores_retained_sys_messages(h):
    """publish() stores every value as a retained $SYS/broker message a subscriber can read."""
    publisher = SysPublisher(h.broker, h.local, h.clock, 10.0, twistmq_version(), lambda: {"retained messages/count": str(h.retained.count)})
    publisher.start()
    h.tick()
    publisher.stop()
    sub = h.connect("sys-reader")
    sub.send(Subscribe(1, [Subscription("$SYS/broker/version", SubscriptionOptions(qos=0))]))
    h.tick()
    payloads = [p.payload for p in sub.received() if getattr(p, "topic", None) == "$SYS/broker/version"]
    assert payloads == [f"twistmq version {twistmq_version()}".encode()]
