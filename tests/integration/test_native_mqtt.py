"""Devices and backends meet in one store: MQTT publish -> native consume, native produce -> MQTT subscriber, $delayed."""

from __future__ import annotations

import time

import pytest

from mqtt_proxy.codec import PubAck, Publish, SubAck, Subscribe, Subscription, SubscriptionOptions
from mqtt_proxy.native.client import BlockingClient
from tests.integration.mqtt_raw import RawClient
from tests.integration.node import NodeProcess


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(str(tmp_path_factory.mktemp("bridge") / "data"), listeners=("mqtt", "native", "http")).start()
    yield n
    n.stop()


def test_device_to_backend(node):
    """A device's QoS 1 publish is consumed by a backend from the topic consume queue, with its topic."""
    dev = RawClient(node.port(), 5)
    dev.connect("bridge-dev")
    with BlockingClient(port=node.port("native")) as backend:
        backend.consume(topic="telemetry", group="analytics")  # the group's cursor starts here
        dev.send(Publish("telemetry/dev7/temp", b'{"temp": 21.5}', qos=1, packet_id=1))
        assert isinstance(dev.recv(), PubAck)
        reply = {}
        deadline = time.monotonic() + 5
        while "data" not in reply and time.monotonic() < deadline:
            reply = backend.consume(topic="telemetry", group="analytics")
        assert reply["data"] == '{"temp": 21.5}' and reply["msg_topic"] == "telemetry/dev7/temp"
        assert reply["client_id"] == "bridge-dev"


def test_backend_to_device(node):
    """A backend's produce with a topic reaches the MQTT subscriber of a matching filter."""
    dev = RawClient(node.port(), 4)
    dev.connect("bridge-cmd")
    dev.send(Subscribe(1, (Subscription("cmd/+/reboot", SubscriptionOptions(qos=1)),)))
    dev.recv_until(SubAck)
    with BlockingClient(port=node.port("native")) as backend:
        backend.publish("cmd/dev7/reboot", "now")
    msg, _ = dev.recv_until(Publish)
    assert (msg.topic, msg.payload, msg.qos) == ("cmd/dev7/reboot", b"now", 1)


def test_mqtt_delayed_publish(node):
    """$delayed/2/topic is held about 2 s by the timer, then delivered on the real topic."""
    sub = RawClient(node.port(), 5)
    sub.connect("bridge-delay-sub")
    sub.send(Subscribe(1, (Subscription("later/t", SubscriptionOptions(qos=1)),)))
    sub.recv_until(SubAck)
    pub = RawClient(node.port(), 5)
    pub.connect("bridge-delay-pub")
    t0 = time.monotonic()
    pub.send(Publish("$delayed/2/later/t", b"ding", qos=1, packet_id=1))
    assert isinstance(pub.recv(), PubAck)
    assert [p for p in sub.recv_all(1.0) if isinstance(p, Publish)] == []
    msg, _ = sub.recv_until(Publish, timeout=5)
    elapsed = time.monotonic() - t0
    assert (msg.topic, msg.payload) == ("later/t", b"ding")
    assert 1.9 <= elapsed <= 4.0
