"""A proxy SIGKILLed and started again under the same id within a lease: 3 controllers, 2 broker groups, 2 proxies,
real paho v5 clients.

The new process serves its clients before its old life's lease has run out. Its first connection to a broker
ends the old life there: the session keepers take over what the old process held (a client that was on it:
its will is published after its delay, unless the client is back first). The controllers' eviction of that
old life, if it comes, must then take nothing the new process has claimed since (its clients stay connected,
their wills unpublished). To make the eviction certain, the new process of the first test is started without
the controllers' addresses (static membership: it never registers, so nothing replaces the old life's
record before its lease ends); the test then puts the proxy back as the launcher made it. The second test
restarts the proxy as the launcher made it (it registers again before its lease ends: no eviction at all).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cluster.tools import launcher
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

LEASE = 8.0
"""Long enough for a proxy process to start and register again well within its old life's lease."""

BASE = f"""
[mqtt]
allow_anonymous = true

[discovery]
lease = {LEASE}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three controllers, groups g1 and g2, two proxies; a lease of ``LEASE``, so a new process is up well
    within its old life's lease."""
    root = tmp_path_factory.mktemp("cluster-proxy-restart")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=2, controllers=3, base_config=str(base))
    doc["root"] = str(root / "c")
    yield doc
    launcher.down(str(root / "c"))


class Client:
    """A paho v5 client (a persistent session unless ``expiry`` is 0) that records what it receives and how it was disconnected."""

    def __init__(self, client_id: str, port: int, will: str | None = None, will_delay: int = 0,
                 expiry: int = 300) -> None:
        self.got: list[str] = []
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.present: list[bool] = []
        self.subacks: set[int] = set()
        self.disconnects: list[int] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._message
        self.client.on_connect = lambda c, u, flags, reason, p=None: reason.is_failure or (
            self.present.append(flags.session_present), self.connected.set())
        self.client.on_subscribe = lambda c, u, mid, codes, p=None: self.subacks.add(mid)
        self.client.on_disconnect = lambda c, u, flags, reason, p=None: self.disconnects.append(reason.value)
        self.client.reconnect_delay_set(3600, 3600)  # a client that is closed stays away
        if will is not None:
            props = Properties(PacketTypes.WILLMESSAGE)
            props.WillDelayInterval = will_delay
            self.client.will_set(will, b"gone", qos=1, properties=props)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry
        self.client.connect("127.0.0.1", port, clean_start=expiry == 0, properties=props)
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

    def count(self, topic: str) -> int:
        with self.lock:
            return self.got.count(topic)

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


def log_size(proc: dict) -> int:
    return os.path.getsize(proc["data_dir"] + ".log")


def logged_since(proc: dict, offset: int, line: str) -> bool:
    """Whether the process's log holds ``line`` past byte ``offset``."""
    with open(proc["data_dir"] + ".log", "rb") as f:
        f.seek(offset)
        return line.encode() in f.read()


def test_a_proxy_restarted_within_a_lease_keeps_the_sessions_its_new_process_claimed(cluster):
    """SIGKILL proxy 1 holding a client with a will, start it again at once: the old client's will is published,
    a client of the new process subscribes; when the old life's eviction reaches the brokers, the new client
    stays connected and served, its will unpublished."""
    proxies = [p for p in cluster["processes"] if p["role"] == "proxy"]
    brokers = [p for p in cluster["processes"] if p["role"] == "broker"]
    victim, other = proxies
    port = victim["ports"]["mqtt"]
    watcher = Client("restart-watcher", other["ports"]["mqtt"])
    watcher.subscribe("will/#")
    old = Client("restart-old", port, will="will/old")
    offsets = [log_size(b) for b in brokers]
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not launcher.alive(victim["pid"]), 10, what="proxy 1 to die")
    old.drop()
    again = without_controllers(victim)
    new = None
    try:
        launcher.start(again)
        new = Client("restart-new", port, will="will/new")
        new.subscribe("new/#")
        wait_until(lambda: watcher.received("will/old"), 20, what="the old life's client's will")
        # the eviction finds the new life's claim in its client's group, and keeps it
        evicted = f"sessions_taken_over holder={victim['id']} reason=evicted"
        wait_until(lambda: any(logged_since(b, at, evicted) for b, at in zip(brokers, offsets)), LEASE + 15,
                   what="the old life's eviction at the brokers")
        new.subscribe("more/#")  # a round trip through proxy 1 after the eviction
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


