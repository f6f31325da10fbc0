"""A known telemetry data set, and the functions that put it into a store.

Two ways in, one result: a list of ``Published`` (what the store holds, read
back with the store's plain-Python reader) from which the tests compute their
ground truth.

- ``publish_dataset`` / ``StoreWriter``: the real store (``MessageStore`` with the
  light-queue index, a synchronous executor and a ``task.Clock``), so each
  record's ``store_ts`` is the time the data set says and windows are exact.
- ``publish_through_node``: a real node process (``twistd twistmq node``) and one
  paho-mqtt client per device. The node stamps ``store_ts`` itself, so the
  ground truth uses what it stored; the published content is checked first.

``node_available()`` says whether the node role exists in this checkout
(``cluster/roles/node.py``); the ``published`` fixture in ``conftest.py`` picks the
node when it does (``TWISTMQ_SPARK_DATASET=store`` forces the store).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from twisted.internet import task

from store import reader
from store import record as rec
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore

T0 = 1_717_243_200_000  # 2024-06-01T12:00:00Z, a minute boundary
MINUTE = 60_000
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Published:
    """A message as the store holds it: what the ground truth is computed from."""

    message: rec.Message
    store_ts: int
    offset: int

    @property
    def payload(self) -> bytes:
        return self.message.body


class StoreWriter:
    """The real message store on ``data_dir``, writing each record at the time it is given.

    The clock is a ``task.Clock`` set to each record's ``store_ts`` before its
    tick, so what the store stamps is exactly the data set's time. Holds the
    data dir's lock while open, as a live broker does.
    """

    def __init__(self, data_dir: str, segment_bytes: int | None = None):
        import lightqueue

        self.clock = task.Clock()
        self.clock.rightNow = T0 / 1000
        config = StoreConfig(segment_size=segment_bytes or (64 << 20), retention_hours=1e6,
                             retention_check_s=1e6, index_flush_s=1e6)
        self.store = MessageStore(data_dir, config, self.clock, SynchronousExecutor())
        lightqueue.attach(self.store)
        self.store.open()

    def publish(self, items: list[tuple[rec.Message, int]]) -> list[Published]:
        """Put ``(message, store_ts)`` pairs in order, one tick per distinct time; return where they landed."""
        out: list[Published] = []
        i = 0
        while i < len(items):
            ts = items[i][1]
            results: list = []
            batch = []
            while i < len(items) and items[i][1] == ts:
                batch.append(items[i][0])
                i += 1
            self.clock.rightNow = (ts + 0.5) / 1000  # int(seconds() * 1000) == ts exactly
            for m in batch:
                self.store.put(m).addCallback(results.append)
            self.clock.advance(0)
            assert [r.ok for r in results] == [True] * len(batch), results
            out += [Published(m, ts, r.offset) for m, r in zip(batch, results)]
        return out

    def close(self) -> None:
        self.store.close()


def publish_dataset(data_dir: str, items: list[tuple[rec.Message, int]],
                    segment_bytes: int | None = None) -> list[Published]:
    """Store ``(message, store_ts)`` pairs in ``data_dir`` through the real store; return where they landed.

    ``segment_bytes`` is the store's segment size (a new segment starts where the
    previous one ended). Appends to an existing store.
    """
    writer = StoreWriter(data_dir, segment_bytes)
    try:
        return writer.publish(items)
    finally:
        writer.close()


def telemetry(seed: int = 7, devices: int = 6, minutes: int = 12, per_minute: int = 20,
              silent_device_stops_at: int = 4, extras: bool = True) -> list[tuple[rec.Message, int]]:
    """A deterministic device stream with spikes, bad payloads and a device that goes quiet.

    Values are multiples of 0.25 so that sums, means and percentiles are exact
    in binary floating point whatever the order Spark adds them in. ``extras``
    adds a native record and a ``$SYS`` publish (not MQTT devices).
    """
    rng = random.Random(seed)
    items: list[tuple[rec.Message, int]] = []
    names = [f"dev-{i:02d}" for i in range(devices)]
    spikes = {(names[1], 9, 5), (names[3], 7, 11)}  # (device, minute, index in minute)
    for minute in range(minutes):
        for k in range(per_minute):
            for d, dev in enumerate(names):
                if d == devices - 1 and minute >= silent_device_stops_at:
                    continue  # the silent device
                if d % 2 == 0 and k % 2 == 1:
                    continue  # even devices talk half as much: top talkers differ
                ts = T0 + minute * MINUTE + k * (MINUTE // per_minute) + d * 7
                temp = 20 + d + rng.randint(-4, 4) * 0.25
                hum = 40 + rng.randint(0, 20) * 0.5
                if (dev, minute, k) in spikes:
                    temp += 40
                body: bytes
                if minute == 2 and k == 4 and d == 2:
                    body = b"ERR sensor fault"  # not JSON
                elif minute == 5 and k == 0 and d == 0:
                    body = b"\xff\xfe{"  # not UTF-8
                elif minute == 6 and k == 2 and d == 4:
                    body = json.dumps([1, 2]).encode()  # JSON, but not an object
                else:
                    body = json.dumps({"temp": temp, "humidity": hum, "ok": True, "fw": "1.2",
                                       "seq": minute * per_minute + k}).encode()
                props = {"content-type": "application/json"} if k % 5 == 0 else {}
                items.append((rec.Message(topic=f"devices/{dev}/telemetry", body=body, qos=k % 2,
                                          client_id=dev, born_ts=ts - 3, properties=props), ts))
        # once a minute every device reports its status: JSON without numbers
        for d, dev in enumerate(names[:3]):
            ts = T0 + minute * MINUTE + 59_000 + d
            items.append((rec.Message(topic=f"devices/{dev}/status", body=b'{"state": "online"}',
                                      client_id=dev, retain=True), ts))
    if extras:  # records that are not MQTT publishes, and a $SYS topic
        items.append((rec.Message(topic="orders", body=b"native", kind=rec.RecordKind.NATIVE_MESSAGE), T0 + 5))
        items.append((rec.Message(topic="$SYS/broker/uptime", body=b"42", client_id="broker"), T0 + 6))
    items.sort(key=lambda item: item[1])
    return items


# -- through a real node ---------------------------------------------------------------------


def node_available() -> bool:
    """True when this checkout has the node role (the composition root of the MQTT proxy)."""
    return os.path.exists(os.path.join(ROOT, "cluster", "node.py"))


@dataclass
class Node:
    """A ``twistd twistmq node`` process listening for MQTT on a free loopback port."""

    data_dir: str
    segment_bytes: int | None = None
    native: bool = False  # also open a native-protocol listener on ``native_port``
    proc: subprocess.Popen | None = None
    port: int = 0
    native_port: int = 0
    output: list[str] = field(default_factory=list)

    def start(self, timeout: float = 60.0) -> "Node":
        self.port = free_port()
        args = [os.path.join(os.path.dirname(sys.executable), "twistd"), "-n", "--pidfile=", "twistmq", "node",
                "--mqtt", f"tcp:{self.port}:interface=127.0.0.1", "--http", "tcp:0:interface=127.0.0.1",
                "--data-dir", self.data_dir]
        if self.native:
            self.native_port = free_port()
            args += ["--native", f"tcp:{self.native_port}:interface=127.0.0.1"]
        if self.segment_bytes:
            conf = os.path.join(os.path.dirname(self.data_dir.rstrip("/")) or ".", "spark-node.toml")
            with open(conf, "w") as f:
                f.write(f"[store]\nsegment_size = {max(4096, self.segment_bytes)}\n")
            args += ["--config", conf]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready = threading.Event()

        def pump():  # keep draining the pipe so the node never blocks on a full one
            for line in self.proc.stdout:
                self.output.append(line)
                if "twistmq ready" in line:
                    ready.set()

        try:
            threading.Thread(target=pump, name="node-output", daemon=True).start()
            deadline = time.monotonic() + timeout
            while not ready.wait(0.1):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"node did not become ready: {''.join(self.output)[-2000:]}")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mqtt_publish(port: int, items: list[tuple[rec.Message, int]], timeout: float = 60.0) -> None:
    """Publish each MQTT message with a paho client per client id (MQTT 5), waiting for every ack."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    clients: dict[str, mqtt.Client] = {}
    connacks: dict[str, threading.Event] = {}
    try:
        for message, _ts in items:
            cid = message.client_id
            if cid not in clients:
                c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
                connacks[cid] = threading.Event()
                c.on_connect = lambda client, userdata, flags, reason, props, got=connacks[cid]: got.set()
                c.connect("127.0.0.1", port, keepalive=30)
                c.loop_start()
                clients[cid] = c
        deadline = time.monotonic() + timeout
        for cid, got in connacks.items():  # each CONNACK, waited for with what is left of the deadline
            if not got.wait(max(0.0, deadline - time.monotonic())) or not clients[cid].is_connected():
                raise TimeoutError(f"paho client {cid!r} did not connect")
        for message, _ts in items:  # one at a time, in order: the log keeps the data set's order
            props = None
            if message.properties:
                props = Properties(PacketTypes.PUBLISH)
                props.ContentType = message.properties.get("content-type", "")
            info = clients[message.client_id].publish(message.topic, message.body, qos=max(1, message.qos),
                                                      retain=message.retain, properties=props)
            info.wait_for_publish(timeout=max(0.1, deadline - time.monotonic()))
            if not info.is_published():
                raise TimeoutError(f"publish to {message.topic} was not acknowledged")
    finally:
        for c in clients.values():
            c.disconnect()
            c.loop_stop()


