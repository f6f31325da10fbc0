"""Crash test: 4 QoS 1 publishers, a persistent subscriber, and 10 SIGKILLs of the node mid-stream.

Every message the node acknowledged (PUBACK) must reach the subscriber. A
duplicate may only be a message in flight at a kill, so duplicates are bounded
by the in-flight windows (publisher windows + the subscriber's) per kill.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter

import pytest

from mqtt_proxy.codec import Properties, PubAck, Publish, SubAck, Subscribe, Subscription, SubscriptionOptions
from tests.integration.mqtt_raw import Closed, RawClient
from tests.integration.node import NodeProcess

PUBLISHERS = 4
MESSAGES = 20_000
KILLS = 10
WINDOW = 32  # QoS 1 PUBLISHes in flight per publisher
SUB_INFLIGHT = 100  # the node's default mqtt.max_inflight
PERSIST = Properties(session_expiry_interval=3600)
DEADLINE_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Publisher(threading.Thread):
    """Sends its share of messages at QoS 1 with a window; records what was acknowledged."""

    def __init__(self, index: int, port: int, count: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.index, self.port, self.count, self.stop = index, port, count, stop
        self.next_seq = 0
        self.acked: set[str] = set()
        self.paused = threading.Event()

    def run(self) -> None:
        while self.next_seq < self.count and not self.stop.is_set():
            if self.paused.is_set():
                time.sleep(0.02)
                continue
            try:
                c = RawClient(self.port, 5, timeout=2.0)
                c.connect(f"crash-pub-{self.index}")
            except (OSError, Closed, TimeoutError):
                time.sleep(0.05)
                continue
            inflight: dict[int, str] = {}
            try:
                while (self.next_seq < self.count or inflight) and not self.stop.is_set():
                    while len(inflight) < WINDOW and self.next_seq < self.count:
                        pid = self.next_seq % 60000 + 1
                        mid = f"{self.index}-{self.next_seq}"
                        c.send(Publish(f"dev/{self.index}/temp", mid.encode(), qos=1, packet_id=pid))
                        inflight[pid] = mid
                        self.next_seq += 1
                    p = c.recv(2.0)
                    if isinstance(p, PubAck) and p.packet_id in inflight:
                        self.acked.add(inflight.pop(p.packet_id))
            except (OSError, Closed, TimeoutError):
                pass  # the node died: what was in flight is not promised
            finally:
                c.close()


class Subscriber:
    """The persistent QoS 1 subscriber: connects, drains and acknowledges, goes away."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.delivered: Counter = Counter()

    def session(self, duration: float, until_all: set | None = None) -> None:
        deadline = time.monotonic() + duration
        try:
            c = RawClient(self.port, 5, timeout=2.0)
            c.connect("crash-sub", clean_start=False, properties=PERSIST)
            c.send(Subscribe(1, (Subscription("dev/+/temp", SubscriptionOptions(qos=1)),)))
            while time.monotonic() < deadline:
                if until_all is not None and until_all <= set(self.delivered):
                    break
                try:
                    p = c.recv(0.5)
                except TimeoutError:
                    continue
                if isinstance(p, Publish):
                    self.delivered[p.payload.decode()] += 1
                    c.send(PubAck(p.packet_id))
                elif isinstance(p, SubAck):
                    continue
            c.close()
        except (OSError, Closed, TimeoutError):
            pass


@pytest.mark.slow
def test_acknowledged_messages_survive_ten_kills(tmp_path):
    """20,000 QoS 1 messages from 4 publishers, 10 SIGKILLs: nothing acknowledged is lost, duplicates bounded."""
    rng = random.Random(7)
    port = free_port()
    node = NodeProcess(str(tmp_path / "data"), listeners=(),
                       extra_args=["--mqtt", f"tcp:{port}:interface=127.0.0.1", "--http", "tcp:0:interface=127.0.0.1"])
    node.start()
    # The subscription exists before anything is published.
    sub = Subscriber(port)
    sub.session(0.5)
    stop = threading.Event()
    publishers = [Publisher(i, port, MESSAGES // PUBLISHERS, stop) for i in range(PUBLISHERS)]
    for p in publishers:
        p.start()
    started = time.monotonic()
    try:
        for kill in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.2))
            if kill % 2:
                sub.session(rng.uniform(0.2, 0.6))  # the subscriber returns now and then, mid-stream
            node.kill()
            time.sleep(0.1)
            node.start()
        for p in publishers:
            p.join(max(1.0, DEADLINE_S - (time.monotonic() - started)))
        acked = set().union(*(p.acked for p in publishers))
        sub.session(60, until_all=acked)
    finally:
        stop.set()
        node.stop()
    delivered = sub.delivered
    lost = acked - set(delivered)
    duplicates = sum(n - 1 for n in delivered.values() if n > 1)
    print(f"\ncrash test: kills={KILLS} sent={sum(p.next_seq for p in publishers)} acknowledged={len(acked)} "
          f"delivered={len(delivered)} lost={len(lost)} duplicates={duplicates}")
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    assert duplicates <= KILLS * (PUBLISHERS * WINDOW + SUB_INFLIGHT)
    assert len(acked) >= MESSAGES // 2, "too few acknowledged to mean anything"