def test_a_proxy_restarted_before_its_eviction_has_its_old_clients_wills_published(cluster):
    """SIGKILL proxy 1 holding two persistent clients and a clean one with a will and start it again at once,
    registered anew before its lease ends (no eviction): the wills of the clean client and of the persistent
    one that stays away (delay 1 s) reach a subscriber on proxy 2 once, within a bounded time; the client back on the new process within its will delay (8 s)
    finds its session, and its will is never published (MQTT 5 3.1.2.8)."""
    proxies = [p for p in cluster["processes"] if p["role"] == "proxy"]
    brokers = [p for p in cluster["processes"] if p["role"] == "broker"]
    victim, other = proxies
    port = victim["ports"]["mqtt"]
    watcher = Client("lives-watcher", other["ports"]["mqtt"])
    watcher.subscribe("will/#")
    away = Client("lives-away", port, will="will/away", will_delay=1)
    back = Client("lives-back", port, will="will/back", will_delay=8)
    clean = Client("lives-clean", port, will="will/clean", will_delay=3, expiry=0)
    offsets = [log_size(b) for b in brokers]
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not launcher.alive(victim["pid"]), 10, what="proxy 1 to die")
    killed = time.monotonic()
    away.drop()
    back.drop()
    clean.drop()
    returned = None
    try:
        victim["pid"] = launcher.relaunch(cluster["root"], victim["id"])["pid"]
        returned = Client("lives-back", port, will="will/back", will_delay=8)
        assert time.monotonic() - killed < 8, "back too late to test the will delay"
        assert returned.present == [True], "the session its group kept was not found"
        wait_until(lambda: watcher.received("will/away") and watcher.received("will/clean"), 20,
                   what="the wills of the clients that stayed away")
        took = time.monotonic() - killed
        assert took < LEASE, f"the will came {took:.1f} s after the kill: by the lease, not the restart"
        wait_until(lambda: time.monotonic() - killed > 8 + 1.5, 12, what="the returned client's will delay")
        assert watcher.count("will/away") == 1 and watcher.count("will/clean") == 1
        assert not watcher.received("will/back")
        assert returned.disconnects == []
        evicted = f"holder={victim['id']} reason=evicted"
        assert not any(logged_since(b, at, evicted) for b, at in zip(brokers, offsets)), "evicted: nothing raced"
    finally:
        if returned is not None:
            returned.stop()
        watcher.stop()


def test_a_proxy_restarted_after_its_brokers_restarted_has_its_old_clients_wills_published(cluster):
    """SIGKILL proxy 1 holding a clean client with a will, then SIGKILL both brokers and start them again before
    proxy 1: the brokers never see its old process in their new lives, yet know it from the life they stored,
    so proxy 1's new process ends it when it connects (``reason=restarted``, not a lease or an eviction) and
    the will reaches a subscriber on proxy 2."""
    proxies = [p for p in cluster["processes"] if p["role"] == "proxy"]
    brokers = [p for p in cluster["processes"] if p["role"] == "broker"]
    victim, other = proxies
    watcher = Client("rb-watcher", other["ports"]["mqtt"])
    watcher.subscribe("will/#")
    gone = Client("rb-gone", victim["ports"]["mqtt"], will="will/rb-gone", expiry=0)
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: not launcher.alive(victim["pid"]), 10, what="proxy 1 to die")
    gone.drop()
    try:
        for b in brokers:
            os.kill(b["pid"], signal.SIGKILL)
        for b in brokers:
            wait_until(lambda b=b: not launcher.alive(b["pid"]), 10, what=f"{b['id']} to die")
        offsets = [log_size(b) for b in brokers]
        for b in brokers:
            b["pid"] = launcher.relaunch(cluster["root"], b["id"])["pid"]
        victim["pid"] = launcher.relaunch(cluster["root"], victim["id"])["pid"]
        wait_until(lambda: watcher.received("will/rb-gone"), 20, what="the old process's client's will")
        restarted = f"sessions_taken_over holder={victim['id']} reason=restarted"
        assert any(logged_since(b, at, restarted) for b, at in zip(brokers, offsets))
    finally:
        watcher.stop()
        for p in brokers + [victim]:
            if not launcher.alive(p["pid"]):
                p["pid"] = launcher.relaunch(cluster["root"], p["id"])["pid"]
