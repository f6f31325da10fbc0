"""Node CPU of the session-state paths, old code against new: QoS 2 inbound and a subscribe storm.

    ./dev python -m bench.session_bench --base 24d8f07 --reps 3

- qos2: one persistent-session client publishes ``--qos2`` QoS 2 messages with
  ``--window`` in flight (PUBLISH, PUBREC, PUBREL, PUBCOMP): every message stores
  and deletes an inbound packet id (session state), beside the message itself;
- subscribe-storm: ``--clients`` persistent-session clients connect and each
  subscribes ``--filters`` filters, one SUBSCRIBE each, waiting for its SUBACK.

Each run starts a fresh node (bench/stall_node.py from the side's tree, empty
config, pinned to CPU 0, the load here on CPU 1 when taskset exists) and reads
its CPU time (/proc) right before and after the load: CPU-µs per QoS 2 message
or per SUBSCRIBE, and the load's wall time. Sides alternate per repetition; the
table shows medians.
"""

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import REPO, free_port
from bench.loadgen import cpu_seconds
from bench.stall_bench import extract, start_node, stop_node
from mqtt_proxy.codec import (MQTTParser, Connect, Properties, Publish, PubComp, PubRec, PubRel, SubAck, Subscribe,
                              Subscription, SubscriptionOptions, encode)

PERSIST = Properties(session_expiry_interval=3600)


class Client:
    """A blocking MQTT 5 client over one socket (the load is simple and sequential per client)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.parser = MQTTParser(server_side=False, protocol_level=5)
        self.inbox: list = []

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, 5))

    def recv(self):
        while not self.inbox:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the node")
            self.inbox.extend(self.parser.feed(data))
        return self.inbox.pop(0)

    def close(self) -> None:
        self.sock.close()


def qos2(port: int, n: int, window: int) -> int:
    c = Client(port)
    c.send(Connect(client_id="bench-qos2", protocol_level=5, clean_start=False, properties=PERSIST))
    c.recv()
    sent = done = 0
    while done < n:
        while sent < n and sent - done < window:
            c.send(Publish("bench/q2", b"x" * 64, qos=2, packet_id=sent % 60000 + 1))
            sent += 1
        p = c.recv()
        if isinstance(p, PubRec):
            c.send(PubRel(p.packet_id))
        elif isinstance(p, PubComp):
            done += 1
    c.close()
    return done


def subscribe_storm(port: int, clients: int, filters: int) -> int:
    count = 0
    for i in range(clients):
        c = Client(port)
        c.send(Connect(client_id=f"bench-sub-{i}", protocol_level=5, clean_start=False, properties=PERSIST))
        c.recv()
        for j in range(filters):
            c.send(Subscribe(j + 1, (Subscription(f"storm/{i}/{j}/+", SubscriptionOptions(qos=1)),)))
            while not isinstance(c.recv(), SubAck):
                pass
            count += 1
        c.close()
    return count


def run_once(label, repo, scenario, args, workdir):
    port = free_port()
    node = start_node(label, repo, workdir, ["--mqtt", f"tcp:{port}:interface=127.0.0.1"],
                      samples=workdir / "lag.json", probe_ms=1000.0, node_cpu=args.node_cpu, config="")
    try:
        cpu0, t0 = cpu_seconds(node.pid), time.monotonic()
        ops = qos2(port, args.qos2, args.window) if scenario == "qos2" else \
            subscribe_storm(port, args.clients, args.filters)
        wall = time.monotonic() - t0
        cpu = cpu_seconds(node.pid) - cpu0
    finally:
        stop_node(node)
    return {"label": label, "scenario": scenario, "ops": ops, "us_per_op": 1e6 * cpu / ops, "wall_s": wall}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git ref measured as 'old'")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--qos2", type=int, default=20_000, help="QoS 2 messages per run (default 20000)")
    parser.add_argument("--window", type=int, default=20, help="QoS 2 messages in flight (default 20)")
    parser.add_argument("--clients", type=int, default=200, help="subscribe-storm clients (default 200)")
    parser.add_argument("--filters", type=int, default=20, help="SUBSCRIBEs per client (default 20)")
    parser.add_argument("--node-cpu", type=int, default=0)
    parser.add_argument("--gen-cpu", type=int, default=1)
    args = parser.parse_args(argv)
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {args.gen_cpu})
    tmp = Path(tempfile.mkdtemp(prefix="twistmq-session-bench-"))
    try:
        old = tmp / "old-src"
        try:
            revs = {"old": extract(args.base, old)}
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"session_bench: cannot extract --base {args.base!r}: {e}")
        revs["new"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip()
        sides = [("old", old), ("new", REPO)]
        results = []
        for rep in range(args.reps):
            for scenario in ("qos2", "subscribe-storm"):
                for label, repo in (sides if rep % 2 == 0 else sides[::-1]):
                    r = run_once(label, repo, scenario, args, tmp / f"{label}-{scenario}-{rep}")
                    print(f"rep {rep + 1} {scenario} {label}: {r['us_per_op']:.1f} CPU-µs/op over {r['ops']:,} "
                          f"in {r['wall_s']:.1f} s", file=sys.stderr, flush=True)
                    results.append(r)
        print(f"| scenario | old ({revs['old']}) CPU-µs/op | new ({revs['new']}) CPU-µs/op | new/old "
              f"| old wall s | new wall s |\n| --- | --- | --- | --- | --- | --- |")
        for scenario in ("qos2", "subscribe-storm"):
            med = {side: statistics.median(r["us_per_op"] for r in results
                                           if r["scenario"] == scenario and r["label"] == side) for side, _ in sides}
            wall = {side: statistics.median(r["wall_s"] for r in results
                                            if r["scenario"] == scenario and r["label"] == side) for side, _ in sides}
            print(f"| {scenario} | {med['old']:.1f} | {med['new']:.1f} | {med['new'] / med['old']:.3f} "
                  f"| {wall['old']:.1f} | {wall['new']:.1f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
