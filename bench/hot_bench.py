"""CPU cost of each step of the fan-in hot path under the MQTT session layer, in one process.

    ./dev python -m bench.hot_bench [--messages 200000] [--reps 5] [--profile STEP]

Measures, in CPU µs per message (``time.process_time``, the best of ``--reps``,
so a busy machine disturbs it less than wall-clock figures): the MQTT codec
decoding PUBLISH (QoS 0 and 1) and PUBACK packets as one ``feed`` each read
would bring them, ``encode_publish`` of a delivery, and the store's put path
(``submit``: resolve the target queues, encode the record, one write per tick,
index the light-queue entries) driven by a ``task.Clock`` in ticks of 500
messages (what one busy reactor tick holds), alone and with a live subscriber
that reads its light queue to the end after every tick in batches of 32 (the
difference is the live read); then a reader that catches up on a second filter's
queue from the commit log (entries from RocksDB, records read and decoded).
Four publishers publish to ``dev/pN/temp``; the filters ``dev/+/temp`` (read
live) and ``dev/#`` (read afterwards) are subscribed. ``--profile STEP`` prints
the cProfile of one step instead (``decode``, ``put``, ``live``, ``read``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time

from twisted.internet import task

import lightqueue
from mqtt_proxy.codec import MQTT_3_1_1, Connect, MQTTParser, PubAck, encode, encode_publish
from store import record as rec
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore

TICK = 500       # messages per reactor tick in the put step
READ_BATCH = 32  # messages per store.get, as a session's pump reads


def best(fn, reps):
    """The lowest CPU seconds of ``reps`` calls of ``fn()``."""
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def publish_stream(n, qos):
    """``n`` PUBLISHes from four publishers, 16-byte payloads, as one byte string per 64 KiB read."""
    packets = [encode_publish(f"dev/p{i % 4}/temp", bytes(16), qos, packet_id=(i % 65535) + 1 if qos else None)
               for i in range(n)]
    return chunks(packets)


def chunks(packets, size=65536):
    out, cur, length = [], [], 0
    for p in packets:
        cur.append(p)
        length += len(p)
        if length >= size:
            out.append(b"".join(cur))
            cur, length = [], 0
    if cur:
        out.append(b"".join(cur))
    return out


def decode_step(reads):
    def run():
        parser = MQTTParser(server_side=True)
        parser.feed(encode(Connect(client_id="bench", keep_alive=60), MQTT_3_1_1))
        for data in reads:
            parser.feed(data)
    return run


def encode_step(n):
    topic = b"dev/p0/temp"
    payload = bytes(16)

    def run():
        for i in range(n):
            encode_publish(topic, payload, 1, packet_id=(i % 65535) + 1)
    return run


class StoreSteps:
    """A store with one subscribed filter, on a task.Clock and a synchronous executor."""

    def __init__(self, root, n):
        self.root, self.n = root, n
        self.k = 0
        self.messages = [rec.Message(f"dev/p{i % 4}/temp", bytes(16), rec.RecordKind.MQTT_PUBLISH, 1, False,
                                     f"pub{i % 4}", 0, {}) for i in range(n)]

    def open(self):
        self.k += 1
        self.clock = task.Clock()
        self.clock.advance(1_700_000_000)
        self.path = os.path.join(self.root, f"s{self.k}")
        self.store = MessageStore(self.path, StoreConfig(segment_size=256 << 20), self.clock,
                                  SynchronousExecutor())
        lightqueue.attach(self.store)
        self.store.open()
        self.queue = self.store.queue_index.add_filter("dev/+/temp")
        self.cold = self.store.queue_index.add_filter("dev/#")
        self.acked = 0

    def close(self):
        self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def _acked(self, _result):
        self.acked += 1

    def put(self):
        submit, advance, acked = self.store.submit, self.clock.advance, self._acked
        msgs = self.messages
        for i in range(0, len(msgs), TICK):
            for m in msgs[i:i + TICK]:
                submit(m, acked)
            advance(0)
        assert self.acked == len(msgs), (self.acked, len(msgs))

    def put_live(self):
        submit, advance, acked = self.store.submit, self.clock.advance, self._acked
        get, queue, off, got = self.store._get, self.queue, 0, 0
        msgs = self.messages
        for i in range(0, len(msgs), TICK):
            for m in msgs[i:i + TICK]:
                submit(m, acked)
            advance(0)
            while True:
                batch = get(queue, off, READ_BATCH)
                if not batch:
                    break
                got += len(batch)
                off = batch[-1].queue_offset + 1
        assert got == self.n and self.acked == len(msgs), (got, self.acked, self.n)

    def read(self):
        get, queue, off, got = self.store._get, self.cold, 0, 0
        while True:
            batch = get(queue, off, READ_BATCH)
            if not batch:
                break
            got += len(batch)
            off = batch[-1].queue_offset + 1
        assert got == self.n, (got, self.n)

    def forget_tail(self):
        self.store._recent.clear()
        self.store._recent_order.clear()
        self.store._recent_bytes = 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", choices=["decode", "put", "live", "read"])
    args = parser.parse_args(argv)
    n = args.messages
    root = tempfile.mkdtemp(prefix="twistmq-hot-bench-")
    rows = []
    try:
        q0, q1 = publish_stream(n, 0), publish_stream(n, 1)
        acks = chunks([encode(PubAck(packet_id=(i % 65535) + 1), MQTT_3_1_1) for i in range(n)])
        steps = StoreSteps(root, n)
        if args.profile:
            prof = cProfile.Profile()
            if args.profile == "decode":
                prof.runcall(decode_step(q1))
            else:
                steps.open()
                if args.profile == "read":
                    steps.put()
                    steps.forget_tail()
                prof.runcall({"put": steps.put, "live": steps.put_live, "read": steps.read}[args.profile])
                steps.close()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return 0
        rows.append(("decode PUBLISH QoS 0 (server side, 64 KiB reads)", best(decode_step(q0), args.reps)))
        rows.append(("decode PUBLISH QoS 1", best(decode_step(q1), args.reps)))
        rows.append(("decode PUBACK", best(decode_step(acks), args.reps)))
        rows.append(("encode_publish QoS 1 (one delivery)", best(encode_step(n), args.reps)))
        puts, live, disk = [], [], []
        for _ in range(args.reps):
            steps.open()
            puts.append(best(steps.put, 1))
            steps.forget_tail()
            disk.append(best(steps.read, 1))
            steps.close()
            steps.open()
            live.append(best(steps.put_live, 1))
            steps.close()
        rows.append((f"store put: resolve + record encode + append + index, 2 filters ({TICK} per tick)",
                     min(puts)))
        rows.append(("store put and a live subscriber's reads after every tick", min(live)))
        rows.append(("... the live reads alone (the difference)", min(live) - min(puts)))
        rows.append((f"store get from the commit log, catching up ({READ_BATCH} per read)", min(disk)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"| step ({n:,} messages, best of {args.reps}) | CPU µs/msg | msg/s per core |")
    print("| --- | --- | --- |")
    for what, seconds in rows:
        print(f"| {what} | {seconds / n * 1e6:.2f} | {n / seconds:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
