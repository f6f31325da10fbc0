"""Store benchmark: appends, dispatch fan-out, light-queue reads, and a million light queues.

Run: ``.venv/bin/python bench/store_bench.py`` (quick, under 5 minutes) or with
``--full`` for the big sizes. Prints a markdown table. Every figure is measured
in this run on this machine; compare ratios, not absolutes, on shared hardware.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from twisted.internet import defer, reactor, task  # noqa: E402

import lightqueue  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from store.executor import ThreadPoolExecutor  # noqa: E402
from store.message_store import MessageStore  # noqa: E402
from store.record import Message  # noqa: E402

ROWS: list[tuple[str, str, str]] = []


def row(what: str, value: str, note: str = "") -> None:
    ROWS.append((what, value, note))
    print(f"  {what}: {value} {note}", file=sys.stderr, flush=True)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Bench:
    def __init__(self, root: str):
        self.root = root
        self.n = 0

    def open(self, **cfg):
        self.n += 1
        path = os.path.join(self.root, f"s{self.n}")
        executor = ThreadPoolExecutor(reactor)
        executor.start()
        store = MessageStore(path, StoreConfig(segment_size=256 << 20, **cfg), reactor, executor)
        index = lightqueue.attach(store)
        store.open()
        return store, index, executor, path

    async def close(self, store, executor, path):
        await store.close()
        executor.stop()
        shutil.rmtree(path, ignore_errors=True)


async def drive(store, messages, window: int, seconds: float) -> tuple[int, float]:
    """Keep ``window`` puts in flight until all are acked or time is up; return (acked, elapsed)."""
    done = 0
    it = iter(messages)
    finished = defer.Deferred()
    start = time.perf_counter()
    deadline = start + seconds
    inflight = 0
    exhausted = False

    def acked(_result):
        nonlocal done, inflight
        done += 1
        inflight -= 1
        if not finished.called:
            if time.perf_counter() > deadline or (exhausted and inflight == 0):
                finished.callback(None)
            else:
                refill()

    def refill():
        nonlocal inflight, exhausted
        while inflight < window and not exhausted:
            m = next(it, None)
            if m is None:
                exhausted = True
                break
            inflight += 1
            store.put(m).addCallback(acked)
        if exhausted and inflight == 0 and not finished.called:
            finished.callback(None)

    refill()
    await finished
    return done, time.perf_counter() - start


async def bench_appends(b: Bench, count: int) -> None:
    for flush in ("async", "sync"):
        for size in (100, 1024):
            store, index, ex, path = b.open(flush=flush)
            body = bytes(size)
            n = count if flush == "async" else max(count // 5, 2000)
            msgs = (Message(topic="bench/x", body=body) for _ in range(n))
            done, dt = await drive(store, msgs, window=2000 if flush == "async" else 500, seconds=60)
            rate = done / dt
            extra = f"fsyncs={store.flush_policy.fsyncs}" if flush == "sync" else ""
            row(f"append {size} B, {flush} flush", f"{rate:,.0f} msg/s", f"{rate * size / 1e6:.1f} MB/s body {extra}")
            await b.close(store, ex, path)


def bench_submit_in_process(root: str, count: int) -> None:
    """The same put path without the reactor and without a Deferred per message: ``store.submit``
    driven by a task.Clock in batches of 2,000, to show what the Twisted plumbing costs."""
    from store.executor import SynchronousExecutor

    clock = task.Clock()
    path = os.path.join(root, "in-process")
    store = MessageStore(path, StoreConfig(segment_size=256 << 20), clock, SynchronousExecutor())
    lightqueue.attach(store)
    store.open()
    body = bytes(100)
    done = [0]

    def acked(_result):
        done[0] += 1

    start = time.perf_counter()
    for _ in range(count // 2000):
        for _ in range(2000):
            store.submit(Message(topic="bench/x", body=body), acked)
        clock.advance(0)
    dt = time.perf_counter() - start
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    row("append 100 B, async flush, in-process submit", f"{done[0] / dt:,.0f} msg/s", "no reactor, no Deferreds")


def matching_filters(topic: str, k: int) -> list[str]:
    """``k`` distinct filters that all match ``topic``: each level literal or '+'."""
    levels = topic.split("/")
    out = []
    for mask in range(1 << len(levels)):
        out.append("/".join("+" if mask >> i & 1 else lv for i, lv in enumerate(levels)))
        if len(out) == k:
            return out
    raise ValueError(f"{topic} has fewer than {k} matching filters of this form")


async def bench_dispatch(b: Bench, count: int) -> None:
    topic = "d/a/b/c/e/f/g"
    for fanout in (1, 10, 100):
        store, index, ex, path = b.open()
        for f in matching_filters(topic, fanout):
            store.add_filter(f)
        matched = len(index.trie.match(topic))
        n = max(2000, count * 4 // (matched + 3))
        msgs = (Message(topic=topic, body=bytes(100)) for _ in range(n))
        done, dt = await drive(store, msgs, window=2000, seconds=60)
        row(f"dispatch, {matched} matching filters", f"{done / dt:,.0f} msg/s",
            f"{done * (matched + 1) / dt:,.0f} queue entries/s")
        await b.close(store, ex, path)


async def bench_read(b: Bench, count: int) -> None:
    store, index, ex, path = b.open()
    store.add_filter("r/+")
    msgs = (Message(topic="r/1", body=bytes(100)) for _ in range(count))
    await drive(store, msgs, window=2000, seconds=60)
    queue = lightqueue.lmq_name("r/+")
    start = time.perf_counter()
    off = got = 0
    while True:
        batch = await store.get(queue, off, 32)
        if not batch:
            break
        got += len(batch)
        off = batch[-1].queue_offset + 1
    dt = time.perf_counter() - start
    row("read from a light queue (batches of 32)", f"{got / dt:,.0f} msg/s")
    await b.close(store, ex, path)


async def bench_queues(b: Bench, nqueues: int, per_entry_msgs: int) -> None:
    costs = {}
    for n in sorted({1000, nqueues}):
        store, index, ex, path = b.open()
        gc.collect()
        before = rss_mb()
        start = time.perf_counter()
        for i in range(n):
            store.add_filter(f"q/{i}")
        dt = time.perf_counter() - start
        mem = rss_mb() - before
        row(f"create {n:,} light queues", f"{dt:.2f} s", f"{mem:.0f} MB RSS ({mem * 1e6 / n:.0f} B/queue)")
        rng = __import__("random").Random(1)
        msgs = (Message(topic=f"q/{rng.randrange(n)}", body=bytes(100)) for _ in range(per_entry_msgs))
        done, dt = await drive(store, msgs, window=2000, seconds=60)
        costs[n] = dt / done
        row(f"dispatch to 1 of {n:,} queues", f"{done / dt:,.0f} msg/s", f"{dt / done * 1e6:.1f} µs/msg")
        await b.close(store, ex, path)
    if len(costs) == 2:
        lo, hi = costs[1000], costs[max(costs)]
        row(f"per-entry cost at {max(costs):,} vs 1,000 queues", f"{hi / lo:.2f}x", "(target <= 1.5x)")


async def main(full: bool) -> None:
    root = tempfile.mkdtemp(prefix="twistmq-store-bench-")
    b = Bench(root)
    try:
        scale = 5 if full else 1
        await bench_appends(b, 100_000 * scale)
        bench_submit_in_process(root, 100_000 * scale)
        await bench_dispatch(b, 50_000 * scale)
        await bench_read(b, 50_000 * scale)
        await bench_queues(b, 1_000_000 if full else 100_000, 50_000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n## store bench ({'full' if full else 'quick'}), {time.strftime('%Y-%m-%d')}, "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    print("| figure | value | note |\n| --- | --- | --- |")
    for what, value, note in ROWS:
        print(f"| {what} | {value} | {note} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="big sizes: 1,000,000 queues, 500k appends")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))
    task.react(lambda _r: defer.ensureDeferred(main(args.full)))
