"""Retention benchmark: what one retention run costs on a store with many light queues.

Run: ``.venv/bin/python -m bench.retention_bench [--queues 100000]``. Builds a
store with one light queue per filter (``r/<i>/#``), one message per queue
spread over many segments, and one owed position per queue (as 100,000 offline
sessions would hold), then times on one core:

- a run that deletes nothing (everything owed): the owed-floor computation;
- a run after every owner caught up, deleting every closed segment: the floor,
  the deletion and moving each queue's minimum past it;
- a disk-quota run that drops owed messages and reports them per queue.

Prints a markdown table. Figures are from this run on this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from twisted.internet import task

import lightqueue
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore
from store.record import Message
from store.api import Owed

RETENTION_S = 60.0


class TurnClock(task.Clock):
    """A task.Clock whose ``advance`` runs only what was due when it was called: one reactor turn."""

    def advance(self, amount: float) -> None:
        self.rightNow += amount
        due = sorted((c for c in self.calls if c.getTime() <= self.rightNow), key=lambda c: c.getTime())
        for call in due:
            self.calls.remove(call)
            call.called = 1
            call.func(*call.args, **call.kw)


class Owners:
    """Owed positions of ``n`` offline subscribers, one per queue (what sessions would report)."""

    def __init__(self, queues: list[str]) -> None:
        self.positions = {q: 0 for q in queues}

    def __call__(self):
        return [Owed("session s" + q[8:], q, off) for q, off in self.positions.items()]


def build(path: str, n: int, segment_size: int, **cfg):
    clock = TurnClock()
    clock.advance(time.time())
    store = MessageStore(path, StoreConfig(segment_size=segment_size, retention_hours=RETENTION_S / 3600,
                                           retention_check_s=1e9, index_flush_s=1e9, disk_max_used_ratio=1.0,
                                           **cfg), clock, SynchronousExecutor())
    index = lightqueue.attach(store)
    store.open()
    queues = [store.add_filter(f"r/{i}/#").result for i in range(n)]
    batch = 2000
    for start in range(0, n, batch):
        for i in range(start, min(n, start + batch)):
            store.put(Message(f"r/{i}/x", b"p" * 64, qos=1))
        for _ in range(3):
            clock.advance(0)
    owners = Owners(queues)
    store.retention.add_holder(owners)
    return store, index, clock, owners


def timed_run(store, clock) -> tuple[float, object]:
    clock.advance(RETENTION_S + 1)
    out = []
    turns = []  # CPU time of each reactor turn the run takes (the planning yields every few thousand queues)
    t0 = time.process_time()
    store.apply_retention().addCallback(out.append)
    turns.append(time.process_time() - t0)
    while not out:
        t = time.process_time()
        clock.advance(0)
        turns.append(time.process_time() - t)
    return time.process_time() - t0, max(turns), out[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    args = parser.parse_args()
    n = args.queues
    root = tempfile.mkdtemp(prefix="twistmq-retention-")
    rows = []
    try:
        t0 = time.perf_counter()
        store, index, clock, owners = build(os.path.join(root, "a"), n, segment_size=64 << 10)
        segments = len(store.commit_log.segments())
        print(f"built {n} queues, {segments} segments in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        cpu, turn, report = timed_run(store, clock)
        assert not report.deleted
        rows.append(("everything owed: nothing deleted", f"{cpu * 1000:.0f} ms", f"{turn * 1000:.0f} ms",
                     f"{n:,} owed positions"))
        for q in owners.positions:
            owners.positions[q] = 1  # every subscriber caught up
        cpu, turn, report = timed_run(store, clock)
        rows.append(("caught up: every closed segment deleted", f"{cpu * 1000:.0f} ms", f"{turn * 1000:.0f} ms",
                     f"{len(report.deleted)} segments, {n:,} queue minimums moved"))
        store.close()

        store, index, clock, owners = build(os.path.join(root, "b"), n, segment_size=64 << 10, disk_quota_mb=1)
        cpu, turn, report = timed_run(store, clock)
        rows.append(("disk quota: owed messages dropped and reported", f"{cpu * 1000:.0f} ms", f"{turn * 1000:.0f} ms",
                     f"{len(report.deleted)} segments, {len(report.dropped):,} queues reported"))
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nRetention run cost, {n:,} light queues, one core (CPU time of one run):\n")
    print("| run | CPU time | longest reactor turn | what it did |")
    print("| --- | --- | --- | --- |")
    for what, value, turn, note in rows:
        print(f"| {what} | {value} | {turn} | {note} |")


if __name__ == "__main__":
    main()
