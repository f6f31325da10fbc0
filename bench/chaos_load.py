"""The chaos benchmark's load and audit: QoS 1 publishers and persistent subscribers on raw sockets.

Each ``Publisher`` thread publishes QoS 1 at a fixed rate through one proxy (payload ``"P:SEQ"``, topic
``chaos/P``) with at most ``window`` messages unacknowledged, and records the wall-clock time of every
PUBACK (``acks``: the audit). A connection that drops loses its unacknowledged messages (they are not
audited: nothing promised them) and is opened again. Each ``Subscriber`` thread holds a persistent
session (clean session false) on another proxy, subscribed QoS 1 to one publisher's topic, acknowledges
every delivery and counts each sequence number it receives (``counts``: duplicates are counts above one).

Threads and blocking sockets with short timeouts: every wait is bounded, every loop ends when ``stop`` is set.
"""

from __future__ import annotations

import socket
import threading
import time

from mqtt_proxy.codec import MQTTParser, encode
from mqtt_proxy.codec.errors import ProtocolError
from mqtt_proxy.codec.packets import (
    ConnAck,
    Connect,
    PubAck,
    Publish,
    Subscribe,
    Subscription,
    SubscriptionOptions,
)

LEVEL = 4  # MQTT 3.1.1: a PUBACK is a success (a broker that cannot store closes the connection)
CONNECT_TIMEOUT = 2.0
RECONNECT_PAUSE = 0.2


