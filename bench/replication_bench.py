"""Replication cost at the store: a master and a slave store in one process over loopback TCP.

Run: ``./dev python -m bench.replication_bench [--messages N] [--size BYTES]``. Puts N messages
(one light queue matching them all) on the master, once with no slave and once with a slave
connected, and prints for each: the time until every message is on the slave and the confirm
offset covers it, the process's CPU per message (master and slave share this process and its
one reactor thread, so the replicated row is the cost of both ends), and the RSS growth. The
machine is shared: compare the two rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

from twisted.internet import defer, endpoints, reactor, task

import lightqueue
from cluster.replication.master import HAMaster
from cluster.replication.settings import HASettings
from cluster.replication.slave import HASlave
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore
from store.record import Message


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1])
    return 0


def _store(path: str) -> MessageStore:
    s = MessageStore(path, StoreConfig(segment_size=256 << 20), reactor, SynchronousExecutor())
    lightqueue.attach(s)
    s.open()
    return s


async def run_once(messages: int, size: int, replicated: bool) -> dict:
    tmp = tempfile.mkdtemp(prefix="repl-bench-")
    master_store, slave_store = _store(os.path.join(tmp, "m")), _store(os.path.join(tmp, "s"))
    master_store.add_filter("dev/#")
    settings = HASettings(secret="bench")
    master = slave = port = None
    try:
        if replicated:
            master = HAMaster(master_store, "b1", settings, reactor)
            master.begin_epoch(1)
            master.startService()
            port = await endpoints.serverFromString(reactor, "tcp:0:interface=127.0.0.1").listen(master.factory)
            slave = HASlave(slave_store, "b2", endpoints.clientFromString(
                reactor, f"tcp:127.0.0.1:{port.getHost().port}"), "bench", settings, reactor)
            slave.startService()
            for _ in range(200):
                if master.sync.members == {"b1", "b2"}:
                    break
                await task.deferLater(reactor, 0.05, lambda: None)
        rss0, cpu0, t0 = _rss_kib(), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        body = b"x" * size
        for i in range(0, messages, 500):
            await defer.gatherResults([master_store.put(Message(topic=f"dev/{j % 50}", body=body))
                                       for j in range(i, min(messages, i + 500))])
        end = master_store.commit_log.max_offset
        while replicated and (slave_store.commit_log.max_offset < end or master.confirm_offset < end):
            await task.deferLater(reactor, 0.001, lambda: None)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
        return {"replicated": replicated, "messages": messages, "bytes": end, "seconds": wall,
                "cpu_us_per_msg": cpu / messages * 1e6, "mb_per_s": end / wall / 1e6, "rss_kib": _rss_kib() - rss0}
    finally:
        if slave is not None:
            await slave.stopService()
        if master is not None:
            await master.stopService()
        if port is not None:
            await port.stopListening()
        await master_store.close()
        await slave_store.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def main(args) -> None:
    print("| setup | messages | seconds until confirmed | MB/s | CPU µs/msg | RSS growth KiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for replicated in (False, True):
        r = await run_once(args.messages, args.size, replicated)
        name = "master + slave (one process)" if replicated else "store alone"
        print(f"| {name} | {r['messages']} | {r['seconds']:.2f} | {r['mb_per_s']:.1f} | {r['cpu_us_per_msg']:.1f} "
              f"| {r['rss_kib']} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=200)
    ns = parser.parse_args()
    d = defer.ensureDeferred(main(ns))
    d.addErrback(lambda f: (f.printTraceback(file=sys.stderr), None))
    d.addBoth(lambda _: reactor.stop())
    reactor.run()
