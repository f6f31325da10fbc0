"""A device-telemetry simulator that publishes through a running node over MQTT.

``python -m spark.simulator --host 127.0.0.1 --port 1883 --devices 10 --duration 120``

Each simulated device is its own MQTT client (client id = device id) and
publishes JSON telemetry to ``devices/<id>/telemetry`` every ``--interval``
seconds: a temperature that follows a slow daily curve plus noise, humidity
that drifts, and a battery that drains. Now and then a reading spikes (an
anomaly for the jobs to find) or a sensor sends a non-JSON error line; with
``--silent K`` the last K devices go quiet half-way through. Every device
also publishes a retained ``online`` status and leaves an ``offline`` will.
The readings come from a seeded generator, so a run can be repeated.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field


@dataclass
class DeviceModel:
    """The sensor state of one device; ``reading`` gives its next payload (pure, no I/O)."""

    device_id: str
    rng: random.Random
    anomaly_rate: float = 0.01
    bad_rate: float = 0.005
    base_temp: float = 21.0
    humidity: float = 45.0
    battery: float = 100.0
    seq: int = 0
    counts: dict = field(default_factory=lambda: {"readings": 0, "spikes": 0, "bad": 0})

    def reading(self, now: float) -> bytes:
        """The next payload at wall-clock time ``now`` (seconds)."""
        self.seq += 1
        self.counts["readings"] += 1
        if self.rng.random() < self.bad_rate:
            self.counts["bad"] += 1
            return f"ERR sensor timeout seq={self.seq}".encode()
        day = math.sin(2 * math.pi * ((now / 86400.0) % 1.0 - 0.25))  # coolest at dawn
        temp = self.base_temp + 3.0 * day + self.rng.gauss(0, 0.3)
        if self.rng.random() < self.anomaly_rate:
            self.counts["spikes"] += 1
            temp += self.rng.choice((-1, 1)) * self.rng.uniform(15, 30)
        self.humidity = min(95.0, max(15.0, self.humidity + self.rng.gauss(0, 0.5)))
        self.battery = max(0.0, self.battery - self.rng.uniform(0.0, 0.02))
        return json.dumps({
            "temp": round(temp, 2), "humidity": round(self.humidity, 1),
            "battery": round(self.battery, 2), "seq": self.seq,
        }).encode()


def make_devices(count: int, seed: int, anomaly_rate: float, bad_rate: float, prefix: str = "sim") -> list[DeviceModel]:
    """``count`` devices with their own seeded generators and base temperatures."""
    rng = random.Random(seed)
    return [DeviceModel(f"{prefix}-{i:03d}", random.Random(rng.random()), anomaly_rate, bad_rate,
                        base_temp=round(rng.uniform(17, 26), 1), humidity=round(rng.uniform(30, 60), 1))
            for i in range(count)]


def _client(device_id: str, args):
    import paho.mqtt.client as mqtt

    version = mqtt.MQTTv5 if args.mqtt_version == "5" else mqtt.MQTTv311
    kw = {"clean_start": True} if version == mqtt.MQTTv5 else {}
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device_id, protocol=version)
    status = f"{args.topic_prefix}/{device_id}/status"
    client.will_set(status, b'{"state": "offline"}', qos=1, retain=True)
    client.connect(args.host, args.port, keepalive=30, **kw)
    client.loop_start()
    return client


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Publish simulated device telemetry to an MQTT broker.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--devices", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between readings of one device (0: flat out)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to run (ignored with --count)")
    p.add_argument("--count", type=int, default=None, help="readings per device, then stop")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--topic-prefix", default="devices")
    p.add_argument("--device-prefix", default="sim")
    p.add_argument("--anomaly-rate", type=float, default=0.01, help="share of readings that spike")
    p.add_argument("--bad-rate", type=float, default=0.005, help="share of readings that are not JSON")
    p.add_argument("--silent", type=int, default=1, help="devices that stop half-way through")
    p.add_argument("--mqtt-version", choices=("3.1.1", "5"), default="5")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Run the simulation; returns what was published per device."""
    args = parse_args(argv)
    devices = make_devices(args.devices, args.seed, args.anomaly_rate, args.bad_rate, args.device_prefix)
    try:
        clients = {d.device_id: _client(d.device_id, args) for d in devices}
    except OSError as exc:
        raise SystemExit(f"simulator: cannot connect to {args.host}:{args.port}: {exc}") from None
    for device_id, client in clients.items():
        client.publish(f"{args.topic_prefix}/{device_id}/status", b'{"state": "online"}', qos=1, retain=True)
    quiet_from = len(devices) - max(0, min(args.silent, len(devices)))
    started = time.monotonic()
    total_rounds = args.count if args.count is not None else max(1, int(args.duration / max(args.interval, 1e-9)))
    if args.count is None and args.interval == 0:
        total_rounds = None  # flat out until --duration
    published = {d.device_id: 0 for d in devices}
    pending = []
    last_report = started
    rnd = 0
    try:
        while total_rounds is None or rnd < total_rounds:
            if total_rounds is None and time.monotonic() - started >= args.duration:
                break
            for i, device in enumerate(devices):
                if i >= quiet_from and total_rounds is not None and rnd >= total_rounds // 2:
                    continue
                payload = device.reading(time.time())
                info = clients[device.device_id].publish(
                    f"{args.topic_prefix}/{device.device_id}/telemetry", payload, qos=args.qos)
                pending.append(info)
                published[device.device_id] += 1
            rnd += 1
            if len(pending) > 1000:
                for info in pending:
                    info.wait_for_publish(timeout=10)
                pending.clear()
            now = time.monotonic()
            if not args.quiet and now - last_report >= 5:
                last_report = now
                print(f"simulator: {sum(published.values()):,} readings from {len(devices)} devices "
                      f"in {now - started:.0f}s", file=sys.stderr, flush=True)
            if args.interval > 0:
                delay = started + rnd * args.interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        for info in pending:
            info.wait_for_publish(timeout=10)
    finally:
        for device_id, client in clients.items():
            client.publish(f"{args.topic_prefix}/{device_id}/status", b'{"state": "offline"}',
                           qos=1, retain=True).wait_for_publish(timeout=5)
            client.disconnect()
            client.loop_stop()
    summary = {
        "published": published,
        "spikes": {d.device_id: d.counts["spikes"] for d in devices},
        "bad": {d.device_id: d.counts["bad"] for d in devices},
    }
    if not args.quiet:
        print(f"simulator: done, {sum(published.values()):,} readings, "
              f"{sum(summary['spikes'].values())} spikes, {sum(summary['bad'].values())} bad payloads",
              file=sys.stderr, flush=True)
    return summary


if __name__ == "__main__":
    main()