class _Link:
    """One MQTT connection: connect, send, read packets with a deadline."""

    def __init__(self, port: int, client_id: str, clean: bool) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = MQTTParser(server_side=False, protocol_level=LEVEL)
        self.inbox: list = []
        self.sock.sendall(encode(Connect(client_id=client_id, protocol_level=LEVEL, clean_start=clean,
                                         keep_alive=0), LEVEL))
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not self.inbox:
            if time.monotonic() > deadline or not self.read(deadline - time.monotonic()):
                self.close()
                raise ConnectionError(f"no CONNACK for {client_id}")
        connack = self.inbox.pop(0)
        if not isinstance(connack, ConnAck) or connack.reason_code != 0:
            self.close()
            raise ConnectionError(f"{client_id} refused: {connack}")
        self.session_present = connack.session_present

    def read(self, timeout: float) -> bool:
        """Read what arrives within ``timeout`` into ``inbox``; False once the connection is closed."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(262144)
        except (TimeoutError, BlockingIOError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            self.inbox.extend(self.parser.feed(data))
        except ProtocolError:
            return False
        return True

    def send(self, data: bytes) -> bool:
        try:
            self.sock.settimeout(CONNECT_TIMEOUT)
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Publisher(threading.Thread):
    """QoS 1 at ``rate`` messages/s to ``chaos/INDEX`` through the proxy at ``port``; ``acks`` the audit."""

    def __init__(self, index: int, port: int, rate: float, stop: threading.Event, window: int = 500) -> None:
        super().__init__(name=f"chaos-pub-{index}", daemon=True)
        self.index, self.port, self.rate, self.stop, self.window = index, port, rate, stop, window
        self.topic = f"chaos/{index}"
        self.acks: list[tuple[float, int]] = []
        """(wall-clock time of the PUBACK, sequence number), in the order they came."""
        self.sent = 0
        self.unacked = 0
        """Messages whose connection dropped before their PUBACK (not audited: nothing was promised)."""
        self.reconnects = 0
        self.paused = threading.Event()
        """Set: send nothing new (the final drain), still read acknowledgements."""

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            try:
                link = _Link(self.port, f"chaos-pub-{self.index}", clean=True)
            except OSError:
                time.sleep(RECONNECT_PAUSE)
                continue
            seq = self._serve(link, seq)
            link.close()
            self.reconnects += 1

    def _serve(self, link: _Link, seq: int) -> int:
        inflight: dict[int, int] = {}
        interval = 1.0 / self.rate
        due = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            due = max(due, now - 1.0)  # after a stall, at most a second of catching up
            batch = []
            while due <= now and len(inflight) < self.window and not self.paused.is_set():
                seq += 1
                pid = seq % 65535 + 1
                if pid in inflight:  # 65535 newer messages went by: that one is not coming back
                    del inflight[pid]
                    self.unacked += 1
                inflight[pid] = seq
                batch.append(encode(Publish(topic=self.topic, payload=b"%d:%d" % (self.index, seq), qos=1,
                                            packet_id=pid), LEVEL))
                due += interval
            if batch:
                if not link.send(b"".join(batch)):
                    break
                self.sent += len(batch)
            if not link.read(min(0.01, max(due - time.monotonic(), 0.001))):
                break
            at = time.time()
            for packet in link.inbox:
                if isinstance(packet, PubAck) and packet.packet_id in inflight:
                    self.acks.append((at, inflight.pop(packet.packet_id)))
            link.inbox.clear()
            if self.paused.is_set():
                due = time.monotonic()
        self.unacked += len(inflight)
        return seq


class Subscriber(threading.Thread):
    """A persistent session on the proxy at ``port`` subscribed QoS 1 to ``topic``; ``counts`` what arrived."""

    def __init__(self, client_id: str, port: int, topic: str, stop: threading.Event) -> None:
        super().__init__(name=client_id, daemon=True)
        self.client_id, self.port, self.topic, self.stop = client_id, port, topic, stop
        self.counts: dict[int, int] = {}
        """Sequence number -> deliveries."""
        self.last_receipt = 0.0
        self.reconnects = 0
        self.connects = 0
        """Connections accepted (CONNACK), the first included."""
        self.sessions_lost = 0
        """Reconnections answered without the session (its subscription made again)."""
        self.subscribed = threading.Event()
        self._bounce = threading.Event()

    def bounce(self) -> None:
        """Close the connection and open it again (the stored session must deliver what it missed)."""
        self._bounce.set()

    def run(self) -> None:
        first = True
        while not self.stop.is_set():
            try:
                link = _Link(self.port, self.client_id, clean=False)
            except OSError:
                time.sleep(RECONNECT_PAUSE)
                continue
            if not link.session_present:
                if not first:
                    self.sessions_lost += 1
                sub = Subscribe(packet_id=1, subscriptions=(Subscription(self.topic, SubscriptionOptions(qos=1)),))
                if not link.send(encode(sub, LEVEL)):
                    link.close()
                    continue
            first = False
            self.connects += 1
            self.subscribed.set()
            self._serve(link)
            link.close()
            self.reconnects += 1

    def _serve(self, link: _Link) -> None:
        while not self.stop.is_set():
            if self._bounce.is_set():
                self._bounce.clear()
                return
            if not link.read(0.05):
                return
            acks = []
            for packet in link.inbox:
                if isinstance(packet, Publish):
                    try:
                        seq = int(packet.payload.split(b":", 1)[1])
                    except (IndexError, ValueError):
                        continue
                    self.counts[seq] = self.counts.get(seq, 0) + 1
                    self.last_receipt = time.monotonic()
                    if packet.qos:
                        acks.append(encode(PubAck(packet_id=packet.packet_id), LEVEL))
            link.inbox.clear()
            if acks and not link.send(b"".join(acks)):
                return


def audit(publisher: Publisher, subscriber: Subscriber) -> dict:
    """What ``subscriber`` lacks of what ``publisher`` was acknowledged, and what it got twice."""
    acked = {seq for _, seq in publisher.acks}
    lost = sorted(seq for seq in acked if seq not in subscriber.counts)
    duplicates = sum(n - 1 for n in subscriber.counts.values() if n > 1)
    return {"acked": len(acked), "received": len(subscriber.counts), "lost": lost, "duplicates": duplicates}
