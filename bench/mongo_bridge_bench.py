"""MongoDB bridge benchmark: documents per second a bridge inserts, against the test's wire-protocol server.

Run: ``.venv/bin/python -m bench.mongo_bridge_bench [--messages 50000] [--batch-size 500] [--payload auto]``.

Starts ``secantusd-py`` (SecantusDB, the tests' MongoDB stand-in) and a node
(``twistd -n twistmq node``) with one ``[[bridge.mongodb]]`` on ``bench/#``,
both on 127.0.0.1. Two figures:

- **catch-up**: the database is stopped, N QoS 1 messages are published (a
  window of in-flight PUBLISHes, so the publisher is not what is timed), then
  the database comes back and the bridge's backlog is timed from its first
  document to its last: the bridge alone, reading its light queue from the
  store as fast as it can insert;
- **live**: the same N published with the database up, timed from the first
  publish until the last document is in (publisher, broker and bridge at once).

Prints a markdown table. Figures are from this run on this machine; the
bridge's own CPU (the node's, the publisher idle) and the server's CPU per
document show which side limits it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request

import paho.mqtt.client as mqtt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.integration.node import NodeProcess  # noqa: E402
from tests.mongo_server import MongoServer  # noqa: E402

WINDOW = 200  # QoS 1 PUBLISHes in flight


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _publish(port: int, n: int, size: int, start_seq: int = 0) -> float:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"bench-{start_seq}", clean_session=True)
    c.max_inflight_messages_set(WINDOW)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    pad = "x" * max(0, size - 40)
    t0 = time.monotonic()
    infos = []
    for i in range(start_seq, start_seq + n):
        infos.append(c.publish(f"bench/{i % 64}", json.dumps({"seq": i, "v": i % 100, "pad": pad}), qos=1))
        if len(infos) >= WINDOW * 4:
            infos.pop(0).wait_for_publish(30)
    for info in infos:
        info.wait_for_publish(30)
    elapsed = time.monotonic() - t0
    c.disconnect()
    c.loop_stop()
    return elapsed


def _bridge(node) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/api/v1/bridges", timeout=5) as r:
        return json.loads(r.read())["items"][0]


def _wait_count(coll, n: int, timeout: float = 600) -> tuple[float, float]:
    """(time the first document appeared, time the count reached n)."""
    first = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = coll.estimated_document_count()
        now = time.monotonic()
        if count and first is None:
            first = now
        if count >= n:
            return first, now
        time.sleep(0.05)
    raise SystemExit(f"the bridge did not insert {n} documents within {timeout} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--payload", choices=("auto", "json", "bytes"), default="auto")
    p.add_argument("--size", type=int, default=100, help="payload bytes (a JSON object)")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="twistmq-bridge-bench-")
    server = MongoServer(os.path.join(root, "db")).start()
    cfg = os.path.join(root, "twistmq.toml")
    with open(cfg, "w") as f:
        f.write(f'[mongodb]\nuri = "{server.uri}"\ndatabase = "bench"\ntimeout = 2.0\n\n'
                f'[[bridge.mongodb]]\nname = "bench"\nfilter = "bench/#"\ncollection = "bench"\n'
                f'payload = "{args.payload}"\nbatch_size = {args.batch_size}\nretry_max = 0.5\n')
    node = NodeProcess(os.path.join(root, "node"), extra_args=["--config", cfg]).start()
    rows = []
    try:
        n = args.messages
        server.kill()
        _publish(node.port(), n, args.size)
        node_cpu, db_cpu = _cpu_seconds(node.proc.pid), None
        server.start()
        db_cpu = _cpu_seconds(server.proc.pid)
        client = server.client()
        coll = client["bench"]["bench"]
        first, last = _wait_count(coll, n)
        node_cpu = _cpu_seconds(node.proc.pid) - node_cpu
        db_cpu = _cpu_seconds(server.proc.pid) - db_cpu
        rows.append(("catch-up", n, last - first, node_cpu, db_cpu))
        coll.drop()
        while _bridge(node)["lag"]:
            time.sleep(0.1)
        node_cpu, db_cpu = _cpu_seconds(node.proc.pid), _cpu_seconds(server.proc.pid)
        t0 = time.monotonic()
        _publish(node.port(), n, args.size, start_seq=n)
        _, last = _wait_count(coll, n)
        rows.append(("live", n, last - t0, _cpu_seconds(node.proc.pid) - node_cpu,
                     _cpu_seconds(server.proc.pid) - db_cpu))
        client.close()
        print(f"\nMongoDB bridge, {args.payload} payloads of ~{args.size} B, batch_size {args.batch_size}, "
              f"secantusd-py on 127.0.0.1 ({os.cpu_count()} cores)\n")
        print("| run | documents | seconds | documents/s | node CPU s | server CPU s | server CPU µs/doc |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, count, secs, ncpu, dcpu in rows:
            print(f"| {name} | {count:,} | {secs:.2f} | {count / secs:,.0f} | {ncpu:.2f} | {dcpu:.2f} | "
                  f"{dcpu / count * 1e6:.0f} |")
    finally:
        node.stop()
        server.remove()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