def publish_through_node(data_dir: str, items: list[tuple[rec.Message, int]],
                         segment_bytes: int | None = None) -> list[Published]:
    """Publish the data set's MQTT messages through a real node; return what it stored.

    Every message goes out at QoS 1 (or its own QoS if higher) so each is
    acknowledged, hence stored, before the next; the node is stopped (SIGTERM,
    clean close) and the log is read back with the store's reader. Records that
    are not MQTT publishes from our clients (the broker's own) are left out.
    """
    mqtt_items = [(m, ts) for m, ts in items if m.kind == rec.RecordKind.MQTT_PUBLISH and not m.topic.startswith("$")]
    node = Node(data_dir, segment_bytes).start()
    try:
        mqtt_publish(node.port, mqtt_items)
    finally:
        node.stop()
    wanted = Counter((m.topic, m.client_id, m.body) for m, _ in mqtt_items)
    out = []
    for r in reader.iter_records(os.path.join(data_dir, "commitlog")):
        key = (r.topic, r.client_id, r.body)
        if r.kind != rec.RecordKind.MQTT_PUBLISH or not wanted[key]:
            continue
        wanted[key] -= 1
        props = {k: v for k, v in r.properties.items() if k != rec.QUEUES_PROPERTY}
        out.append(Published(rec.Message(topic=r.topic, body=r.body, qos=r.qos, retain=r.retain,
                                         client_id=r.client_id, born_ts=r.born_ts, properties=props),
                             r.store_ts, r.offset))
    missing = +wanted
    assert not missing, f"the node did not store {sum(missing.values())} published messages"
    return out
