"""A proxy SIGKILLed and started again under the same id within a lease: 3 controllers, 2 broker groups, 2 proxies,
real paho v5 clients.

The new process serves its clients before its old life's lease has run out; the controllers' eviction of that
old life then reaches the brokers, whose session keepers must take over only what the old process held (a
client that was on it: its will is published), not the sessions the new process has just claimed (their
clients stay connected, their wills unpublished). To make the order certain, the new process is started
without the controllers' addresses (static membership: it never registers, so nothing replaces the old
life's record before its lease ends); the test then puts the proxy back as the launcher made it.
"""

from __future__ import annotations

import os
import re
import signal
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cluster.tools import launcher
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

BASE = """
[mqtt]
allow_anonymous = true
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three controllers, groups g1 and g2, two proxies; the default lease (3 s), so a new process is up well
    within its old life's lease."""
    root = tmp_path_factory.mktemp("cluster-proxy-restart")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, controllers=3, base_config=str(base))
    doc["root"] = str(root / "c")
    yield doc
    launcher.down(str(root / "c"))


class Client:
    """A paho v5 client with a persistent session that records what it receives and how it was disconnected."""

    def __init__(self, client_id: str, port: int, will: str | None = None) -> None:
        self.got: list[str] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.subacks: set[int] = set()
        self.disconnects: list[int] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._message
        self.client.on_connect = lambda c, u, flags, reason, p=None: reason.is_failure or self.connected.set()
        self.client.on_subscribe = lambda c, u, mid, codes, p=None: self.subacks.add(mid)
        self.client.on_disconnect = lambda c, u, flags, reason, p=None: self.disconnects.append(reason.value)
        self.client.reconnect_delay_set(3600, 3600)  # a client that is closed stays away
        if will is not None:
            props = Properties(PacketTypes.WILLMESSAGE)
            props.WillDelayInterval = 0
            self.client.will_set(will, b"gone", qos=1, properties=props)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
        self.client.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.client.loop_start()
        assert self.connected.wait(15), f"no CONNACK for {client_id}"

    def _message(self, client, userdata, message) -> None:
        with self.lock:
            self.got.append(message.topic)

    def subscribe(self, topic_filter: str) -> None:
        result, mid = self.client.subscribe(topic_filter, 1)
        assert result == 0
        wait_until(lambda: mid in self.subacks, 15, what=f"SUBACK of {topic_filter}")

    def received(self, topic: str) -> bool:
        with self.lock:
            return topic in self.got

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()

    def drop(self) -> None:
        """Stop without a DISCONNECT (its proxy is gone anyway)."""
        self.client.loop_stop()
        self.client.socket() and self.client.socket().close()


def without_controllers(proc: dict) -> dict:
    """``proc`` with a config that names no controllers (the same id, ports and data dir)."""
    argv = list(proc["argv"])
    config = argv[argv.index("--config") + 1]
    with open(config, encoding="utf-8") as f:
        text = f.read()
    static = config.replace(".toml", "-static.toml")
    with open(static, "w", encoding="utf-8") as f:
        f.write(re.sub(r"(?m)^controllers = .*$", "controllers = []", text))
    argv[argv.index("--config") + 1] = static
    return dict(proc, argv=argv)


def test_a_proxy_restarted_within_a_lease_keeps_the_sessions_its_new_process_claimed(cluster):
    """SIGKILL proxy 1 holding a client with a will, start it again at once: a client of the new process
    subscribes; when the old life's eviction reaches the brokers, the old client's will is published, and the
    new client stays connected and served, its will unpublished."""
    proxies = [p for p in cluster["processes"] if p["role"] == "proxy"]
    victim, other = proxies
    port = victim["ports"]["mqtt"]
    watcher = Client("restart-watcher", other["ports"]["mqtt"])
    watcher.subscribe("will/#")
    old = Client("restart-old", port, will="will/old")
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not launcher.alive(victim["pid"]), 10, what="proxy 1 to die")
    old.drop()
    again = without_controllers(victim)
    new = None
    try:
        launcher.start(again)
        new = Client("restart-new", port, will="will/new")
        new.subscribe("new/#")
        if watcher.received("will/old"):
            pytest.skip("the new process served its client only after its old life's eviction: nothing raced")
        wait_until(lambda: watcher.received("will/old"), 20, what="the old life's eviction (its client's will)")
        new.subscribe("more/#")  # a round trip through proxy 1 after the eviction's takeover
        publisher = Client("restart-pub", other["ports"]["mqtt"])
        publisher.client.publish("new/x", b"x", qos=1).wait_for_publish(15)
        publisher.stop()
        wait_until(lambda: new.received("new/x"), 15, what="delivery to the new process's client")
        assert new.disconnects == [] and not watcher.received("will/new")
    finally:
        if new is not None:
            new.stop()
        watcher.stop()
        if again.get("pid") and launcher.alive(again["pid"]):
            os.kill(again["pid"], signal.SIGKILL)
            wait_until(lambda: not launcher.alive(again["pid"]), 10, what="the static proxy 1 to die")
        victim["pid"] = launcher.relaunch(cluster["root"], victim["id"])["pid"]
